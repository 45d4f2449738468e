"""The app factory: routes, the request lifecycle, and the seams passed in.

`create_app(config, store=…, upstream=…, planners=…)` builds everything a process needs;
nothing lives at module level, so tests run several independent Keels in one process.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from proxy.accounting import CacheAccounting
from proxy.config import KeelConfig
from proxy.context.cache import CachePlanner
from proxy.context.planner import ContextPlanner
from proxy.conversations import Conversations
from proxy.errors import BodyTooLargeError, ProxyError, error_body
from proxy.ingress import Authenticator, Caller, parse_chat, request_id
from proxy.memory.api import MemoryApi
from proxy.memory.book import MemoryBook
from proxy.memory.jobs import MemoryJobs
from proxy.memory.worker import MemoryPlanner, MemoryWorker
from proxy.metrics import Metrics
from proxy.pipeline import Exchange, Pipeline, Planner
from proxy.relay import Outcome, relay, upstream_headers
from proxy.stores import Store, open_store
from proxy.tokens import TokenCounter
from proxy.tools.catalog import CatalogCache
from proxy.tools.planner import ToolPlanner
from proxy.tools.rankers import Rankers
from proxy.tools.responder import ToolSearchResponder
from proxy.upstream import Upstream, UpstreamResponse, create_upstream

log = logging.getLogger("keel.access")


class Keel:
    """Everything one process shares across requests."""

    def __init__(
        self,
        config: KeelConfig,
        store: Store,
        upstream: Upstream,
        planners: Sequence[Planner] | None = None,
    ) -> None:
        self.config = config
        self.store = store
        self.upstream = upstream
        self.metrics = Metrics()
        self.auth = Authenticator(config.tenants)
        self.conversations = Conversations(store, config.store.conversation_ttl_seconds)
        self.tokens = TokenCounter()
        self.memory_book = MemoryBook(store)
        self.memory_jobs = MemoryJobs(store)
        self.memory_worker = MemoryWorker(config, self.memory_book, self.memory_jobs, upstream, self.metrics)
        self.pipeline = Pipeline(self.default_planners() if planners is None else planners, self.metrics,
                                 self.conversations)

    def default_planners(self) -> list[Planner]:
        """The stages in DESIGN.md's order; each does nothing for a tenant that has it off."""
        rankers = Rankers(self.upstream, self.store)
        for tenant in self.config.tenants:
            if tenant.tools.enabled:
                rankers.for_tenant(tenant)  # load models at start, not on a request
        tools = ToolPlanner(CatalogCache(self.tokens), rankers.for_tenant, self.metrics,
                            lambda plan, ranker: ToolSearchResponder(plan, ranker, self.conversations, self.metrics),
                            self.store, self.config.store.conversation_ttl_seconds)
        # Tools first (it splices hidden exchanges by the client's indexes), then the memory job,
        # then context (memory is one of its sources), then cache hints.
        return [tools, MemoryPlanner(self.memory_jobs), ContextPlanner(self.conversations, memory=self.memory_book),
                CachePlanner()]

    async def read_body(self, request: Request) -> bytes:
        limit = self.config.server.body_limit_bytes
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise BodyTooLargeError(f"request body of {declared} bytes exceeds the {limit}-byte limit")
        chunks: list[bytes] = []
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise BodyTooLargeError(f"request body exceeds the {limit}-byte limit")
            chunks.append(chunk)
        return b"".join(chunks)

    def finisher(self, caller: Caller | None, route: str, method: str, path: str, rid: str,
                 started: float, bytes_in: int) -> Callable[[Outcome], None]:
        """A callback that logs and counts the request once its response is complete."""
        tenant = caller.tenant.id if caller else "-"

        def done(outcome: Outcome) -> None:
            elapsed = time.perf_counter() - started
            if route == "chat":
                self.memory_worker.wake()  # the turn is delivered: its memory job may run
            self.metrics.observe_request(tenant, route, outcome.status, elapsed, bytes_in, outcome.bytes_out)
            if log.isEnabledFor(logging.INFO):
                log.info(
                    "request",
                    extra={
                        "request_id": rid, "tenant": tenant, "method": method, "path": path,
                        "status": outcome.status, "latency_ms": round(elapsed * 1000, 2),
                        "bytes_in": bytes_in, "bytes_out": outcome.bytes_out, "error": outcome.error,
                    },
                )

        return done

    async def forward(self, request: Request, route: str, chat: bool) -> Response:
        started = time.perf_counter()
        rid = request_id(request.headers)
        caller: Caller | None = None
        bytes_in = 0
        try:
            caller = self.auth.authenticate(request.headers)
            raw = await self.read_body(request)
            bytes_in = len(raw)
            tenant = caller.tenant
            url = tenant.upstream.base_url + "/" + request.url.path.removeprefix("/v1/")
            if request.url.query:
                url += "?" + request.url.query
            headers = upstream_headers(request.headers, caller.upstream_authorization, tenant.upstream.headers, rid)
            done = self.finisher(caller, route, request.method, request.url.path, rid, started, bytes_in)

            async def send(content: bytes | None) -> UpstreamResponse:
                try:
                    response = await self.upstream.open(request.method, url, headers, content)
                except ProxyError as exc:
                    self.metrics.upstream_errors.labels(tenant.id, exc.code).inc()
                    raise
                self.metrics.upstream_status.labels(tenant.id, str(response.status)).inc()
                return response

            if not chat:
                return await self.relay_counted(await send(raw or None), rid, done, tenant.id)
            parsed = parse_chat(raw, caller, request.headers, rid)
            if self.config.server.log_bodies and log.isEnabledFor(logging.DEBUG):
                log.debug("request_body", extra={"request_id": rid, "body": raw[:16384].decode(errors="replace")})
            planned = await self.pipeline.run(parsed)
            if planned.responder is not None:
                return await planned.responder.respond(planned, Exchange(send, rid, done))
            response = await send(planned.encoded(parsed))
            account = CacheAccounting(self.metrics, planned) if planned.location is not None else None
            return await self.relay_counted(response, rid, done, tenant.id, planned.response_headers, account)
        except ProxyError as exc:
            done = self.finisher(caller, route, request.method, request.url.path, rid, started, bytes_in)
            done(Outcome(status=exc.status, error=exc.code))
            return error_response(exc, rid)

    async def relay_counted(
        self, response: UpstreamResponse, rid: str, done: Callable[[Outcome], None], tenant: str,
        extra_headers: Mapping[str, str] | None = None,
        accounting: CacheAccounting | None = None,
    ) -> Response:
        gauge = self.metrics.streams_open.labels(tenant)

        def finish(outcome: Outcome) -> None:
            if outcome.streamed:
                gauge.dec()
            done(outcome)

        try:
            relayed = await relay(response, rid, finish, extra_headers, accounting)
        except BaseException:
            await response.aclose()
            raise
        if isinstance(relayed, StreamingResponse):
            gauge.inc()  # the body generator (and with it `finish`) starts only after we return
        return relayed

    async def ready(self) -> bool:
        return bool(self.config.tenants) and await self.store.ping()

    async def aclose(self) -> None:
        await self.memory_worker.stop()
        await self.upstream.aclose()
        await self.store.close()


