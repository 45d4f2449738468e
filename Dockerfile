# Keel: multi-stage, slim, non-root.
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY proxy ./proxy
# EXTRAS=local adds the in-process embedding ranker (onnxruntime, tokenizers, numpy)
ARG EXTRAS=""
RUN pip install --no-cache-dir --prefix=/install ".${EXTRAS:+[$EXTRAS]}"

FROM python:3.11-slim
RUN useradd --create-home --uid 10001 keel
COPY --from=build /install /usr/local
# FETCH_MODEL=1 (with EXTRAS=local) bakes the local ranker's model into the image at
# /opt/keel/all-MiniLM-L6-v2 (set select.model_dir to it); without it, Keel fetches it at start
ARG FETCH_MODEL=""
RUN if [ -n "$FETCH_MODEL" ]; then keel fetch-model /opt/keel/all-MiniLM-L6-v2; fi
WORKDIR /var/lib/keel
RUN chown keel:keel /var/lib/keel
USER keel
ENV PYTHONUNBUFFERED=1
EXPOSE 8080
HEALTHCHECK --interval=10s --timeout=3s --start-period=5s --retries=3 \
  CMD python -c "import urllib.request,sys; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:8080/healthz', timeout=2).status == 200 else 1)"
ENTRYPOINT ["keel"]
CMD ["serve", "--config", "/etc/keel/keel.yaml"]
