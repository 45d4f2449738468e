"""The exact response cache: a repeated request answered from Keel's own store.

Where it sits: after the caller is known and checked (authentication, a user key's claim, a
Responses id's owner) and before planning. The key is the client's request and who asked
(`proxy.respcache.key`), not the body Keel plans, because that is what "the same request" means
to a client: planning renders from stored conversation state (a frozen prompt, context updates,
a tool block chosen earlier), so a key taken after it would change with Keel's state, and every
hit would pay for planning first. What an entry keeps is what the client was shown: the planned,
relayed answer, with the tool_search rounds Keel answered left out and the client's own calls in
(fidelity: a hit is the bytes, or the events, of that answer). A hit is served only to the caller
the key names (isolation: another credential, end user, conversation id or tenant has another
key), and skips only what a regeneration would also skip: no new turn record, no memory job
(the message was judged when it first came). What a hit cannot see is state that moved since the
answer was kept (a memory entry, the date): it is served until its TTL, or until the client sends
`Cache-Control: no-cache`.

Every reply of a tenant with the cache on says what happened in `x-keel-response-cache`:
`hit` (with `Age`), `hit; reason=coalesced` (a request in flight answered it), `miss; reason=…`,
`refresh; reason=no-cache`, `bypass; reason=…` (see `proxy.respcache.policy`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from functools import partial

import orjson
from starlette.responses import Response, StreamingResponse

from proxy.encoding import ReplyEncodingError, decode_all
from proxy.jsontext import JsonObject
from proxy.relay import Writer
from proxy.respcache.counts import CacheCounts
from proxy.respcache.entries import Entries, Entry
from proxy.respcache.flights import Flight, Flights, Form, Head
from proxy.respcache.key import Asker, answer_key, canonical
from proxy.respcache.policy import Decision, decide
from proxy.respcache.replay import AnswerShape, answer_of, rendered, serves
from proxy.turn import Turn

log = logging.getLogger("keel.respcache")
HEADER = "x-keel-response-cache"
CACHE = "responses"  # this cache's name in the counts (`cache.responses`; the other is embeddings)
_NOT_SHARED = frozenset({b"x-keel-request-id", HEADER.encode(), b"age"})  # the provider's x-request-id stays


def label(state: str, reason: str = "") -> str:
    return f"{state}; reason={reason}" if reason else state


def form_of(wire: JsonObject) -> Form:
    options = wire.get("stream_options")
    asked = isinstance(options, dict) and bool(options.get("include_usage"))
    return Form(bool(wire.get("stream")), canonical(options) if options is not None else b"", asked)


class ResponseCache:
    def __init__(self, entries: Entries, counts: CacheCounts) -> None:
        self.entries, self.counts = entries, counts
        self.flights = Flights()
        self._tasks: set[asyncio.Task[None]] = set()

    async def serve(self, turn: Turn, produce: Callable[[], Awaitable[Response]], writer: Writer,
                    query: str = "") -> Response:
        """The answer to a parsed turn: from the cache, from a flight in progress, or `produce()`d
        (planned and relayed as usual) and kept when it is whole."""
        cache, tenant = turn.tenant.cache, turn.tenant.id
        if cache.responses == "off":
            return await produce()
        shape = turn.shape.answers
        wire = turn.view.wire if turn.view is not None else turn.body
        refused = shape.never(wire) if wire else "unreadable"  # {}: a body too deep to read
        decision = decide(wire, turn.headers, cache, refused)
        if decision.state == "bypass":
            self.counts.outcome(tenant, CACHE, "bypass")
            return _tagged(await produce(), label("bypass", decision.reason))
        asker = Asker.of(tenant, turn.scope, turn.end_user, turn.conversation_id, cache.stored.scope == "tenant")
        key = answer_key(asker, turn.shape.name, wire, query, turn.headers)
        form = form_of(wire)
        reason = ""
        if decision.state == "lookup":
            reason, entry = await self._look(tenant, key, form, decision)
            if entry is not None:
                return self._hit(turn, shape, entry, form, writer)
        flight = self.flights.get(key)
        if flight is not None and flight.entry is not None:  # landed, on its way to the store
            if decision.state == "lookup" and serves(flight.entry, form):
                return self._hit(turn, shape, flight.entry, form, writer)
        elif flight is not None:  # in flight: share it
            followed = await self._follow(turn, shape, flight, form, writer)
            if followed is not None:
                return followed
        return await self._lead(turn, shape, wire, key, form, decision, produce, reason)

    async def _look(self, tenant: str, key: str, form: Form, decision: Decision) -> tuple[str, Entry | None]:
        """A servable entry, or why there is none."""
        try:
            entry = await self.entries.get(tenant, key)
        except Exception as exc:  # the store's failures (its guard's StoreError, a format): a miss, never an error
            log.warning("answer_lookup_failed", extra={"tenant": tenant, "error": repr(exc)})
            return "store-unavailable", None
        if entry is None:
            return "absent", None
        if decision.max_age is not None and time.time() - entry.created > decision.max_age:
            return "max-age", None
        if not serves(entry, form):
            return "no-usage", None
        return "", entry

    def _hit(self, turn: Turn, shape: AnswerShape, entry: Entry, form: Form, writer: Writer,
             reason: str = "") -> Response:
        body, media = rendered(shape, entry, form)
        headers = {"x-request-id": turn.request_id, "x-keel-request-id": turn.request_id, HEADER: label("hit", reason),
                   "age": str(max(0, int(time.time() - entry.created)))}
        if entry.conversation:
            headers["x-keel-conversation"] = entry.conversation
        self.counts.outcome(turn.tenant.id, CACHE, "coalesced" if reason else "hit")
        self.counts.saved(turn.tenant, CACHE, entry.model, turn.shape.usage(entry.usage), len(body))
        return writer.whole(body, 200, headers, media)

    async def _follow(self, turn: Turn, shape: AnswerShape, flight: Flight, form: Form,
                      writer: Writer) -> Response | None:
        """Share a flight's answer: its bytes when this client wants the same form, else the whole
        answer converted once it is in; None when it has none to share (this request goes on its own)."""
        flight.waiting += 1
        try:
            head = await asyncio.shield(flight.head)
            if head is None:
                return None
            same = head.streamed == form.stream and (not form.stream or form == flight.form)
            if same and flight.shareable and not head.encoded:
                flight.sharers += 1
                self.counts.outcome(turn.tenant.id, CACHE, "coalesced")
                headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in head.headers if k not in _NOT_SHARED}
                headers |= {"x-keel-request-id": turn.request_id, HEADER: label("hit", "coalesced")}
                headers.setdefault("x-request-id", turn.request_id)
                if not head.streamed:
                    await flight.finished.wait()
                    body = flight.body
                    return writer.whole(body, head.status, headers)
                return writer.stream(flight.read(flight.join()), head.status, headers, events=False)
            await flight.finished.wait()
            if flight.entry is not None and serves(flight.entry, form):
                return self._hit(turn, shape, flight.entry, form, writer, "coalesced")
            return None
        finally:
            flight.waiting -= 1
            flight.cancel_if_alone()

    async def _lead(self, turn: Turn, shape: AnswerShape, wire: JsonObject, key: str, form: Form,
                    decision: Decision, produce: Callable[[], Awaitable[Response]], reason: str) -> Response:
        state = "refresh" if decision.state == "refresh" else "miss"
        tag = label(state, decision.reason or reason)
        self.counts.outcome(turn.tenant.id, CACHE, state)
        if self.flights.get(key) is not None:  # another request took the lead meanwhile: this one goes alone
            return _tagged(await produce(), tag)
        flight = self.flights.start(key, form, turn.tenant.cache.stored.max_entry_bytes)
        try:
            response = await produce()
        except BaseException:
            flight.begin(None)
            self.flights.land(flight)
            raise
        response.headers[HEADER] = tag
        streamed = isinstance(response, StreamingResponse)
        encoding = response.headers.get("content-encoding", "").strip().lower()
        flight.begin(Head(response.status_code, tuple(response.raw_headers), streamed,
                          encoding not in ("", "identity")))
        landed = partial(self._landed, turn, shape, wire, key, decision, encoding)
        if isinstance(response, StreamingResponse):
            reader = flight.join()
            flight.start_pump(response.body_iterator, landed)
            response.body_iterator = flight.read(reader)
        else:
            flight.push(bytes(response.body))
            flight.end()
            landed(flight)
        return response

    def _landed(self, turn: Turn, shape: AnswerShape, wire: JsonObject, key: str, decision: Decision, encoding: str,
                flight: Flight) -> None:
        """The leader's answer is in: keep it when it is whole (in the background), else let the flight go."""
        head = flight.head.result()
        entry = None
        if decision.keeps and flight.shareable and flight.error is None and head is not None and head.status == 200:
            entry = _entry(shape, flight.body, head, encoding, wire)
        flight.entry = entry
        if entry is None:
            self.flights.land(flight)
            return
        if flight.sharers:
            self.counts.saved(turn.tenant, CACHE, entry.model, turn.shape.usage(entry.usage), 0,
                              flight.sharers)
        self.spawn(self._keep(turn, key, entry, decision.ttl, flight))

    async def _keep(self, turn: Turn, key: str, entry: Entry, ttl: float, flight: Flight) -> None:
        tenant = turn.tenant
        try:
            written, evicted = await self.entries.put(tenant.id, key, entry, ttl, tenant.cache.stored)
            self.counts.stored(tenant.id, written, evicted)
        except Exception as exc:  # bookkeeping: a store that fails costs the next hit, never this answer
            log.warning("answer_not_kept", extra={"tenant": tenant.id, "error": repr(exc)})
        finally:
            self.flights.land(flight)

    def spawn(self, work: Coroutine[object, None, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def drain(self) -> None:
        """Wait for the writes in flight (shutdown, tests)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)


def _entry(shape: AnswerShape, raw: bytes, head: Head, encoding: str, wire: JsonObject) -> Entry | None:
    """What of a whole answer is kept: a JSON original as it came (decoded), a stream as the JSON it adds up to."""
    try:
        plain = decode_all(raw, encoding) if head.encoded else raw
    except ReplyEncodingError:
        return None
    body = answer_of(shape, plain, head.streamed, wire)
    if body is None:
        return None
    kept = plain if not head.streamed else orjson.dumps(body)
    conversation = next((v.decode("latin-1") for k, v in head.headers if k == b"x-keel-conversation"), "")
    return Entry(time.time(), kept, str(body.get("model") or wire.get("model") or ""), body.get("usage"),
                 conversation)


def _tagged(response: Response, value: str) -> Response:
    response.headers[HEADER] = value
    return response
