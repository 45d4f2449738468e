"""Answering `tool_search` inside Keel: call the model, answer its searches, call it again.

The client sees only what it can act on: text and calls of its own tools. Streaming, the
text flows on as it arrives, `tool_search` call deltas are withheld, the client's own call
indexes stay contiguous across upstream calls, and the client gets one id, one
finish_reason and (when it asked) one usage chunk summed over every upstream call. What the
client never saw is stored as a hidden exchange and spliced back on its next request.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import orjson
from starlette.responses import Response, StreamingResponse

from proxy import jsontext
from proxy.accounting import CacheAccounting
from proxy.config import ToolsConfig
from proxy.conversations import Conversations
from proxy.errors import ProxyError, UpstreamConnectError, error_body
from proxy.hidden import HiddenExchange, fingerprint
from proxy.ingress import ChatRequest, encode
from proxy.metrics import Metrics
from proxy.pipeline import Exchange
from proxy.relay import INSPECT_LIMIT, Outcome, client_headers, read_limited, relay, relay_rest
from proxy.sse import Event, EventParser, EventTooLargeError, encode_event
from proxy.tools.planner import ToolPlan
from proxy.tools.ranking import Ranker
from proxy.tools.search import CALL_TOOL, SEARCH_TOOL, answer_search
from proxy.upstream import UpstreamResponse, header

log = logging.getLogger("keel.tools")
Message = dict[str, Any]


def add_usage(total: Any, usage: Any) -> Any:
    """Sum two usage objects leaf by leaf (numbers add; nested details merge)."""
    if not isinstance(usage, dict):
        return total
    if not isinstance(total, dict):
        return orjson.loads(orjson.dumps(usage))
    for key, value in usage.items():
        if isinstance(value, bool) or value is None:
            continue
        if isinstance(value, (int, float)):
            total[key] = (total.get(key) or 0) + value
        elif isinstance(value, dict):
            total[key] = add_usage(total.get(key), value)
    return total


@dataclass
class Loop:
    """The state of one client turn across upstream calls."""

    plan: ToolPlan
    config: ToolsConfig
    body: dict[str, Any]
    surfaced: list[str]
    deferred: list[str]
    before: list[Message] = field(default_factory=list)
    found: list[str] = field(default_factory=list)
    rounds: int = 0

    async def answer(self, searches: list[Message], ranker: Ranker) -> list[Message]:
        """Tool results for these search calls; their tools are surfaced for the next call."""
        results = []
        for call in searches:
            result = await answer_search(call["function"].get("arguments", ""), self.plan.catalog, self.deferred,
                                         self.config.search.max_results, ranker, self.plan.dispatch)
            for name in result.found:
                if name in self.deferred:
                    self.deferred.remove(name)
                    self.surfaced.append(name)
                    self.found.append(name)
            results.append({"role": "tool", "tool_call_id": call["id"], "content": result.content})
        self.rounds += 1
        if self.plan.dispatch:
            return results  # the block never changes: found tools are called through call_tool
        # Found tools go at the end: the block before them stays as it was (its cache too).
        catalog = self.plan.catalog
        shipped = {t["function"]["name"] for t in self.body.get("tools") or []}
        new = [catalog.entries[catalog.by_name[n]].tool for n in self.found if n not in shipped]
        self.body["tools"] = [*(self.body.get("tools") or []), *new]
        return results

    def continue_with(self, assistant: Message, results: list[Message]) -> None:
        self.before += [assistant, *results]
        self.body["messages"] = [*self.body["messages"], assistant, *results]

    def can_continue(self) -> bool:
        return self.rounds < self.config.search.max_rounds


def is_search(call: Any) -> bool:
    return isinstance(call, dict) and (call.get("function") or {}).get("name") == SEARCH_TOOL


def is_generic(call: Any) -> bool:
    return isinstance(call, dict) and (call.get("function") or {}).get("name") == CALL_TOOL


def real_call(call: Message, catalog: Any) -> Message | None:
    """The client's own call behind a generic `call_tool` call (None if it names no known tool)."""
    try:
        args = orjson.loads(call["function"].get("arguments") or "{}")
    except orjson.JSONDecodeError:
        return None
    if not isinstance(args, dict) or args.get("name") not in catalog.by_name:
        return None
    arguments = args.get("arguments")
    text = arguments if isinstance(arguments, str) else orjson.dumps(arguments or {}).decode()
    return {"id": call.get("id"), "type": "function", "function": {"name": args["name"], "arguments": text}}


