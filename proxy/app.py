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
from starlette.responses import RedirectResponse, Response, StreamingResponse

from proxy import gcposture
from proxy.accounting import CacheAccounting
from proxy.callers import ProvenCallers
from proxy.codecs import Codec
from proxy.codecs.chat import ChatCodec
from proxy.codecs.messages import MessagesCodec
from proxy.codecs.responses import ResponsesCodec
from proxy.config import KeelConfig, TenantConfig
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
from proxy.owners import Owners, checkable, shown_by
from proxy.pipeline import STAGE_DEADLINE, Pipeline, Planner
from proxy.relay import provider_request_id, relay, upstream_headers
from proxy.respcache.admin import CacheAdmin
from proxy.respcache.answers import ResponseCache
from proxy.respcache.counts import CacheCounts
from proxy.respcache.embeddings import EmbeddingsCache
from proxy.respcache.entries import Entries
from proxy.respcache.policy import TTL_HEADER
from proxy.rounds.responder import ToolSearchResponder
from proxy.savings.ledger import Ledger
from proxy.savings.meter import TRACE, Meter, Trace, traced
from proxy.savings.page import SavingsPage
from proxy.stored import route as stored_route
from proxy.stores import Store
from proxy.stores.guard import Breaker, GuardedStore
from proxy.tokens import TokenCounter
from proxy.tools.catalog import CatalogCache
from proxy.tools.learned import LearnedPhrases
from proxy.tools.planner import ToolPlanner
from proxy.tools.rankers import Rankers
from proxy.tools.ranking import Ranker
from proxy.turn import Exchange, Outcome, Turn
from proxy.upstream import Upstream, UpstreamResponse

