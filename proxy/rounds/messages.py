"""Messages framing: `content` blocks whole; `message_start` … `message_stop` events.

A `tool_search` tool_use block is withheld, every event of it; the other blocks keep
contiguous indexes across rounds. A later round's `message_start` is dropped (its usage is
summed); each round's `message_delta` and `message_stop` are held, and the turn ends with one
`message_delta` (the stop reason, usage summed over the rounds) and one `message_stop`. The
blocks of each round are assembled as they stream (text, thinking and its signature, tool
input), so a continued call sends the answer back exactly as the model produced it.
"""

from __future__ import annotations

from collections.abc import Callable

import orjson

from proxy import jsontext
from proxy.codecs import Origins
from proxy.codecs.messages import assistant_message
from proxy.jsontext import Json, JsonObject
from proxy.messages import Message
from proxy.rounds import RenumberedStream, Round, add_usage
from proxy.sse import Event


def _searching(block: Json) -> bool:
    return isinstance(block, dict) and block.get("type") == "tool_use" and block.get("name") == "tool_search"


def _call(block: JsonObject) -> Message | None:
    if block.get("type") != "tool_use":
        return None
    arguments = block.get("input")
    return {"id": block.get("id"), "type": "function", "function": {
        "name": block.get("name"), "arguments": jsontext.dumps(arguments if arguments is not None else {}).decode()}}


def _shown(blocks: list[Json]) -> Message:
    texts = [b.get("text", "") for b in blocks if isinstance(b, dict) and b.get("type") == "text"]
    calls = [c for b in blocks if isinstance(b, dict) and (c := _call(b)) is not None]
    message: Message = {"role": "assistant", "content": "".join(texts) or None}
    if calls:
        message["tool_calls"] = calls
    return message


class MessagesJson:
    def take_dispatched(self) -> JsonObject:
        return {}  # no dispatch on this shape

    def read(self, raw: bytes) -> Round | None:
        try:
            data = jsontext.loads(raw)
        except ValueError:
            return None
        if not isinstance(data, dict) or data.get("type") != "message":
            return None
        content = data.get("content")
        if not isinstance(content, list) or not all(isinstance(b, dict) for b in content):
            return None
        calls = [c for b in content if (c := _call(b)) is not None]
        if not all(isinstance(c["id"], str) and isinstance(c["function"]["name"], str) for c in calls):
            return None
        answer = assistant_message({"role": "assistant", "content": content}, Origins())
        return Round(data, calls, [answer], _shown(content), data.get("usage"))

    def write(self, last: Round, keep: Callable[[Message], bool], finish: str | None, usage: Json) -> bytes:
        data = dict(last.data)
        data["content"] = [b for b in data["content"] if not _searching(b)]
        if finish is not None:
            data["stop_reason"] = "tool_use" if finish == "tool_calls" else "end_turn"
        if usage is not None:
            data["usage"] = usage
        return jsontext.dumps(data)


