"""Anthropic Messages answers, whole and streamed.

A stream is whole when `message_stop` closed it after a `message_delta` with the stop reason;
it adds up to `message_start`'s message with each content block built from its start and its
deltas (text, a tool's input JSON, thinking and its signature, citations) and the final usage.
Written back: `message_start` (no content, no stop reason), for each block its start, one
delta of its whole content and its stop, `message_delta` with the stop reason and the usage,
and `message_stop`, as Anthropic streams them.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import orjson

from proxy.jsontext import Json, JsonObject
from proxy.respcache.policy import limit_set, number
from proxy.sse import Event

FINISHED = frozenset({"end_turn", "tool_use", "stop_sequence"})
_TEXT_DELTAS = {"text_delta": "text", "thinking_delta": "thinking"}


class MessagesAnswers:
    def never(self, wire: JsonObject) -> str | None:
        return None

    def whole(self, body: JsonObject, wire: JsonObject) -> bool:
        stop = body.get("stop_reason")
        return body.get("type") == "message" and isinstance(body.get("content"), list) and (
            stop in FINISHED or (stop == "max_tokens" and limit_set(wire, "max_tokens")))

    def assemble(self, events: Iterable[Event]) -> JsonObject | None:
        message: JsonObject | None = None
        blocks: dict[int, JsonObject] = {}
        inputs: dict[int, list[str]] = {}
        stopped = False
        for event in events:
            data = event.json()
            kind = data.get("type") if isinstance(data, dict) else None
            if kind == "message_start" and isinstance(data.get("message"), dict):
                message = dict(data["message"])
            elif kind == "content_block_start" and isinstance(data.get("content_block"), dict):
                blocks[number(data.get("index"))] = dict(data["content_block"])
            elif kind == "content_block_delta":
                block = blocks.get(number(data.get("index")))
                if block is None or not _add(block, data.get("delta"), inputs.setdefault(number(data.get("index")), [])):
                    return None
            elif kind == "content_block_stop":
                index = number(data.get("index"))
                if inputs.get(index) and index in blocks:
                    try:
                        blocks[index]["input"] = orjson.loads("".join(inputs[index]))
                    except orjson.JSONDecodeError:
                        return None
            elif kind == "message_delta" and message is not None:
                message.update(data.get("delta") or {})
                usage = {k: v for k, v in (data.get("usage") or {}).items() if v is not None}
                message["usage"] = {**(message.get("usage") or {}), **usage}
            elif kind == "message_stop":
                stopped = True
            elif kind == "error":
                return None
        if message is None or not stopped:
            return None
        message["content"] = [blocks[i] for i in sorted(blocks)]
        return message

    def events(self, body: JsonObject, stream_options: Json) -> bytes:
        return b"".join(_events(body))


def _add(block: JsonObject, delta: Json, inputs: list[str]) -> bool:
    """One delta into its block; False for one Keel does not know (the stream is not kept)."""
    kind = delta.get("type") if isinstance(delta, dict) else None
    if kind in _TEXT_DELTAS:
        name = _TEXT_DELTAS[str(kind)]
        block[name] = str(block.get(name) or "") + str(delta.get(name) or "")
    elif kind == "input_json_delta":
        inputs.append(str(delta.get("partial_json") or ""))
    elif kind == "signature_delta":
        block["signature"] = delta.get("signature")
    elif kind == "citations_delta":
        block["citations"] = [*(block.get("citations") or []), delta.get("citation")]
    else:
        return False
    return True


def _event(kind: str, **fields: Json) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps({"type": kind, **fields}) + b"\n\n"


def _events(body: JsonObject) -> Iterator[bytes]:
    usage: JsonObject = body["usage"] if isinstance(body.get("usage"), dict) else {}
    started = {**body, "content": [], "stop_reason": None, "stop_sequence": None,
               "usage": {**usage, "output_tokens": min(1, number(usage.get("output_tokens")))}}
    yield _event("message_start", message=started)
    for index, block in enumerate(body.get("content") or []):
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            yield _event("content_block_start", index=index, content_block={**block, "text": ""})
            yield _event("content_block_delta", index=index, delta={"type": "text_delta", "text": block.get("text", "")})
        elif kind in ("tool_use", "server_tool_use", "mcp_tool_use"):
            yield _event("content_block_start", index=index, content_block={**block, "input": {}})
            yield _event("content_block_delta", index=index, delta={
                "type": "input_json_delta", "partial_json": orjson.dumps(block.get("input") or {}).decode()})
        elif kind == "thinking":
            yield _event("content_block_start", index=index, content_block={**block, "thinking": "", "signature": ""})
            yield _event("content_block_delta", index=index,
                         delta={"type": "thinking_delta", "thinking": block.get("thinking", "")})
            yield _event("content_block_delta", index=index,
                         delta={"type": "signature_delta", "signature": block.get("signature", "")})
        else:  # redacted thinking, server tool results: whole in their start
            yield _event("content_block_start", index=index, content_block=block)
        yield _event("content_block_stop", index=index)
    yield _event("message_delta", delta={"stop_reason": body.get("stop_reason"),
                                         "stop_sequence": body.get("stop_sequence")}, usage=usage)
    yield _event("message_stop")
