"""Chat Completions framing: `choices[0].message` whole; `data:` chunks ending with `[DONE]`."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from proxy import jsontext
from proxy.jsontext import Json, JsonObject
from proxy.messages import Message
from proxy.rounds import Round, add_usage, is_generic, is_search, well_formed_calls
from proxy.rounds.loop import real_call, to_real_calls
from proxy.sse import Event, encode_event
from proxy.tools.catalog import Catalog


def chat_message(data: Json) -> Message | None:
    """`choices[0].message` of a chat completion, or None when the body is not one."""
    choices = data.get("choices") if isinstance(data, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return None
    message = choices[0].get("message")
    return message if isinstance(message, dict) else None


class ChatJson:
    """A chat completion read whole; in dispatch mode (`catalog`) generic calls become real ones."""

    def __init__(self, catalog: Catalog | None = None) -> None:
        self.catalog = catalog
        self.dispatched: JsonObject = {}

    def take_dispatched(self) -> JsonObject:
        taken, self.dispatched = self.dispatched, {}
        return taken

    def read(self, raw: bytes) -> Round | None:
        try:
            data = jsontext.loads(raw)
        except ValueError:
            return None
        message = chat_message(data)
        calls = message.get("tool_calls") if message is not None else None
        if message is None or (calls is not None and not well_formed_calls(calls)):
            return None
        return Round(data, list(calls or []), [message], message, data.get("usage"))

    def write(self, last: Round, keep: Callable[[Message], bool], finish: str | None, usage: Json) -> bytes:
        data = last.data
        message = last.shown
        calls = [c for c in message.get("tool_calls") or [] if keep(c)]
        message = {k: v for k, v in message.items() if k != "tool_calls"} | ({"tool_calls": calls} if calls else {})
        if self.catalog is not None:
            message, self.dispatched = to_real_calls(message, self.catalog)
        data["choices"][0]["message"] = message
        if finish is not None:
            data["choices"][0]["finish_reason"] = finish
        if usage is not None:
            data["usage"] = usage
        return jsontext.dumps(data)


@dataclass
class ChatStream:
    """Rewrites one client stream of chat completion chunks out of one or more upstream streams.

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
    usage: Json = None
    held: list[bytes] = field(default_factory=list)  # round-0 closing events, replayed if nothing changed
    error: bool = False
    catalog: Catalog | None = None  # set in dispatch mode: generic call_tool calls are withheld and sent as real calls
    dispatched: JsonObject = field(default_factory=dict)
    alias: tuple[str, str] | None = None  # a chat completion is never continued by its id

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

    def conclude(self, tool_calls: bool) -> None:
        self.finish = "tool_calls" if tool_calls else "stop"

    def take_dispatched(self) -> JsonObject:
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

    def feed(self, event: Event) -> bytes | None:
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

    def _tool_deltas(self, deltas: list[Json]) -> list[Json]:
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

    def assistant(self) -> list[Message]:
        """This round's assistant message as the provider produced it."""
        return [self.assistant_message()]

    @property
    def saw_end(self) -> bool:
        return self.saw_done

    def assistant_message(self) -> Message:
        message: Message = {"role": "assistant", "content": "".join(self.content) or None}
        calls = self.calls
        if calls:
            message["tool_calls"] = calls
        return message

    def shown(self) -> Message:
        """The assistant message as the client assembled it from the stream."""
        self.calls  # noqa: B018 -- assemble the arguments of the calls the client saw
        message: Message = {"role": "assistant", "content": "".join(self.shown_content) or None}
        if self.own_calls:
            message["tool_calls"] = self.own_calls
        return message

    def closing(self, include_usage: bool) -> tuple[list[bytes], bool]:
        if self.round == 0 and not any(self.withheld(c) for c in self.calls) and self.held:
            return self.held, True  # nothing was rewritten: the upstream's own closing bytes
        chunk = {"id": self.first_id, "object": "chat.completion.chunk", "created": self.created or int(time.time()),
                 "model": self.model, "choices": [{"index": 0, "delta": {}, "finish_reason": self.finish or "stop"}]}
        out = [encode_event(chunk)]
        if include_usage and self.usage is not None:
            out.append(encode_event({"id": self.first_id, "object": "chat.completion.chunk", "created": chunk["created"],
                                     "model": self.model, "choices": [], "usage": self.usage}))
        out.append(b"data: [DONE]\n\n")
        return out, False