class MessagesStream(RenumberedStream):
    """Rewrites one client stream of Messages events out of one or more upstream streams."""

    def __init__(self) -> None:
        super().__init__()
        self.changed = False  # something was withheld or renumbered: the closing events are Keel's
        self.blocks: dict[int, JsonObject] = {}  # this round's blocks, assembled
        self.pieces: dict[int, list[str]] = {}  # tool_use input / text / thinking pieces by block index
        self.stop_reason: str | None = None
        self.stop_sequence: Json = None
        self.stopped = False

    def feed(self, event: Event) -> bytes | None:
        data = event.json()
        if not isinstance(data, dict) or not isinstance(data.get("type"), str):
            return event.raw
        kind = data["type"]
        if kind == "error":
            self.error = True
            return event.raw
        if kind == "message_start":
            message = data.get("message")
            usage = message.get("usage") if isinstance(message, dict) else None
            if isinstance(usage, dict):  # the round's input; its output comes with message_delta
                self.usage = add_usage(self.usage, {k: v for k, v in usage.items() if k != "output_tokens"})
            return event.raw if self.round == 0 else None
        if kind == "message_delta":
            delta = data.get("delta")
            if isinstance(delta, dict):
                self.stop_reason = delta.get("stop_reason") or self.stop_reason
                self.stop_sequence = delta.get("stop_sequence")
            usage = data.get("usage")
            if isinstance(usage, dict):  # cumulative within a round: its output tokens are the round's
                self.usage = add_usage(self.usage, {"output_tokens": usage.get("output_tokens", 0)})
            self.held.append(event.raw)
            return None
        if kind == "message_stop":
            self.finished = self.stopped = True
            self.held.append(event.raw)
            return None
        index = data.get("index")
        if not isinstance(index, int) or kind not in ("content_block_start", "content_block_delta",
                                                      "content_block_stop"):
            return event.raw  # ping and what Keel does not know
        if kind == "content_block_start":
            block = data.get("content_block")
            block = dict(block) if isinstance(block, dict) else {}
            self.blocks[index] = block
            self.pieces[index] = []
            if _searching(block):
                self.index_map[index] = None
            else:
                self.index_map[index] = self.offset + sum(1 for v in self.index_map.values() if v is not None)
        elif kind == "content_block_delta":
            self._grow(index, data.get("delta"))
        elif kind == "content_block_stop":
            self._finish(index)
        mapped = self.index_map.get(index, index + self.offset)
        if mapped is None:
            self.changed = True
            return None
        if mapped == index:
            return event.raw
        self.changed = True
        event_name: str = kind
        return b"event: " + event_name.encode() + b"\ndata: " + orjson.dumps({**data, "index": mapped}) + b"\n\n"

    def _grow(self, index: int, delta: Json) -> None:
        if not isinstance(delta, dict) or index not in self.blocks:
            return
        kind = delta.get("type")
        block = self.blocks[index]
        if kind == "text_delta" and isinstance(delta.get("text"), str):
            self.pieces[index].append(delta["text"])
        elif kind == "input_json_delta" and isinstance(delta.get("partial_json"), str):
            self.pieces[index].append(delta["partial_json"])
        elif kind == "thinking_delta" and isinstance(delta.get("thinking"), str):
            self.pieces[index].append(delta["thinking"])
        elif kind == "signature_delta" and isinstance(delta.get("signature"), str):
            block["signature"] = block.get("signature", "") + delta["signature"]

    def _finish(self, index: int) -> None:
        block = self.blocks.get(index)
        if block is None:
            return
        joined = "".join(self.pieces.get(index, []))
        if block.get("type") == "text":
            block["text"] = block.get("text", "") + joined
        elif block.get("type") == "thinking":
            block["thinking"] = block.get("thinking", "") + joined
        elif block.get("type") in ("tool_use", "server_tool_use"):
            try:
                block["input"] = jsontext.loads(joined.encode()) if joined else block.get("input") or {}
            except ValueError:
                block["input"] = {}
        if self.index_map.get(index) is not None:
            self.visible.append(block)
            call = _call(block)
            if call is not None:
                self.own_calls.append(call)

    @property
    def saw_end(self) -> bool:
        return self.stopped

    @property
    def calls(self) -> list[Message]:
        return [c for i in sorted(self.blocks) if (c := _call(self.blocks[i])) is not None]

    def assistant(self) -> list[Message]:
        blocks = [self.blocks[i] for i in sorted(self.blocks)]
        return [assistant_message({"role": "assistant", "content": blocks}, Origins())]

    def shown(self) -> Message:
        return _shown(self.visible)

    def real_calls(self) -> list[bytes]:
        return []

    def take_dispatched(self) -> JsonObject:
        return {}

    def conclude(self, tool_calls: bool) -> None:
        self.stop_reason = "tool_use" if tool_calls else "end_turn"

    def next_round(self) -> None:
        self.round += 1
        self.offset = len(self.visible)
        self.index_map, self.blocks, self.pieces, self.held = {}, {}, {}, []
        self.finished = self.stopped = False
        self.changed = True

    def closing(self, include_usage: bool) -> tuple[list[bytes], bool]:
        if not self.changed and self.held:
            return self.held, True  # nothing was rewritten: the upstream's own closing events
        delta = {"type": "message_delta", "delta": {"stop_reason": self.stop_reason or "end_turn",
                                                     "stop_sequence": self.stop_sequence},
                 "usage": self.usage or {"output_tokens": 0}}
        return [b"event: message_delta\ndata: " + orjson.dumps(delta) + b"\n\n",
                b'event: message_stop\ndata: {"type":"message_stop"}\n\n'], False
