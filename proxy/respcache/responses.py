"""Responses answers, whole and streamed.

Never cached: a request whose response the provider stores (`store` true, the default), one
that continues state held upstream (`previous_response_id`, `conversation`) or runs in the
`background`: each reads or writes something only the provider holds, and a hit would skip it.

A stream is whole when it ends with `response.completed` (or `response.incomplete` at the
`max_output_tokens` the request set), whose response object is the answer. Written back: the
events the API sends, numbered (`sequence_number`): created, in progress, for each output
item its added and done events with its content (a message's parts with one text delta each,
a call's arguments in one delta), then the terminal event with the whole response.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import orjson

from proxy.jsontext import Json, JsonObject
from proxy.respcache.policy import limit_set
from proxy.sse import Event

_TERMINAL = {"completed": "response.completed", "incomplete": "response.incomplete"}
_ARGUMENTS = {"function_call": ("arguments", "response.function_call_arguments"),
              "custom_tool_call": ("input", "response.custom_tool_call_input")}
_PART_TEXT = {"output_text": ("text", "response.output_text"), "refusal": ("refusal", "response.refusal")}


class ResponsesAnswers:
    def never(self, wire: JsonObject) -> str | None:
        if wire.get("store") is not False:
            return "store"  # the provider keeps it (and a later request may continue from it)
        if wire.get("previous_response_id") is not None:
            return "previous-response-id"
        if wire.get("conversation") is not None:
            return "conversation"
        if wire.get("background"):
            return "background"
        return None

    def whole(self, body: JsonObject, wire: JsonObject) -> bool:
        if body.get("error") is not None or not isinstance(body.get("output"), list):
            return False
        if body.get("status") == "completed":
            return True
        details = body.get("incomplete_details")
        reason = details.get("reason") if isinstance(details, dict) else None
        return body.get("status") == "incomplete" and reason == "max_output_tokens" and limit_set(
            wire, "max_output_tokens")

    def assemble(self, events: Iterable[Event]) -> JsonObject | None:
        for event in events:
            data = event.json()
            kind = data.get("type") if isinstance(data, dict) else None
            if kind in _TERMINAL.values() and isinstance(data.get("response"), dict):
                response: JsonObject = data["response"]
                return response
            if kind in ("error", "response.failed"):
                return None
        return None

    def events(self, body: JsonObject, stream_options: Json) -> bytes:
        return b"".join(_events(body))


def _events(body: JsonObject) -> Iterator[bytes]:
    sequence = 0

    def event(kind: str, **fields: Json) -> bytes:
        nonlocal sequence
        payload = {"type": kind, **fields, "sequence_number": sequence}
        sequence += 1
        return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"

    pending = {**body, "status": "in_progress", "output": [], "usage": None}
    yield event("response.created", response=pending)
    yield event("response.in_progress", response=pending)
    for index, item in enumerate(body.get("output") or []):
        if not isinstance(item, dict):
            continue
        at: JsonObject = {"item_id": item.get("id"), "output_index": index}
        kind = item.get("type")
        if kind == "message" and isinstance(item.get("content"), list):
            yield event("response.output_item.added", output_index=index,
                        item={**item, "status": "in_progress", "content": []})
            for n, part in enumerate(item["content"]):
                name, prefix = _PART_TEXT.get(str(part.get("type")) if isinstance(part, dict) else "", ("", ""))
                if not name:
                    yield event("response.content_part.added", **at, content_index=n, part=part)
                    yield event("response.content_part.done", **at, content_index=n, part=part)
                    continue
                yield event("response.content_part.added", **at, content_index=n, part={**part, name: ""})
                extra = {"logprobs": part.get("logprobs") or []} if name == "text" else {}
                yield event(prefix + ".delta", **at, content_index=n, delta=part.get(name) or "", **extra)
                yield event(prefix + ".done", **at, content_index=n, **{name: part.get(name) or ""}, **extra)
                yield event("response.content_part.done", **at, content_index=n, part=part)
        elif kind in _ARGUMENTS:
            key, prefix = _ARGUMENTS[str(kind)]
            yield event("response.output_item.added", output_index=index,
                        item={**item, key: "", "status": "in_progress"})
            yield event(prefix + ".delta", **at, delta=item.get(key) or "")
            yield event(prefix + ".done", **at, **{key: item.get(key) or ""})
        else:  # reasoning, hosted tool calls: whole, as added and done
            yield event("response.output_item.added", output_index=index, item=item)
        yield event("response.output_item.done", output_index=index, item=item)
    yield event(_TERMINAL.get(str(body.get("status")), "response.completed"), response=body)
