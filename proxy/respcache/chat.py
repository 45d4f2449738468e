"""Chat Completions answers, whole and streamed: a stream read into the completion it adds up
to, and a completion written as the chunks a client would have received.

A stream is whole when every choice has a finish_reason and `data: [DONE]` closed it. Written
back, each choice is a role chunk, one content (or refusal) chunk with its logprobs, one chunk
per tool call with its whole arguments, and a finish chunk; with `stream_options.include_usage`
every chunk carries `"usage": null` and a last chunk with no choices carries the usage, as
OpenAI streams it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from proxy.jsontext import Json, JsonObject
from proxy.respcache.policy import limit_set
from proxy.sse import Event, encode_event

FINISHED = frozenset({"stop", "tool_calls", "function_call"})
_HEAD = ("id", "object", "created", "model", "service_tier", "system_fingerprint")


@dataclass
class _Choice:
    role: str = "assistant"
    content: list[str] = field(default_factory=list)
    refusal: list[str] = field(default_factory=list)
    calls: dict[int, JsonObject] = field(default_factory=dict)
    logprobs: JsonObject | None = None
    annotations: list[Json] = field(default_factory=list)
    finish: str | None = None

    def message(self) -> JsonObject:
        text, refusal = "".join(self.content), "".join(self.refusal)
        message: JsonObject = {"role": self.role, "content": text if text or not (self.calls or refusal) else None,
                               "refusal": refusal or None}
        if self.annotations:
            message["annotations"] = self.annotations
        if self.calls:
            message["tool_calls"] = [self.calls[i] for i in sorted(self.calls)]
        return message


class ChatAnswers:
    def never(self, wire: JsonObject) -> str | None:
        return "store" if wire.get("store") is True else None  # a stored completion: the provider keeps each one

    def whole(self, body: JsonObject, wire: JsonObject) -> bool:
        choices = body.get("choices")
        if body.get("error") is not None or not isinstance(choices, list) or not choices:
            return False
        cut_ok = limit_set(wire, "max_tokens", "max_completion_tokens")
        return all(isinstance(c, dict) and (c.get("finish_reason") in FINISHED
                                            or (c.get("finish_reason") == "length" and cut_ok)) for c in choices)

    def assemble(self, events: Iterable[Event]) -> JsonObject | None:
        head: JsonObject | None = None
        choices: dict[int, _Choice] = {}
        usage: Json = None
        done = False
        for event in events:
            if event.done:
                done = True
                continue
            data = event.json()
            if data is None:
                if event.data is None:
                    continue  # a comment or keep-alive
                return None
            if not isinstance(data, dict) or "error" in data:
                return None
            if head is None:
                head = {k: data[k] for k in _HEAD if k in data} | {"object": "chat.completion"}
            if data.get("usage"):
                usage = data["usage"]
            for choice in data.get("choices") or []:
                if not isinstance(choice, dict) or not _read(choice, choices.setdefault(int(choice.get("index") or 0),
                                                                                     _Choice())):
                    return None
        if not done or head is None or not choices:
            return None
        body = {k: head[k] for k in _HEAD if k in head}
        body["choices"] = [{"index": i, "message": c.message(), "logprobs": c.logprobs, "finish_reason": c.finish}
                           for i, c in sorted(choices.items())]
        if usage is not None:
            body["usage"] = usage
        return body

    def events(self, body: JsonObject, stream_options: Json) -> bytes:
        with_usage = isinstance(stream_options, dict) and bool(stream_options.get("include_usage"))
        base = {k: body[k] for k in _HEAD if k in body} | {"object": "chat.completion.chunk"}
        out: list[bytes] = []

        def chunk(index: int, delta: JsonObject, finish: str | None = None, logprobs: Json = None) -> None:
            payload = {**base, "choices": [{"index": index, "delta": delta, "logprobs": logprobs,
                                            "finish_reason": finish}]}
            if with_usage:
                payload["usage"] = None
            out.append(encode_event(payload))

        for choice in body.get("choices") or []:
            index, message = int(choice.get("index") or 0), choice.get("message") or {}
            chunk(index, {"role": message.get("role", "assistant"), "content": "", "refusal": None})
            if message.get("content") or message.get("annotations"):
                delta: JsonObject = {"content": message.get("content") or ""}
                if message.get("annotations"):
                    delta["annotations"] = message["annotations"]
                chunk(index, delta, logprobs=choice.get("logprobs"))
            if message.get("refusal"):
                chunk(index, {"refusal": message["refusal"]})
            for n, call in enumerate(message.get("tool_calls") or []):
                chunk(index, {"tool_calls": [{"index": n, **call}]})
            chunk(index, {}, choice.get("finish_reason"))
        if with_usage and body.get("usage") is not None:
            out.append(encode_event({**base, "choices": [], "usage": body["usage"]}))
        out.append(b"data: [DONE]\n\n")
        return b"".join(out)


def _read(choice: JsonObject, into: _Choice) -> bool:
    """Add one streamed choice delta to what the choice has so far; False for one Keel cannot read."""
    delta = choice.get("delta") or {}
    if not isinstance(delta, dict):
        return False
    if isinstance(delta.get("role"), str):
        into.role = delta["role"]
    for name, parts in (("content", into.content), ("refusal", into.refusal)):
        value = delta.get(name)
        if isinstance(value, str):
            parts.append(value)
        elif value is not None:
            return False
    if isinstance(delta.get("annotations"), list):
        into.annotations.extend(delta["annotations"])
    for call in delta.get("tool_calls") or []:
        if not isinstance(call, dict) or not isinstance(call.get("function", {}), dict):
            return False
        have = into.calls.setdefault(int(call.get("index") or 0), {"id": None, "type": "function",
                                                                   "function": {"name": "", "arguments": ""}})
        for name in ("id", "type"):
            if call.get(name):
                have[name] = call[name]
        function = call.get("function") or {}
        for name in ("name", "arguments"):
            if isinstance(function.get(name), str):
                have["function"][name] += function[name]
    logprobs = choice.get("logprobs")
    if isinstance(logprobs, dict):
        into.logprobs = into.logprobs or {}
        for name, items in logprobs.items():
            if isinstance(items, list):
                into.logprobs[name] = [*(into.logprobs.get(name) or []), *items]
    if choice.get("finish_reason") is not None:
        into.finish = choice["finish_reason"]
    return True