def error_response(exc: ProxyError, rid: str | None = None) -> Response:
    headers = {"x-request-id": rid} if rid else None
    return Response(exc.body(), status_code=exc.status, media_type="application/json", headers=headers)


def create_app(
    config: KeelConfig,
    *,
    store: Store | None = None,
    upstream: Upstream | None = None,
    planners: Sequence[Planner] | None = None,
) -> FastAPI:
    keel = Keel(
        config,
        store if store is not None else open_store(config.store.url),
        upstream if upstream is not None else create_upstream(config.server),
        planners,
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> Any:
        if any(t.memory.enabled for t in config.tenants):
            keel.memory_worker.start()
        yield
        await keel.aclose()

    app = FastAPI(title="Keel", docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan)
    app.state.keel = keel

    def guarded(handler: Callable[[Request], Awaitable[Response]]) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            try:
                return await handler(request)
            except ProxyError as exc:
                return error_response(exc)
            except Exception:
                log.exception("unhandled_error", extra={"path": request.url.path})
                return error_response(ProxyError("internal error in Keel; the request was not completed"))

        return endpoint

    async def chat(request: Request) -> Response:
        return await keel.forward(request, "chat", chat=True)

    async def passthrough(request: Request) -> Response:
        return await keel.forward(request, "passthrough", chat=False)

    async def healthz(request: Request) -> Response:
        return Response(b'{"status":"ok"}', media_type="application/json")

    async def readyz(request: Request) -> Response:
        if await keel.ready():
            return Response(b'{"status":"ready"}', media_type="application/json")
        return Response(b'{"status":"not ready"}', status_code=503, media_type="application/json")

    async def metrics(request: Request) -> Response:
        return Response(keel.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    methods = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"]
    # Plain Starlette routes: the hot path skips FastAPI's dependency injection.
    app.router.add_route("/v1/chat/completions", guarded(chat), methods=["POST"])
    app.router.add_route("/healthz", healthz, methods=["GET"])
    app.router.add_route("/readyz", readyz, methods=["GET"])
    app.router.add_route("/metrics", metrics, methods=["GET"])
    memory = MemoryApi(keel.auth, keel.memory_book)
    app.router.add_route("/v1/keel/memory", guarded(memory.list), methods=["GET"])
    app.router.add_route("/v1/keel/memory", guarded(memory.delete), methods=["DELETE"])
    app.router.add_route("/v1/keel/memory/{key}", guarded(memory.put), methods=["PUT"])
    app.router.add_route("/v1/keel/memory/{key}", guarded(memory.delete), methods=["DELETE"])
    app.router.add_route("/v1/{path:path}", guarded(passthrough), methods=methods)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> Response:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        body = error_body(f"{request.method} {request.url.path}: {exc.detail}", "invalid_request_error", code)
        return Response(body, status_code=exc.status_code, media_type="application/json")

    return app