log = logging.getLogger("keel.access")
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
    ) -> None:
        self.config = config
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
        self.owners = Owners(self.store, background)
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

        learned = LearnedPhrases(self.store)
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
                 started: float, bytes_in: int, upstream_ids: Sequence[str] = ()) -> Callable[[Outcome], None]:
        """A callback that logs and counts the request once its response is complete; the log
        names Keel's id and the provider's for each upstream call (`upstream_ids`, filled as they come)."""
        tenant = caller.tenant.id if caller else "-"

        def done(outcome: Outcome) -> None:
            elapsed = time.perf_counter() - started
            self.metrics.observe_request(tenant, route, outcome.status, elapsed, bytes_in, outcome.bytes_out)
            if log.isEnabledFor(logging.INFO):
                log.info(
                    "request",
                    extra={
                        "request_id": rid, "upstream_request_ids": list(upstream_ids), "tenant": tenant,
                        "method": method, "path": path,
                        "status": outcome.status, "latency_ms": round(elapsed * 1000, 2),
                        "bytes_in": bytes_in, "bytes_out": outcome.bytes_out, "error": outcome.error,
                    },
                )

        return done

    async def forward(self, request: Request, route: str, codec: Codec | None) -> Response:
        """One request through Keel: authenticate, read, plan (for an API shape with a codec),
        send upstream, relay back. `codec` None: any other /v1 path, forwarded verbatim."""
        started = time.perf_counter()
        rid = request_id(request.headers)
        caller: Caller | None = None
        bytes_in = 0
        upstream_ids: list[str] = []  # the provider's id of each upstream reply, for the log
        try:
            caller = self.auth.authenticate(request.headers)
            path = upstream_path(request.scope)
            query = request.scope.get("query_string", b"").decode("latin-1")
            self.auth.refuse_keel_keys(caller, request.headers.items(), query, path)
            reached = stored_route(request.method, path) if caller.keyed and codec is None else None
            if reached is not None:  # a path that may name stored objects under the tenant's one provider key
                owner = caller.owner(request.headers.get("x-keel-user"))
                await self.owners.admit(owner, reached)
            raw = await self.read_body(request)
            bytes_in = len(raw)
            tenant = caller.tenant
            url = tenant.upstream.base_url + "/" + path + ("?" + query if query else "")
            headers = upstream_headers(request.headers, caller.upstream_credentials, tenant.upstream.headers, rid)
            headers.pop(TTL_HEADER, None)  # the response cache's, not the upstream's
            embeddings = codec is None and self.embeddings.applies(caller, request.method, path)
            if (codec is not None or embeddings) and "accept-encoding" in headers:  # Keel reads these: what it decodes
                headers["accept-encoding"] = accept_encoding(headers["accept-encoding"])
            done = self.finisher(caller, route, request.method, request.url.path, rid, started, bytes_in,
                                 upstream_ids)

            async def send(content: bytes | None) -> UpstreamResponse:
                try:
                    response = await self.upstream.open(request.method, url, headers, content)
                except ProxyError as exc:
                    self.metrics.upstream_errors.labels(tenant.id, exc.code).inc()
                    raise
                self.metrics.upstream_status.labels(tenant.id, str(response.status)).inc()
                provider_id = provider_request_id(response)
                if provider_id is not None:
                    upstream_ids.append(provider_id)
                return response

            if embeddings:
                return await self.embeddings.serve(caller, raw, request.headers, send, rid, done, query)
            if codec is None:
                if reached is not None and (reached.kind == "action" or (reached.kind in ("create", "object") and raw
                                            and "json" in request.headers.get("content-type", ""))):
                    await self.owners.check(owner, checkable(raw, owner))  # a stored-object route's body names objects
                relayed = await self.relay_counted(await send(raw or None), rid, done, tenant.id)
                if reached is not None and (reached.kind == "create" or reached.items):
                    return await self.owners.watch(owner, relayed, items=reached.items)
                return relayed
            parsed = parse_turn(raw, caller, request.headers, rid, codec, self.resent, self.pipeline.plans,
                                self.pipeline.might_plan)

            def answer() -> Awaitable[Response]:  # from the response cache (proxy/respcache), else planned and relayed
                return self.answers.serve(parsed, lambda: self._turn(parsed, raw, send, rid, done, codec), done, query)

            if not caller.keyed:  # a passthrough caller's own provider key: the provider tells callers apart
                return await answer()
            owner = caller.owner(parsed.end_user)  # one provider key for every caller: what it names must be its own
            wire = parsed.view.wire if parsed.view is not None else parsed.body
            if not wire and owner.scoped:  # nothing read: a body too deep to hold is refused to a scoped caller
                wire = checkable(raw, owner)
            await self.owners.check(owner, wire)
            events = shown_by(codec.shape, wire)
            answered = await answer()
            return answered if events is None else await self.owners.watch(owner, answered, events=events)
        except ProxyError as exc:
            done = self.finisher(caller, route, request.method, request.url.path, rid, started, bytes_in,
                                 upstream_ids)
            done(Outcome(status=exc.status, error=exc.code))
            return error_response(exc, rid, codec.shape if codec is not None else "chat")

    async def _turn(self, parsed: Turn, raw: bytes, send: Callable[[bytes | None], Awaitable[UpstreamResponse]],
                    rid: str, done: Callable[[Outcome], None], codec: Codec) -> Response:
        """Plan a parsed turn, send it, and relay (or answer) what comes back."""
        tenant = parsed.tenant
        if self.config.server.log_bodies and log.isEnabledFor(logging.DEBUG):
            log.debug("request_body", extra={"request_id": rid, "body": raw[:16384].decode(errors="replace")})
        trace = Trace()
        TRACE.set(trace)  # this request's task only: the rankers report their scores to it
        unproven = tenant.auth.passthrough and not await self.callers.known(tenant.id, parsed.scope)
        if unproven:  # a key the provider has not accepted yet: planned from the request alone, nothing stored
            send = self._proving(send, tenant.id, parsed.scope)
        planned = await self.pipeline.run(parsed, stateless=unproven)
        trace.planning = False
        send = self._accepting(send, planned)
        content = await self.pipeline.guard("encode", planned, self._encode(planned, parsed))
        if content is None:  # a body Keel could not write back: the client's own
            planned, content = parsed, raw
        account = None
        if planned.location is not None:
            planned = planned.with_headers(**{"x-keel-conversation": planned.location.conversation})
            meter = self.meter.turn(parsed, planned, trace) if self.config.savings.enabled else None
            account = CacheAccounting(self.metrics, planned, meter, self.conversations.proofs)
            if meter is not None:
                done = _then(done, meter.ended)
        if planned.responder is not None:
            return await self.respond(planned, Exchange(send, rid, done, content, raw, account))
        response = await send(content)
        end = codec.stream_end if parsed.stream else None
        return await self.relay_counted(response, rid, done, tenant.id, planned.response_headers, account,
                                        codec.shape, end)

    def _proving(self, send: Callable[[bytes | None], Awaitable[UpstreamResponse]], tenant: str,
                 scope: str) -> Callable[[bytes | None], Awaitable[UpstreamResponse]]:
        """`send`, remembering the passthrough caller's credential once the provider accepts it."""

        async def proving(content: bytes | None) -> UpstreamResponse:
            response = await send(content)
            if 200 <= response.status < 300:
                await self.callers.prove(tenant, scope)
            return response

        return proving

    def _accepting(self, send: Callable[[bytes | None], Awaitable[UpstreamResponse]],
                   planned: Turn) -> Callable[[bytes | None], Awaitable[UpstreamResponse]]:
        """`send`, doing the turn's `on_accepted` work once, when the upstream first accepts the
        turn (a 2xx status): a turn the upstream refused (a bogus key's 401, a 5xx) leaves nothing
        behind, no memory job and no memory model run."""
        waiting = list(planned.on_accepted)
        if not waiting:
            return send

        async def accepted(content: bytes | None) -> UpstreamResponse:
            response = await send(content)
            if 200 <= response.status < 300 and waiting:
                work = waiting[:]
                waiting.clear()
                for step in work:
                    await self.pipeline.guard("accepted", planned, step())
            return response

        return accepted

    async def relay_counted(
        self, response: UpstreamResponse, rid: str, done: Callable[[Outcome], None], tenant: str,
        extra_headers: Mapping[str, str] | None = None,
        accounting: CacheAccounting | None = None,
        shape: str | None = None,
        stream_end: re.Pattern[bytes] | None = None,
    ) -> Response:
        gauge = self.metrics.streams_open.labels(tenant)

        def finish(outcome: Outcome) -> None:
            if outcome.streamed:
                gauge.dec()
            done(outcome)

        try:
            relayed = await relay(response, rid, finish, extra_headers, accounting, shape, stream_end)
        except BaseException:
            await response.aclose()
            raise
        if isinstance(relayed, StreamingResponse):
            gauge.inc()  # the body generator (and with it `finish`) starts only after we return
        return relayed

    async def respond(self, planned: Turn, exchange: Exchange) -> Response:
        """A planner's responder, guarded like every stage: one that fails before it has answered
        leaves the turn to the client's own request, relayed as usual."""
        assert planned.responder is not None
        try:
            return await planned.responder.respond(planned, exchange)
        except ProxyError:
            raise
        except Exception as exc:
            log.warning("responder_failed", exc_info=exc, extra={"tenant": planned.tenant.id,
                                                                  "request_id": planned.request_id})
            self.metrics.planner_failures.labels(planned.tenant.id, "responder").inc()
            response = await exchange.send(exchange.client_raw)
            return await self.relay_counted(response, exchange.request_id, exchange.done, planned.tenant.id)

    @staticmethod
    async def _encode(planned: Turn, parsed: Turn) -> bytes:
        return planned.encoded(parsed)

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


