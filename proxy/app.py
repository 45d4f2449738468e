"""The app factory: routes, the request lifecycle, and the seams passed in.

`create_app(config, store=…, upstream=…, planners=…)` builds everything a process needs;
nothing lives at module level, so tests run several independent Keels in one process.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import ipaddress
import logging
import os
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from urllib.parse import unquote

import orjson
from fastapi import FastAPI
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from proxy import gcposture
from proxy.access import AccessReport
from proxy.answerer import Answerer
from proxy.callers import ProvenCallers
from proxy.clock import SYSTEM_CLOCK, Clock
from proxy.config import STAGE_DEADLINE, KeelConfig, TenantConfig, check_stage_deadline
from proxy.context.cache import CachePlanner
from proxy.context.planner import ContextPlanner
from proxy.conversations import Conversations
from proxy.defaults import create_upstream, open_store, spool_dir
from proxy.encoding import accept_encoding
from proxy.errors import (
    AuthenticationError,
    BadRequestError,
    BodyTooLargeError,
    ForbiddenError,
    ProxyError,
    RequestTimeoutError,
    error_body,
)
from proxy.health import HealthMonitor
from proxy.ingress import Authenticator, Caller, parse_turn, request_id
from proxy.jsontext import Json, Resent
from proxy.memory.api import MemoryApi
from proxy.memory.book import MemoryBook
from proxy.memory.gate import MemoryGate
from proxy.memory.intake import MemoryIntake
from proxy.memory.jobs import MemoryJobs
from proxy.memory.planner import MemoryPlanner
from proxy.memory.spool import MemorySpool
from proxy.memory.worker import MemoryWorker
from proxy.metrics import Metrics
from proxy.owners import Owners, checkable
from proxy.pipeline import Pipeline, Planner
from proxy.relay import Writer, error_response, upstream_headers
from proxy.respcache.admin import CacheAdmin
from proxy.respcache.answers import ResponseCache
from proxy.respcache.counts import CacheCounts
from proxy.respcache.embeddings import EmbeddingsCache
from proxy.respcache.entries import Entries
from proxy.respcache.policy import TTL_HEADER
from proxy.rounds.responder import ToolSearchResponder
from proxy.savings.ledger import Ledger
from proxy.savings.meter import Meter, traced
from proxy.savings.page import SavingsPage
from proxy.sender import Sender
from proxy.shapes import Shape
from proxy.shapes.chat import CHAT
from proxy.shapes.messages import MESSAGES
from proxy.shapes.responses import RESPONSES
from proxy.stored import route as stored_route
from proxy.stores import Store
from proxy.stores.guard import Breaker, GuardedStore
from proxy.tokens import TokenCounter
from proxy.tools.catalog import CatalogCache
from proxy.tools.learned import LearnedPhrases
from proxy.tools.planner import ToolPlanner
from proxy.tools.rankers import Rankers
from proxy.tools.ranking import Ranker
from proxy.upstream import Upstream

log = logging.getLogger("keel.access")
SHAPES: dict[str, Shape] = {"/v1/chat/completions": CHAT, "/v1/responses": RESPONSES, "/v1/messages": MESSAGES}
BACKGROUND_STORE_BUDGET = 2.0  # seconds: the memory worker and API may wait longer than a request's planners


def upstream_path(scope: Mapping[str, Json]) -> str:
    """The request's path after /v1/, exactly as the client sent it (still percent-encoded).

    Forwarded as received; refused (400) when, decoded, it climbs out of the API with a dot
    segment or carries a control character, so no path reaches the upstream with Keel's key
    that the client could not have sent it directly."""
    raw = scope.get("raw_path") or str(scope["path"]).encode()
    text = raw.decode("latin-1")
    decoded = text
    for _ in range(3):  # %252e%252e is %2e%2e once decoded: look through double encoding
        decoded, previous = unquote(decoded, errors="replace"), decoded
        if decoded == previous:
            break
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in decoded):
        raise BadRequestError("the path contains a control character", code="invalid_path")
    segments = decoded.replace("\\", "/").split("/")
    if any(re.split(r"[;?#]", segment, maxsplit=1)[0] in (".", "..") for segment in segments):  # `..;x` too
        raise BadRequestError("the path may not contain '.' or '..' segments", code="invalid_path")
    return text.removeprefix("/v1/")


class Keel:
    """Everything one process shares across requests."""

    def __init__(
        self,
        config: KeelConfig,
        store: Store,
        upstream: Upstream,
        planners: Sequence[Planner] | Callable[[list[Planner]], Sequence[Planner]] | None = None,
        ranker: Ranker | None = None,
        memory_gate: MemoryGate | None = None,
        stage_deadline: float = STAGE_DEADLINE,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        check_stage_deadline(config, stage_deadline)  # a ranking ends before its stage is cut off
        self.config = config
        self.clock = clock  # where time passing changes what Keel does (proxy/clock.py)
        self.upstream = upstream
        self.metrics = Metrics()
        # One breaker for the store; the request path waits `budget_ms`, background work longer.
        breaker = Breaker(on_change=self._breaker_changed)
        self.store = GuardedStore(store, config.store.budget_ms / 1000, breaker)
        background = GuardedStore(store, BACKGROUND_STORE_BUDGET, breaker)
        self.metrics.store_up.set(1)
        self.monitor = HealthMonitor(self.store, self.metrics)  # /healthz reads it, never the store
        self.auth = Authenticator(config.tenants, config.server.keel_key_prefixes)
        self.conversations = Conversations(self.store, config.store.conversation_ttl_seconds, background,
                                           config.store.blob_ttl_seconds)
        self.owners = Owners(self.store, background, clock)
        self.callers = ProvenCallers(self.store, config.store.conversation_ttl_seconds)
        self.tokens = TokenCounter()
        self.memory_book = MemoryBook(background)
        self.ledger = Ledger(background, config.savings)  # written after the turn, off the request path
        self.meter = Meter(self.ledger, self.tokens)
        jobs = MemoryJobs(background, background.job_queue(), config.store.job_marker_ttl_seconds)
        self.memory_worker = MemoryWorker(config, self.memory_book, jobs, upstream, self.metrics, memory_gate,
                                          self.ledger)
        # After the upstream accepts a turn: its job queued (the turn waits `budget_ms` at most), else spooled.
        self.memory_intake = MemoryIntake(jobs, MemorySpool(spool_dir(config.store)), self.metrics,
                                          config.store.budget_ms / 1000, self.memory_worker.wake)
        if any(t.memory.enabled for t in config.tenants):
            self.monitor.details["memory"] = lambda: {**self.memory_worker.status(), **self.memory_intake.status()}
        self.ranker = ranker
        self.resent = Resent()  # tools arrays parsed once
        stages = self.default_planners() if planners is None or callable(planners) else list(planners)
        if callable(planners):
            stages = list(planners(stages))
        self.pipeline = Pipeline(stages, self.metrics, self.conversations, store_healthy=lambda: self.store.healthy,
                                 deadline=stage_deadline)
        self._metrics_digests = config.server.metrics_digests()
        # Keel's own caches of answers (cache.responses, cache.embeddings): see proxy/respcache/answers.py
        self.answerer = Answerer(self.pipeline, self.callers, self.meter if config.savings.enabled else None,
                                 self.metrics, self.conversations.proofs, config.server.log_bodies)
        self.entries = Entries(self.store, background)
        self.answers = ResponseCache(self.entries, CacheCounts(self.metrics.registry, self.ledger))
        self.embeddings = EmbeddingsCache(self.entries, self.answers, self.tokens)

    def _breaker_changed(self, closed: bool) -> None:
        self.metrics.store_up.set(1 if closed else 0)
        self.metrics.breaker_open.set(0 if closed else 1)

    def default_planners(self) -> list[Planner]:
        """The stages in DESIGN.md's order; each does nothing for a tenant that has it off."""
        rankers = Rankers(self.upstream, self.store)
        for tenant in self.config.tenants:
            if tenant.tools.enabled and self.ranker is None:
                rankers.for_tenant(tenant)  # load models at start, not on a request
        injected = self.ranker
        chosen = rankers.for_tenant if injected is None else lambda tenant: injected

        def ranker_for(tenant: TenantConfig) -> Ranker:  # its scores and usage reach the turn's savings meter
            return traced(chosen(tenant))

        learned = LearnedPhrases(self.store, clock=self.clock)
        tools = ToolPlanner(CatalogCache(self.tokens), ranker_for, self.metrics,
                            lambda plan, ranker: ToolSearchResponder(plan, ranker, self.conversations, self.metrics,
                                                                     learned),
                            self.store, self.config.store.conversation_ttl_seconds, self.conversations, learned)
        # DESIGN.md's order; each planner's `after` says why, and the pipeline refuses another.
        return [tools, MemoryPlanner(self.memory_intake, self.conversations), ContextPlanner(self.conversations, memory=self.memory_book),
                CachePlanner()]

    async def read_body(self, request: Request, limit: int | None = None) -> bytes:
        """The whole body, within the size limit and `timeouts.client_body` (a slow client gets 408)."""
        limit = limit or self.config.server.body_limit_bytes
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise BodyTooLargeError(f"request body of {declared} bytes exceeds the {limit}-byte limit")
        chunks: list[bytes] = []
        size = 0
        seconds = self.config.server.timeouts.client_body
        try:
            async with asyncio.timeout(seconds):
                async for chunk in request.stream():
                    size += len(chunk)
                    if size > limit:
                        raise BodyTooLargeError(f"request body exceeds the {limit}-byte limit")
                    chunks.append(chunk)
        except TimeoutError:
            raise RequestTimeoutError(f"the request body did not arrive within {seconds:g} s") from None
        return b"".join(chunks)

    def finisher(self, caller: Caller | None, route: str, method: str, path: str, rid: str,
                 started: float, bytes_in: int, upstream_ids: Sequence[str] = ()) -> AccessReport:
        return AccessReport(self.metrics, caller.tenant.id if caller else "-", route, method, path, rid, started,
                            bytes_in, upstream_ids)

    async def forward(self, request: Request, route: str, shape: Shape | None) -> Response:
        """One request through Keel: authenticate, read, plan (for an API shape), send upstream,
        relay back. `shape` None: any other /v1 path, forwarded verbatim."""
        started = time.perf_counter()
        rid = request_id(request.headers)
        caller: Caller | None = None
        bytes_in = 0
        send: Sender | None = None  # its calls to the upstream (and the provider's ids, for the log)
        try:
            caller = self.auth.authenticate(request.headers)
            path = upstream_path(request.scope)
            query = request.scope.get("query_string", b"").decode("latin-1")
            self.auth.refuse_keel_keys(caller, request.headers.items(), query, path)
            reached = stored_route(request.method, path) if caller.keyed and shape is None else None
            if reached is not None:  # a path that may name stored objects under the tenant's one provider key
                owner = caller.owner(request.headers.get("x-keel-user"))
                await self.owners.admit(owner, reached)
            raw = await self.read_body(request)
            bytes_in = len(raw)
            tenant = caller.tenant
            url = tenant.upstream.base_url + "/" + path + ("?" + query if query else "")
            headers = upstream_headers(request.headers, caller.upstream_credentials, tenant.upstream.headers, rid)
            headers.pop(TTL_HEADER, None)  # the response cache's, not the upstream's
            embeddings = shape is None and self.embeddings.applies(caller, request.method, path)
            if (shape is not None or embeddings) and "accept-encoding" in headers:  # Keel reads these: what it decodes
                headers["accept-encoding"] = accept_encoding(headers["accept-encoding"])
            send = Sender(self.upstream, self.metrics, tenant.id, request.method, url, headers)
            writer = Writer(rid, self.finisher(caller, route, request.method, request.url.path, rid, started, bytes_in,
                                               send.provider_ids), shape or CHAT, self.metrics.streams_open.labels(tenant.id))

            if embeddings:
                return await self.embeddings.serve(caller, raw, request.headers, send, writer, query)
            if shape is None:
                if reached is not None and (reached.kind == "action" or (reached.kind in ("create", "object") and raw
                                            and "json" in request.headers.get("content-type", ""))):
                    await self.owners.check(owner, checkable(raw, owner))  # a stored-object route's body names objects
                relayed = await writer.relay(await send(raw or None))
                if reached is not None and (reached.kind == "create" or reached.items):
                    return await self.owners.watch(owner, relayed, items=reached.items)
                return relayed
            parsed = parse_turn(raw, caller, request.headers, rid, shape, self.resent, self.pipeline.plans,
                                self.pipeline.might_plan)

            def answer() -> Awaitable[Response]:  # from the response cache (proxy/respcache), else planned and relayed
                return self.answers.serve(parsed, lambda: self.answerer.answer(parsed, raw, send, writer), writer, query)

            if not caller.keyed:  # a passthrough caller's own provider key: the provider tells callers apart
                return await answer()
            owner = caller.owner(parsed.end_user)  # one provider key for every caller: what it names must be its own
            wire = parsed.view.wire if parsed.view is not None else parsed.body
            if not wire and owner.scoped:  # nothing read: a body too deep to hold is refused to a scoped caller
                wire = checkable(raw, owner)
            await self.owners.check(owner, wire)
            events = shape.shown_ids(wire)
            answered = await answer()
            return answered if events is None else await self.owners.watch(owner, answered, events=events)
        except ProxyError as exc:
            finish = self.finisher(caller, route, request.method, request.url.path, rid, started, bytes_in,
                                   send.provider_ids if send is not None else ())
            return Writer(rid, finish, shape or CHAT).error(exc)

    async def ready(self) -> bool:
        """Can this process serve? The store is not asked: without it Keel passes requests
        through, so a store outage must not take every replica out of a load balancer."""
        return bool(self.config.tenants)

    def may_read_metrics(self, headers: Mapping[str, str], client: str | None) -> bool:
        """With `server.metrics_keys`, one of them; else loopback callers only, unless `metrics_open`."""
        if not self._metrics_digests:
            return self.config.server.metrics_open or _loopback(client)
        authorization = headers.get("authorization", "")
        token = authorization[7:].strip() if authorization[:7].lower() == "bearer " else ""
        digest = hashlib.sha256(token.encode()).digest()
        return any(hmac.compare_digest(digest, d) for d in self._metrics_digests) and bool(token)

    async def aclose(self) -> None:
        await self.monitor.stop()
        await self.memory_intake.stop()  # what the store has not taken yet waits in the spool
        await self.memory_worker.stop()
        await self.answers.drain()
        await self.ledger.drain()
        await self.conversations.proofs.drain()
        await self.owners.drain()
        await self.upstream.aclose()
        await self.store.close()


