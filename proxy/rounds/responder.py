"""Answering `tool_search` inside Keel, for every API shape: call the model, answer its searches,
call it again, and give the client one answer.

The client sees only what it can act on: text and calls of its own tools. Streaming, the text
flows on as it arrives, `tool_search` calls are withheld, the client's own call indexes stay
contiguous across upstream calls, and the client gets one id, one stop reason and usage
summed over every upstream call. What the client never saw is stored as a hidden exchange and
spliced back on its next request. The responder builds no response: it hands its bytes (or
its whole body) to the turn's `relay.Writer`, which ends a stream cut or refused mid-way with
one error event in the client's shape.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import AsyncIterator, Awaitable

from starlette.responses import Response

from proxy.accounting import CacheAccounting
from proxy.conversations import Conversations
from proxy.encoding import decoded
from proxy.errors import ProxyError, UpstreamConnectError
from proxy.hidden import HiddenExchange, fingerprint
from proxy.jsontext import Json, JsonObject
from proxy.messages import Message, called_in_order, newest_user_index, newest_user_text
from proxy.metrics import Metrics
from proxy.relay import INSPECT_LIMIT, client_headers, read_limited
from proxy.rounds import BrokenUpstreamError, JsonFraming, StreamFraming, add_usage, is_generic, is_search, retry_after
from proxy.rounds.loop import Loop
from proxy.sse import EventParser, EventTooLargeError
from proxy.tools.learned import LearnedPhrases, scope_of
from proxy.tools.plan import ToolPlan
from proxy.tools.ranking import Ranker
from proxy.turn import Accounting, Exchange, Turn, encode
from proxy.upstream import UpstreamResponse, header

log = logging.getLogger("keel.tools")
class ToolSearchResponder:
    def __init__(self, plan: ToolPlan, ranker: Ranker, conversations: Conversations, metrics: Metrics,
                 learned: LearnedPhrases | None = None) -> None:
        self.plan = plan
        self.ranker = ranker
        self.conversations = conversations
        self.metrics = metrics
        self.learned = learned

    async def _called(self, request: Turn, loop: Loop, calls: list[Message]) -> None:
        """Count first-shot hits and misses, and learn the turn's words for the tools the model
        had to find (the next turn worded like this one ships them first-shot)."""
        names = [str((c.get("function") or {}).get("name")) for c in calls if not self._withheld(c)]
        await self._sequence(request, names)
        for name in names:
            hit = name in self.plan.surfaced
            self.metrics.tool_first_shot.labels(request.tenant.id, "hit" if hit else "miss").inc()
            if not hit and name in loop.found and self.learned is not None and request.tenant.tools.select.learn:
                await self._kept(request, "tool_phrase", self._learn(request, loop, name, self.learned))

    async def _learn(self, request: Turn, loop: Loop, name: str, learned: LearnedPhrases) -> None:
        """The user's words, and the words the model searched with, for a tool it had to find."""
        scope = scope_of(request.tenant.id, request.owner)
        await learned.learn(scope, name, newest_user_text(request.messages))
        if loop.queries.get(name):
            await learned.learn(scope, name, loop.queries[name])

    async def _kept(self, request: Turn, what: str, work: Awaitable[None]) -> None:
        """After-the-answer bookkeeping, behind one guard: a failure costs a later turn something
        (a lesson, a cache hit, a continuation), never this turn's answer."""
        try:
            await work
        except Exception as exc:
            log.warning("bookkeeping_failed", extra={"tenant": request.tenant.id, "what": what, "error": repr(exc)})
            self.metrics.planner_failures.labels(request.tenant.id, what).inc()

    async def _sequence(self, request: Turn, names: list[str]) -> None:
        """Learn which tool the model called right before each of these within the user's turn (the
        prerequisite a later ask of the same kind leaves unsaid)."""
        if self.learned is None or not request.tenant.tools.select.learn or not names:
            return
        turn = request.messages[newest_user_index(request.messages) + 1 :]
        before = called_in_order(turn)
        previous = [before[-1]] if before else []
        scope = scope_of(request.tenant.id, request.owner)
        pairs = [(earlier, name) for earlier, name in zip([*previous, *names], names, strict=False)
                 if name in self.plan.catalog.by_name and earlier in self.plan.catalog.by_name]
        await self._kept(request, "tool_sequence", _learn_sequences(self.learned, scope, pairs))

    def _loop(self, request: Turn) -> Loop:
        return Loop(self.plan, request.tenant.tools, dict(request.body), list(self.plan.surfaced),
                    list(self.plan.deferred))

    def _account(self, request: Turn, exchange: Exchange) -> Accounting:
        return exchange.accounting or CacheAccounting(self.metrics, request)

    def _tools_header(self, loop: Loop) -> dict[str, str]:
        """`x-keel-tools` as finally surfaced (a search adds the tools it found)."""
        return {"x-keel-tools": f"{len(loop.surfaced)}/{self.plan.offered}"}

    def _withheld(self, call: Message) -> bool:
        return is_search(call) or (self.plan.dispatch and is_generic(call))

    async def respond(self, request: Turn, exchange: Exchange) -> Response:
        loop = self._loop(request)
        json, stream = request.shape.framings(self.plan.catalog if self.plan.dispatch else None)
        first = decoded(await exchange.send(exchange.content or encode(request.wire_body(loop.body))))  # read as meant
        kind = header(first, "content-type")
        if first.status != 200 or not kind.startswith(("application/json", "text/event-stream")):
            return await exchange.writer.relay(first, request.response_headers)
        if kind.startswith("text/event-stream"):
            headers = client_headers(first, exchange.writer.request_id) | dict(request.response_headers)
            return exchange.writer.stream(self._stream(request, exchange, loop, first, stream()), 200, headers)
        try:
            return await self._whole(request, exchange, loop, first, json)
        except ProxyError:
            raise
        except Exception as exc:  # a bug or an answer Keel misread: the client's own request instead
            self._failed(request, exc)
            await first.aclose()
            return await exchange.writer.relay(await exchange.send(exchange.client_raw))

    def _failed(self, request: Turn, exc: BaseException) -> None:
        log.warning("responder_failed", exc_info=exc, extra={"tenant": request.tenant.id,
                                                              "request_id": request.request_id})
        self.metrics.planner_failures.labels(request.tenant.id, "tool_search_responder").inc()

    async def _store(self, request: Turn, loop: Loop, visible: Message | None, after: list[Message],
                     shown: Message) -> None:
        if request.location is None or not (loop.before or after) or not request.location.writable:
            return
        hidden = HiddenExchange(loop.before, visible, after, loop.found, fingerprint(shown), self.plan.catalog.key)
        await self._kept(request, "hidden_exchange",
                         self.conversations.add_hidden_exchange(request.location, hidden))

    async def _dispatched(self, request: Turn, dispatched: JsonObject) -> None:
        if dispatched and request.location is not None and request.location.writable:
            await self._kept(request, "dispatched", self.conversations.add_dispatched(request.location, dispatched))

    async def _whole(self, request: Turn, exchange: Exchange, loop: Loop, upstream: UpstreamResponse,
                     json: JsonFraming) -> Response:
        usage: Json = None
        first: Json = None
        after: list[Message] = []
        visible: Message | None = None
        finish: str | None = None
        headers = client_headers(upstream, exchange.writer.request_id) | dict(request.response_headers)
        while True:
            raw, rest = await read_limited(upstream, INSPECT_LIMIT)
            if rest is not None:  # too large to be a search round: the upstream's answer as it comes
                return exchange.writer.rest(upstream, raw, rest, headers)
            answer = json.read(raw)
            if answer is None:  # not an answer whose calls Keel can read: the upstream's own, as it came
                return exchange.writer.whole(raw, upstream.status, headers)
            usage = add_usage(usage, answer.usage)
            first = answer.usage if loop.rounds == 0 else first
            searches = [c for c in answer.calls if is_search(c)]
            if not searches:
                if loop.rounds == 0 and not any(self._withheld(c) for c in answer.calls):  # the upstream's bytes
                    await self._called(request, loop, answer.calls)
                    headers.update(self._account(request, exchange).record(answer.usage, calls=answer.calls,
                                                                              shown=answer.shown))
                    await self._account(request, exchange).settled()
                    return exchange.writer.whole(raw, upstream.status, headers)
                visible = answer.shown if loop.rounds else None
                break
            self.metrics.tool_search_rounds.labels(request.tenant.id).inc(len(searches))
            results = await loop.answer(searches, self.ranker)
            own = [c for c in answer.calls if not is_search(c)]
            if own or not loop.can_continue():
                visible, after = answer.shown, results
                finish = "tool_calls" if own else "stop"
                break
            loop.continue_with(answer.assistant, results)
            upstream = decoded(await exchange.send(encode(request.wire_body(loop.body))))
            if upstream.status != 200:
                return await exchange.writer.relay(upstream, request.response_headers)
            kind = header(upstream, "content-type")
            if not kind.startswith("application/json"):  # an HTML page from a CDN is no answer to relay as JSON
                await upstream.aclose()
                raise UpstreamConnectError(f"upstream answered a continued call with a body that is not JSON "
                                           f"({kind or 'no content type'})", code="upstream_bad_reply")
        await self._called(request, loop, answer.calls)
        body = json.write(answer, lambda call: not is_search(call), finish, usage)
        shown = {**answer.shown, "tool_calls": [c for c in answer.shown.get("tool_calls") or [] if not is_search(c)]}
        headers["x-keel-tool-search-rounds"] = str(loop.rounds)
        headers.update(self._tools_header(loop))
        headers.update(self._account(request, exchange).record(usage, loop.rounds, first, shown["tool_calls"],
                                                               loop.found, shown=shown))
        await self._account(request, exchange).settled()
        await self._store(request, loop, visible, after, shown)
        await self._dispatched(request, json.take_dispatched())
        return exchange.writer.whole(body, 200, headers)

    async def _continued(self, request: Turn, exchange: Exchange, loop: Loop) -> UpstreamResponse:
        """The next upstream call of the turn; anything but a 200 event stream is reported as broken."""
        upstream = decoded(await exchange.send(encode(request.wire_body(loop.body))))
        if upstream.status != 200:
            await upstream.aclose()
            raise BrokenUpstreamError(f"upstream answered {upstream.status} to a continued call{retry_after(upstream)}")
        if not header(upstream, "content-type").startswith("text/event-stream"):
            await upstream.aclose()
            raise BrokenUpstreamError("upstream answered a continued call with a body that is not an event stream")
        return upstream

    async def _remember_alias(self, request: Turn, state: StreamFraming) -> None:
        alias = state.alias
        if alias is None or request.body.get("store") is False:
            return
        await self._kept(request, "response_alias",
                         self.conversations.alias_response(request.owner + "/" + request.tenant.id, *alias))

    @staticmethod
    async def _round(state: StreamFraming, upstream: UpstreamResponse) -> AsyncIterator[bytes]:
        parser = EventParser()
        try:
            async for chunk in upstream.iter_raw():
                for event in parser.feed(chunk):
                    out = state.feed(event)
                    if out:
                        yield out
                    if state.error:
                        return
        except EventTooLargeError as exc:
            raise BrokenUpstreamError(str(exc)) from None

    async def _stream(self, request: Turn, exchange: Exchange, loop: Loop, upstream: UpstreamResponse,
                      state: StreamFraming) -> AsyncIterator[bytes]:
        """The client's stream across the turn's rounds; a `ProxyError` raised here, the writer
        ends the stream with (one error event in the client's shape)."""
        sent = 0
        stored = False
        first: Json = None
        options = request.body.get("stream_options")
        include_usage = isinstance(options, dict) and bool(options.get("include_usage"))
        try:
            try:
                while True:
                    async for out in self._round(state, upstream):
                        sent += len(out)
                        yield out
                    if state.error:
                        return
                    if not (state.finished or state.saw_end):
                        raise BrokenUpstreamError("the upstream's event stream ended before the answer did")
                    for out in state.real_calls():
                        sent += len(out)
                        yield out
                    await self._dispatched(request, state.take_dispatched())
                    searches = [c for c in state.calls if is_search(c)]
                    if not searches:
                        break
                    self.metrics.tool_search_rounds.labels(request.tenant.id).inc(len(searches))
                    first = copy.deepcopy(state.usage) if loop.rounds == 0 else first
                    results = await loop.answer(searches, self.ranker)
                    assistant = state.assistant()
                    if state.own_calls or not loop.can_continue():
                        await self._store(request, loop, _merged(assistant), results, state.shown())
                        stored = True
                        state.conclude(bool(state.own_calls))
                        break
                    loop.continue_with(assistant, results)
                    await upstream.aclose()
                    upstream = await self._continued(request, exchange, loop)
                    state.next_round()
                if loop.rounds and not stored:
                    await self._store(request, loop, _merged(state.assistant()), [], state.shown())
                await self._called(request, loop, state.own_calls)
                self._account(request, exchange).record(state.usage, loop.rounds, first, state.own_calls, loop.found,
                                                        shown=state.shown())
                await self._account(request, exchange).settled()
                closing, replayed = state.closing(include_usage)
                await self._remember_alias(request, state)
                for out in closing:
                    sent += len(out)
                    yield out
                if replayed and not state.saw_end:  # relayed as it came, and it came cut
                    raise UpstreamConnectError("the upstream's stream ended before its end marker: the answer may "
                                               "be cut short", code="upstream_stream_incomplete")
            except ProxyError:
                raise
            except Exception as exc:  # a bug or an event Keel misread
                self._failed(request, exc)
                if sent:
                    raise ProxyError("Keel could not continue this stream", code="stream_failed") from exc
                await upstream.aclose()  # nothing sent yet: the client's own request, streamed as it comes
                upstream = decoded(await exchange.send(exchange.client_raw))  # under the headers already sent
                if upstream.status != 200:
                    raise BrokenUpstreamError(f"upstream answered {upstream.status}{retry_after(upstream)}") from exc
                async for chunk in upstream.iter_raw():
                    yield chunk
        finally:
            await upstream.aclose()

async def _learn_sequences(learned: LearnedPhrases, scope: str, pairs: list[tuple[str, str]]) -> None:
    for earlier, name in pairs:
        await learned.learn_sequence(scope, earlier, name)


def _merged(assistant: list[Message]) -> Message:
    """A round's view messages as one (the visible answer a hidden exchange is keyed by)."""
    messages = [m for m in assistant if m.get("role") == "assistant"]
    return messages[-1] if messages else (assistant[-1] if assistant else {"role": "assistant", "content": None})