def _then(done: Callable[[Outcome], None], after: Callable[[], None]) -> Callable[[Outcome], None]:
    def both(outcome: Outcome) -> None:
        done(outcome)
        after()

    return both


def _loopback(host: str | None) -> bool:
    try:
        return host is not None and ipaddress.ip_address(host.removeprefix("::ffff:")).is_loopback
    except ValueError:
        return False


def error_response(exc: ProxyError, rid: str | None = None, shape: str = "chat") -> Response:
    headers = {"x-request-id": rid, "x-keel-request-id": rid} if rid else None
    return Response(exc.body(shape), status_code=exc.status, media_type="application/json", headers=headers)


def create_app(
    config: KeelConfig,
    *,
    store: Store | None = None,
    upstream: Upstream | None = None,
    planners: Sequence[Planner] | Callable[[list[Planner]], Sequence[Planner]] | None = None,
    ranker: Ranker | None = None,
    memory_gate: MemoryGate | None = None,
    stage_deadline: float = STAGE_DEADLINE,
) -> FastAPI:
    """Every seam can be replaced: the store, the upstream client, the planner list (or a
    function of the default list), the tool ranker and the memory gate for every tenant."""
    keel = Keel(
        config,
        store if store is not None else open_store(config.store),
        upstream if upstream is not None else create_upstream(config.server),
        planners, ranker, memory_gate, stage_deadline,
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
                shape: str = "chat") -> Callable[[Request], Awaitable[Response]]:
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

    def shaped(codec: Codec) -> Callable[[Request], Awaitable[Response]]:
        async def handler(request: Request) -> Response:
            return await keel.forward(request, codec.shape, codec)

        return guarded(handler, codec.shape)

    codecs: dict[str, Codec] = {"chat": ChatCodec(), "responses": ResponsesCodec(), "messages": MessagesCodec()}

    async def passthrough(request: Request) -> Response:
        """Any other /v1 path; an API route spelled otherwise (`/v1//Responses`) is still that route."""
        reached = stored_route(request.method, str(request.scope["path"]).removeprefix("/v1/"))
        if reached.shape is not None:
            return await keel.forward(request, reached.shape, codecs[reached.shape])
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
    app.router.add_route("/v1/chat/completions", shaped(codecs["chat"]), methods=["POST"])
    app.router.add_route("/v1/responses", shaped(codecs["responses"]), methods=["POST"])
    app.router.add_route("/v1/messages", shaped(codecs["messages"]), methods=["POST"])
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