def to_real_calls(message: Message, catalog: Any) -> tuple[Message, dict[str, Any]]:
    """The message with generic calls rewritten to real ones, and the generic form of each by id."""
    calls = message.get("tool_calls") or []
    if not any(is_generic(c) for c in calls):
        return message, {}
    out, dispatched = [], {}
    for call in calls:
        real = real_call(call, catalog) if is_generic(call) else None
        if real is not None:
            dispatched[str(call.get("id"))] = call["function"]
            out.append(real)
        else:
            out.append(call)
    return {**message, "tool_calls": out}, dispatched


class BrokenUpstreamError(ProxyError):
    """The upstream's reply to a continued call is not a whole answer: say so, with its status."""

    status = 502
    type = "upstream_error"
    code = "upstream_error"


def well_formed_calls(calls: Any) -> bool:
    """Tool calls Keel can answer or rewrite: a list of objects with a string id and a function
    whose name and arguments are strings. Anything else is the upstream's own business."""
    return isinstance(calls, list) and all(
        isinstance(c, dict) and isinstance(c.get("id"), str) and isinstance(c.get("function"), dict)
        and isinstance(c["function"].get("name"), str) and isinstance(c["function"].get("arguments", ""), str)
        for c in calls)


def chat_message(data: Any) -> Message | None:
    """`choices[0].message` of a chat completion, or None when the body is not one."""
    choices = data.get("choices") if isinstance(data, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return None
    message = choices[0].get("message")
    return message if isinstance(message, dict) else None


def retry_after(response: UpstreamResponse) -> str:
    value = header(response, "retry-after")
    return f" (retry after {value} s)" if value else ""


class ToolSearchResponder:
    def __init__(self, plan: ToolPlan, ranker: Ranker, conversations: Conversations, metrics: Metrics) -> None:
        self.plan = plan
        self.ranker = ranker
        self.conversations = conversations
        self.metrics = metrics

    def _loop(self, request: ChatRequest) -> Loop:
        return Loop(self.plan, request.tenant.tools, dict(request.body), list(self.plan.surfaced),
                    list(self.plan.deferred))

    async def respond(self, request: ChatRequest, exchange: Exchange) -> Response:
        loop = self._loop(request)
        first = await exchange.send(exchange.content or encode(loop.body))
        kind = header(first, "content-type")
        if first.status != 200 or not kind.startswith(("application/json", "text/event-stream")):
            return await relay(first, exchange.request_id, exchange.done, request.response_headers)
        if kind.startswith("text/event-stream"):
            headers = client_headers(first, exchange.request_id) | dict(request.response_headers)
            gauge = self.metrics.streams_open.labels(request.tenant.id)
            gauge.inc()
            return StreamingResponse(self._stream(request, exchange, loop, first, gauge), status_code=200,
                                     headers=headers)
        try:
            return await self._whole(request, exchange, loop, first)
        except ProxyError:
            raise
        except Exception as exc:  # a bug or an answer Keel misread: the client's own request instead
            self._failed(request, exc)
            await first.aclose()
            return await relay(await exchange.send(exchange.client_raw), exchange.request_id, exchange.done)

    def _failed(self, request: ChatRequest, exc: BaseException) -> None:
        log.warning("responder_failed", exc_info=exc, extra={"tenant": request.tenant.id,
                                                              "request_id": request.request_id})
        self.metrics.planner_failures.labels(request.tenant.id, "tool_search_responder").inc()

    async def _store(self, request: ChatRequest, loop: Loop, visible: Message | None, after: list[Message],
                     shown: Message) -> None:
        if request.location is None or not (loop.before or after):
            return
        hidden = HiddenExchange(loop.before, visible, after, loop.found, fingerprint(shown), self.plan.catalog.key)
        try:
            await self.conversations.add_hidden_exchange(request.location, hidden.to_dict())
        except Exception as exc:  # bookkeeping: losing it costs the next turn's cache, never this turn
            log.warning("hidden_exchange_not_stored", extra={"tenant": request.tenant.id, "error": repr(exc)})
            self.metrics.planner_failures.labels(request.tenant.id, "hidden_exchange").inc()

    async def _dispatched(self, request: ChatRequest, dispatched: dict[str, Any]) -> None:
        if dispatched and request.location is not None:
            try:
                await self.conversations.add_dispatched(request.location, dispatched)
            except Exception as exc:  # bookkeeping, as above
                log.warning("dispatched_calls_not_stored", extra={"tenant": request.tenant.id, "error": repr(exc)})
                self.metrics.planner_failures.labels(request.tenant.id, "dispatched").inc()

    async def _whole(self, request: ChatRequest, exchange: Exchange, loop: Loop,
                     upstream: UpstreamResponse) -> Response:
        usage: Any = None
        after: list[Message] = []
        visible: Message | None = None
        headers = client_headers(upstream, exchange.request_id) | dict(request.response_headers)
        while True:
            raw, rest = await read_limited(upstream, INSPECT_LIMIT)
            if rest is not None:  # too large to be a search round: the upstream's answer as it comes
                return relay_rest(upstream, raw, rest, headers, exchange.done)
            try:
                data = jsontext.loads(raw)
            except ValueError:
                data = None
            message = chat_message(data)
            calls = message.get("tool_calls") if message is not None else None
            if message is None or (calls is not None and not well_formed_calls(calls)):
                # not a chat completion whose calls Keel can read: the upstream's own answer, as it came
                exchange.done(Outcome(upstream.status, len(raw)))
                return Response(raw, status_code=upstream.status, headers=headers)
            assert isinstance(data, dict)
            usage = add_usage(usage, data.get("usage"))
            calls = calls or []
            searches = [c for c in calls if is_search(c)]
            if not searches:
                if loop.rounds == 0 and not any(is_generic(c) for c in calls):  # the upstream's bytes as they were
                    headers.update(CacheAccounting(self.metrics, request).record(usage))
                    exchange.done(Outcome(upstream.status, len(raw)))
                    return Response(raw, status_code=upstream.status, headers=headers)
                visible = message if loop.rounds else None
                break
            self.metrics.tool_search_rounds.labels(request.tenant.id).inc(len(searches))
            results = await loop.answer(searches, self.ranker)
            own = [c for c in calls if not is_search(c)]
            if own or not loop.can_continue():
                visible, after = message, results
                message = {k: v for k, v in message.items() if k != "tool_calls"} | ({"tool_calls": own} if own else {})
                data["choices"][0]["finish_reason"] = "tool_calls" if own else "stop"
                break
            loop.continue_with(message, results)
            upstream = await exchange.send(encode(loop.body))
            if upstream.status != 200:
                return await relay(upstream, exchange.request_id, exchange.done, request.response_headers)
        message, dispatched = to_real_calls(message, self.plan.catalog)
        data["choices"][0]["message"] = message
        if usage is not None:
            data["usage"] = usage
        headers["x-keel-tool-search-rounds"] = str(loop.rounds)
        headers.update(CacheAccounting(self.metrics, request).record(usage))
        await self._store(request, loop, visible, after, message)
        await self._dispatched(request, dispatched)
        body = jsontext.dumps(data)
        exchange.done(Outcome(200, len(body)))
        return Response(body, status_code=200, headers=headers)

    async def _continued(self, exchange: Exchange, loop: Loop) -> UpstreamResponse:
        """The next upstream call of the turn; anything but a 200 event stream is reported as broken."""
        upstream = await exchange.send(encode(loop.body))
        if upstream.status != 200:
            await upstream.aclose()
            raise BrokenUpstreamError(f"upstream answered {upstream.status} to a continued call{retry_after(upstream)}")
        if not header(upstream, "content-type").startswith("text/event-stream"):
            await upstream.aclose()
            raise BrokenUpstreamError("upstream answered a continued call with a body that is not an event stream")
        return upstream

    async def _stream(self, request: ChatRequest, exchange: Exchange, loop: Loop, upstream: UpstreamResponse,
                      gauge: Any) -> AsyncIterator[bytes]:
        outcome = Outcome(200, streamed=True)
        state = StreamState(catalog=self.plan.catalog if self.plan.dispatch else None)
        stored = False
        options = request.body.get("stream_options")
        include_usage = isinstance(options, dict) and bool(options.get("include_usage"))
        try:
            try:
                while True:
                    async for out in state.relay_round(upstream):
                        outcome.bytes_out += len(out)
                        yield out
                    if state.error:
                        return
                    if not (state.finished or state.saw_done):
                        raise BrokenUpstreamError("the upstream's event stream ended before the answer did")
                    for out in state.real_calls():
                        outcome.bytes_out += len(out)
                        yield out
                    await self._dispatched(request, state.take_dispatched())
                    searches = [c for c in state.calls if is_search(c)]
                    if not searches:
                        break
                    self.metrics.tool_search_rounds.labels(request.tenant.id).inc(len(searches))
                    results = await loop.answer(searches, self.ranker)
                    assistant = state.assistant_message()
                    if state.own_calls or not loop.can_continue():
                        await self._store(request, loop, assistant, results, state.shown_message())
                        stored = True
                        state.finish = "tool_calls" if state.own_calls else "stop"
                        break
                    loop.continue_with(assistant, results)
                    await upstream.aclose()
                    upstream = await self._continued(exchange, loop)
                    state.next_round()
                if loop.rounds and not stored:
                    await self._store(request, loop, state.assistant_message(), [], state.shown_message())
                CacheAccounting(self.metrics, request).record(state.usage)
                closing = state.closing(include_usage)
                for out in closing:
                    outcome.bytes_out += len(out)
                    yield out
                if closing is state.held and not state.saw_done:  # relayed as it came, and it came cut
                    raise UpstreamConnectError("the upstream's stream ended before its end marker: the answer may "
                                               "be cut short", code="upstream_stream_incomplete")
            except ProxyError:
                raise
            except Exception as exc:  # a bug or an event Keel misread
                self._failed(request, exc)
                if outcome.bytes_out:
                    raise ProxyError("Keel could not continue this stream", code="stream_failed") from exc
                await upstream.aclose()  # nothing sent yet: the client's own request, streamed as it comes
                upstream = await exchange.send(exchange.client_raw)
                if upstream.status != 200:
                    raise BrokenUpstreamError(f"upstream answered {upstream.status}{retry_after(upstream)}") from exc
                async for chunk in upstream.iter_raw():
                    outcome.bytes_out += len(chunk)
                    yield chunk
        except ProxyError as exc:
            outcome.error = exc.code
            yield b"data: " + error_body(exc.message, exc.type, exc.code) + b"\n\n"
        finally:
            gauge.dec()
            await upstream.aclose()
            exchange.done(outcome)


@dataclass
class StreamState:
    """Rewrites one client stream out of one or more upstream streams.

    An event Keel cannot read (not JSON, `choices` or `delta` of another type) passes through
    as it came; only well-formed tool-call deltas are interpreted."""

    round: int = 0
    first_id: str | None = None
    created: int = 0
    model: str = ""
    client_index: int = 0
    index_map: dict[int, int] = field(default_factory=dict)
    calls_by_index: dict[int, Message] = field(default_factory=dict)
    arguments: dict[int, list[str]] = field(default_factory=dict)  # per call index: argument pieces, joined once
    own_calls: list[Message] = field(default_factory=list)  # every client call forwarded, all rounds
    content: list[str] = field(default_factory=list)  # this round's text pieces
    shown_content: list[str] = field(default_factory=list)  # all rounds' text, as the client saw it
    finish: str | None = None
    finished: bool = False  # this round's upstream stream said it was done (a finish_reason)
    saw_done: bool = False  # this round's upstream stream ended with `data: [DONE]`
    usage: Any = None
    held: list[bytes] = field(default_factory=list)  # round-0 closing events, replayed if nothing changed
    error: bool = False
    catalog: Any = None  # set in dispatch mode: generic call_tool calls are withheld and sent as real calls
    dispatched: dict[str, Any] = field(default_factory=dict)

    def withheld(self, call: Message) -> bool:
        return is_search(call) or (self.catalog is not None and is_generic(call))

    def real_calls(self) -> list[bytes]:
        """This round's generic calls, as real calls of the client's tools, one delta each."""
        out = []
        for call in self.calls:
            real = real_call(call, self.catalog) if self.catalog is not None and is_generic(call) else None
            if real is None:
                continue
            self.dispatched[str(call["id"])] = dict(call["function"])
            delta = {"index": self.client_index, **real}
            self.client_index += 1
            self.own_calls.append(real)
            out.append(encode_event({"id": self.first_id, "object": "chat.completion.chunk", "created": self.created,
                                     "model": self.model, "choices": [{"index": 0, "delta": {"tool_calls": [delta]},
                                                                       "finish_reason": None}]}))
        return out

    def take_dispatched(self) -> dict[str, Any]:
        taken, self.dispatched = self.dispatched, {}
        return taken

    @property
    def calls(self) -> list[Message]:
        """This round's calls, with their arguments assembled."""
        for index, pieces in self.arguments.items():
            self.calls_by_index[index]["function"]["arguments"] = "".join(pieces)
        return [self.calls_by_index[i] for i in sorted(self.calls_by_index)]

    def next_round(self) -> None:
        self.round += 1
        self.index_map, self.calls_by_index, self.arguments, self.content, self.held = {}, {}, {}, [], []
        self.finished = self.saw_done = False

    async def relay_round(self, upstream: UpstreamResponse) -> AsyncIterator[bytes]:
        parser = EventParser()
        try:
            async for chunk in upstream.iter_raw():
                for event in parser.feed(chunk):
                    out = self._event(event)
                    if out:
                        yield out
                    if self.error:
                        return
        except EventTooLargeError as exc:
            raise BrokenUpstreamError(str(exc)) from None

    def _event(self, event: Event) -> bytes | None:
        if event.data is None:
            return event.raw  # comments and keep-alives pass through
        if event.done:
            self.saw_done = True
            self.held.append(event.raw)
            return None
        data = event.json()
        if isinstance(data, dict) and "error" in data:
            self.error = True
            return event.raw
        choices = data.get("choices") if isinstance(data, dict) else None
        if not isinstance(data, dict) or not isinstance(choices, list) or not all(isinstance(c, dict) for c in choices):
            return event.raw  # not a chunk Keel can read: as it came
        if self.first_id is None:
            self.first_id, self.created, self.model = data.get("id"), data.get("created", 0), data.get("model", "")
        changed = self.round > 0
        if isinstance(data.get("usage"), dict):
            self.usage = add_usage(self.usage, data["usage"])
        if not choices:
            self.held.append(event.raw)
            return None
        choice = dict(choices[0])
        delta = choice.get("delta") or {}
        if not isinstance(delta, dict):
            return event.raw
        delta = dict(delta)
        deltas = delta.get("tool_calls")
        if deltas:
            kept = self._tool_deltas(deltas) if isinstance(deltas, list) else deltas
            changed = changed or kept != deltas
            if kept:
                delta["tool_calls"] = kept
            else:
                delta.pop("tool_calls")
        text = delta.get("content")
        if isinstance(text, str):
            self.content.append(text)
            self.shown_content.append(text)
        if choice.get("finish_reason"):
            self.finish = str(choice["finish_reason"])
            self.finished = True
            self.held.append(event.raw)
            if not delta.get("content") and not delta.get("tool_calls"):
                return None
            choice["finish_reason"], changed = None, True
        if self.round > 0 and delta.get("role"):
            delta.pop("role")
            changed = True
        if not delta and changed:
            return None
        if not changed:
            return event.raw
        choice["delta"] = delta
        return encode_event({**data, "id": self.first_id, "choices": [choice], **({"usage": None} if "usage" in data
                                                                                  else {})})

    def _tool_deltas(self, deltas: list[Any]) -> list[Any]:
        kept = []
        for delta in deltas:
            if not isinstance(delta, dict):
                kept.append(delta)
                continue
            index = delta.get("index", 0)
            index = index if isinstance(index, int) else 0
            fn = delta.get("function")
            fn = fn if isinstance(fn, dict) else {}
            call = self.calls_by_index.get(index)
            if call is None:
                name = fn.get("name")
                given = delta.get("id")  # a call without an id still needs one for its result
                call = {"id": given if isinstance(given, str) else f"call_keel_{self.round}_{index}", "type": "function",
                        "function": {"name": name if isinstance(name, str) else None, "arguments": ""}}
                self.calls_by_index[index] = call
                self.arguments[index] = []
                if not self.withheld(call):
                    self.index_map[index] = self.client_index
                    self.client_index += 1
                    self.own_calls.append(call)
            piece = fn.get("arguments")
            if isinstance(piece, str):
                self.arguments[index].append(piece)
            elif piece is not None:
                self.arguments[index].append(jsontext.dumps(piece).decode())
            if self.withheld(call):
                continue
            mapped = self.index_map[index]
            kept.append(delta if mapped == index else {**delta, "index": mapped})
        return kept

    def assistant_message(self) -> Message:
        """This round's assistant message as the provider produced it."""
        message: Message = {"role": "assistant", "content": "".join(self.content) or None}
        calls = self.calls
        if calls:
            message["tool_calls"] = calls
        return message

    def shown_message(self) -> Message:
        """The assistant message as the client assembled it from the stream."""
        self.calls  # noqa: B018 -- assemble the arguments of the calls the client saw
        message: Message = {"role": "assistant", "content": "".join(self.shown_content) or None}
        if self.own_calls:
            message["tool_calls"] = self.own_calls
        return message

    def closing(self, include_usage: bool) -> list[bytes]:
        if self.round == 0 and not any(self.withheld(c) for c in self.calls) and self.held:
            return self.held  # nothing was rewritten: the upstream's own closing bytes
        chunk = {"id": self.first_id, "object": "chat.completion.chunk", "created": self.created or int(time.time()),
                 "model": self.model, "choices": [{"index": 0, "delta": {}, "finish_reason": self.finish or "stop"}]}
        out = [encode_event(chunk)]
        if include_usage and self.usage is not None:
            out.append(encode_event({"id": self.first_id, "object": "chat.completion.chunk", "created": chunk["created"],
                                     "model": self.model, "choices": [], "usage": self.usage}))
        out.append(b"data: [DONE]\n\n")
        return out