def _loopback(host: str | None) -> bool:
    try:
        return host is not None and ipaddress.ip_address(host.removeprefix("::ffff:")).is_loopback
    except ValueError:
        return False


def create_app(
    config: KeelConfig,
    *,
    store: Store | None = None,
    upstream: Upstream | None = None,
    planners: Sequence[Planner] | Callable[[list[Planner]], Sequence[Planner]] | None = None,
    ranker: Ranker | None = None,
    memory_gate: MemoryGate | None = None,
    stage_deadline: float = STAGE_DEADLINE,
    clock: Clock = SYSTEM_CLOCK,
) -> FastAPI:
    """Every seam can be replaced: the store, the upstream client, the planner list (or a
    function of the default list), the tool ranker and the memory gate for every tenant, and
    the clock that learned phrases age by and owner-record retries wait on."""
    keel = Keel(
        config,
        store if store is not None else open_store(config.store),
        upstream if upstream is not None else create_upstream(config.server),
        planners, ranker, memory_gate, stage_deadline, clock,
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await keel.monitor.start()
        if any(t.memory.enabled for t in config.tenants):
            await keel.memory_intake.start()  # spools left by stopped processes first
            keel.memory_worker.start()
        if not keel.tokens.exact:  # said once, plainly: every token figure from here on is an estimate
            log.warning("token_counts_estimated", extra={
                "detail": f"tiktoken's {keel.tokens.encoding_name} encoding could not be loaded (no network and no "
                          "TIKTOKEN_CACHE_DIR with its file): token counts, savings and cache figures are estimates "
                          "of about 4 characters a token"})
        if app.state.settle_gc:  # a serving process (proxy/server.py), not an app a test made
            gcposture.settle()
        yield
        log.info("keel_stopping", extra={"pid": os.getpid()})
        await keel.aclose()
        keel.metrics.close()
        # Here, not after uvicorn returns: on SIGTERM uvicorn re-raises the signal once it has shut down.
        log.info("keel_stopped", extra={"pid": os.getpid()})

    app = FastAPI(title="Keel", docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan)
    app.state.keel = keel
    app.state.settle_gc = False

    def guarded(handler: Callable[[Request], Awaitable[Response]],
                shape: Shape = CHAT) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            try:
                return await handler(request)
            except ProxyError as exc:
                return error_response(exc, shape=shape)
            except Exception:
                log.exception("unhandled_error", extra={"path": request.url.path})
                return error_response(ProxyError("internal error in Keel; the request was not completed"),
                                      shape=shape)

        return endpoint

    def shaped(shape: Shape) -> Callable[[Request], Awaitable[Response]]:
        async def handler(request: Request) -> Response:
            return await keel.forward(request, shape.name, shape)

        return guarded(handler, shape)


    async def passthrough(request: Request) -> Response:
        """Any other /v1 path; an API route spelled otherwise (`/v1//Responses`) is still that route."""
        reached = stored_route(request.method, str(request.scope["path"]).removeprefix("/v1/"))
        if reached.shape is not None:
            return await keel.forward(request, SHAPES[reached.shape].name, SHAPES[reached.shape])
        return await keel.forward(request, "passthrough", None)

    async def healthz(request: Request) -> Response:
        """The process is up (always 200), with the store's health as a detail: the health
        monitor's last reading, so a hung store never makes a liveness probe wait."""
        return Response(orjson.dumps(keel.monitor.reading()), media_type="application/json")

    async def readyz(request: Request) -> Response:
        if await keel.ready():
            return Response(b'{"status":"ready"}', media_type="application/json")
        return Response(b'{"status":"not ready"}', status_code=503, media_type="application/json")

    async def metrics(request: Request) -> Response:
        if not keel.may_read_metrics(request.headers, request.client.host if request.client else None):
            if keel.config.server.metrics_keys:
                return error_response(AuthenticationError("/metrics needs one of server.metrics_keys"))
            return error_response(ForbiddenError("/metrics answers loopback callers only: set server.metrics_keys "
                                                 "(a scraper's key) or server.metrics_open"))
        return Response(keel.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    methods = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"]
    # Plain Starlette routes: the hot path skips FastAPI's dependency injection.
    for path, shape in SHAPES.items():  # an API shape: read, planned, answered (`proxy.shapes`)
        app.router.add_route(path, shaped(shape), methods=["POST"])
    app.router.add_route("/healthz", healthz, methods=["GET"])
    app.router.add_route("/readyz", readyz, methods=["GET"])
    app.router.add_route("/metrics", metrics, methods=["GET"])
    memory = MemoryApi(keel.auth, keel.memory_book, keel.memory_worker.jobs, keel.read_body)
    app.router.add_route("/v1/keel/memory", guarded(memory.list), methods=["GET"])
    app.router.add_route("/v1/keel/memory/audit", guarded(memory.audit), methods=["GET"])
    app.router.add_route("/v1/keel/memory/dead", guarded(memory.dead_letters), methods=["GET"])
    app.router.add_route("/v1/keel/memory", guarded(memory.delete), methods=["DELETE"])
    app.router.add_route("/v1/keel/memory/{key}", guarded(memory.put), methods=["PUT"])
    app.router.add_route("/v1/keel/memory/{key}", guarded(memory.delete), methods=["DELETE"])
    app.router.add_route("/v1/keel/cache", guarded(CacheAdmin(keel.auth, keel.entries).purge), methods=["DELETE"])
    app.router.add_route("/v1/{path:path}", guarded(passthrough), methods=methods)
    page = SavingsPage(config, keel.ledger, keel.read_body, keel.store)  # /keel/: the savings page (admin keys)
    app.router.add_route("/keel/", guarded(page.overview), methods=["GET"])

    async def to_page(request: Request) -> Response:
        return RedirectResponse("/keel/", status_code=307)

    app.router.add_route("/keel", to_page, methods=["GET"])
    app.router.add_route("/keel/conversation", guarded(page.conversation), methods=["GET"])
    app.router.add_route("/keel/api/summary", guarded(page.api_summary), methods=["GET"])
    app.router.add_route("/keel/api/conversation", guarded(page.api_conversation), methods=["GET"])
    app.router.add_route("/keel/login", guarded(page.login), methods=["POST"])
    app.router.add_route("/keel/logout", guarded(page.logout), methods=["POST"])

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> Response:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        body = error_body(f"{request.method} {request.url.path}: {exc.detail}", "invalid_request_error", code)
        return Response(body, status_code=exc.status_code, media_type="application/json")

    return app

