# Keel: multi-stage, slim, non-root (uid 10001). Build with `make image` (no network beyond the package
# registries: tiktoken's encodings come from the build context).
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY proxy ./proxy
# EXTRAS=local adds the in-process embedding ranker (onnxruntime, tokenizers, numpy)
ARG EXTRAS=""
RUN pip install --no-cache-dir --prefix=/install ".${EXTRAS:+[$EXTRAS]}"

FROM python:3.11-slim
RUN groupadd --gid 10001 keel && useradd --create-home --uid 10001 --gid 10001 keel
COPY --from=build /install /usr/local
# tiktoken's encodings from the build context (`make image` copies them into build/tiktoken/ from
# ../shared/data/tiktoken, or put the two cache files there yourself): Keel counts tokens without
# reaching the network, and the build reaches none but the package registries.
ENV TIKTOKEN_CACHE_DIR=/opt/keel/tiktoken
COPY build/tiktoken/ /opt/keel/tiktoken/
RUN test -s /opt/keel/tiktoken/fb374d419588a4632f3f557e76b4b70aebbca790 \
 && test -s /opt/keel/tiktoken/9b5ad71b2ce5302211f9c61530b329a4922fc6a4 \
 && python -c "import tiktoken; tiktoken.get_encoding('o200k_base'); tiktoken.get_encoding('cl100k_base')" \
 && chmod -R a+rX /opt/keel/tiktoken
# FETCH_MODEL=1 (with EXTRAS=local) bakes the local ranker's model into the image at
# /opt/keel/all-MiniLM-L6-v2 (set select.model_dir to it); without it, Keel fetches it at start.
# Fetched as root, so it is made readable by every user, uid 10001 among them.
ARG FETCH_MODEL=""
RUN if [ -n "$FETCH_MODEL" ]; then keel fetch-model /opt/keel/all-MiniLM-L6-v2 && chmod -R a+rX /opt/keel; fi
WORKDIR /var/lib/keel
RUN chown 10001:10001 /var/lib/keel
# A numeric user: Kubernetes' runAsNonRoot can verify it without reading /etc/passwd.
USER 10001:10001
# `keel serve` listens on KEEL_HOST:KEEL_PORT (over the config's server.host/port): all interfaces
# inside the container; outside one, Keel's default stays 127.0.0.1. The HEALTHCHECK reads the same port.
ENV PYTHONUNBUFFERED=1 KEEL_HOST=0.0.0.0 KEEL_PORT=8080
EXPOSE 8080
HEALTHCHECK --interval=10s --timeout=3s --start-period=5s --retries=3 \
  CMD python -c "import os,sys,urllib.request; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('KEEL_PORT', '8080'), timeout=2).status == 200 else 1)"
ENTRYPOINT ["keel"]
CMD ["serve", "--config", "/etc/keel/keel.yaml"]
