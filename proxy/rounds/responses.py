"""Responses framing: `output` items whole; typed `response.*` events, `response.completed` last.

Every event that belongs to an output item carries its `output_index`. A `tool_search`
function call's item is withheld, every event of it; the other items keep contiguous indexes
across rounds, and once anything was withheld the events are renumbered (`sequence_number`).
A later round's `response.created`/`in_progress` are dropped; each round's `response.completed`
is held, and the last one goes out with every visible item of the turn and the usage summed.
A stream's response keeps the first round's id (clients check that the response they were
told of at `response.created` is the one completed); the last round's id is remembered beside
it (`alias`), because the upstream stored that one with the whole exchange: a client that
continues with `previous_response_id` set to the first id is sent on from the last.
"""

from __future__ import annotations

from collections.abc import Callable

import orjson

from proxy import jsontext
from proxy.codecs import Origins
from proxy.codecs.responses import item_messages
from proxy.jsontext import Json, JsonObject
from proxy.messages import Message
from proxy.rounds import RenumberedStream, Round, add_usage
from proxy.sse import Event

_ROUND_START = ("response.created", "response.in_progress", "response.queued")
_ROUND_END = ("response.completed", "response.incomplete", "response.failed")


def _call(item: JsonObject) -> Message | None:
    """A function or custom tool call item as a view call."""
    if item.get("type") == "function_call":
        return {"id": item.get("call_id"), "type": "function",
                "function": {"name": item.get("name"), "arguments": item.get("arguments") or ""}}
    if item.get("type") == "custom_tool_call":
        return {"id": item.get("call_id"), "type": "custom", "function": {"name": item.get("name"),
                                                                            "arguments": item.get("input") or ""}}
    return None


def _shown(items: list[Json]) -> Message:
    """Visible output items as one view message: their text and calls (what a hidden exchange is keyed by)."""
    texts = [p.get("text", "") for item in items if isinstance(item, dict) and item.get("type") == "message"
             for p in item.get("content") or [] if isinstance(p, dict) and p.get("type") == "output_text"]
    calls = [c for item in items if isinstance(item, dict) and (c := _call(item)) is not None]
    message: Message = {"role": "assistant", "content": "".join(texts) or None}
    if calls:
        message["tool_calls"] = calls
    return message


def _searching(item: Json) -> bool:
    return isinstance(item, dict) and item.get("type") == "function_call" and item.get("name") == "tool_search"


class ResponsesJson:
    def take_dispatched(self) -> JsonObject:
        return {}  # no dispatch on this shape

    def read(self, raw: bytes) -> Round | None:
        try:
            data = jsontext.loads(raw)
        except ValueError:
            return None
        output = data.get("output") if isinstance(data, dict) else None
        if not isinstance(output, list) or not all(isinstance(item, dict) for item in output):
            return None
        calls = [c for item in output if (c := _call(item)) is not None]
        if not all(isinstance(c["id"], str) and isinstance(c["function"]["name"], str) for c in calls):
            return None
        return Round(data, calls, item_messages(output, Origins()), _shown(output), data.get("usage"))

    def write(self, last: Round, keep: Callable[[Message], bool], finish: str | None, usage: Json) -> bytes:
        data = dict(last.data)
        data["output"] = [item for item in data["output"] if not _searching(item)]
        if usage is not None:
            data["usage"] = usage
        return jsontext.dumps(data)


class ResponsesStream(RenumberedStream):
    """Rewrites one client stream of Responses events out of one or more upstream streams."""

    def __init__(self) -> None:
        super().__init__()
        self.sequence = 0  # the next sequence_number the client gets
        self.renumber = False  # something was withheld: every later event is renumbered
        self.items: dict[int, Json] = {}  # this round's finished items by upstream output_index
        self.completed: JsonObject | None = None  # this round's response.completed payload
        self.first_id: str | None = None  # the response the client was told of
        self.alias: tuple[str, str] | None = None  # (first id, last round's id) once Keel continued

    def feed(self, event: Event) -> bytes | None:
        data = event.json()
        if not isinstance(data, dict) or not isinstance(data.get("type"), str):
            return event.raw  # comments, keep-alives, events Keel cannot read: as they came
        kind = data["type"]
        if kind == "error":
            self.error = True
            return event.raw
        if kind in _ROUND_START:
            response = data.get("response")
            if self.first_id is None and isinstance(response, dict) and isinstance(response.get("id"), str):
                self.first_id = response["id"]
            if self.round == 0:
                return self._out(event, data, changed=False)
            return None
        if kind in _ROUND_END:
            self.finished = True
            self.completed = data
            response = data.get("response")
            if isinstance(response, dict):
                self.usage = add_usage(self.usage, response.get("usage"))
            self.held.append(event.raw)
            return None
        index = data.get("output_index")
        if not isinstance(index, int):
            return self._out(event, data, changed=False)
        if kind == "response.output_item.added" and index not in self.index_map:
            item = data.get("item")
            if _searching(item):
                self.index_map[index] = None
            else:
                self.index_map[index] = self.offset + sum(1 for v in self.index_map.values() if v is not None)
        mapped = self.index_map.get(index, index + self.offset)
        if kind == "response.output_item.done" and isinstance(data.get("item"), dict):
            self.items[index] = data["item"]
            if mapped is not None:
                self.visible.append(data["item"])
                call = _call(data["item"])
                if call is not None:
                    self.own_calls.append(call)
        if mapped is None:
            self.renumber = True
            return None
        changed = mapped != index
        if changed:
            data = {**data, "output_index": mapped}
        return self._out(event, data, changed)

    def _out(self, event: Event, data: JsonObject, changed: bool) -> bytes:
        if not (changed or self.renumber or self.round > 0):
            self.sequence = max(self.sequence, int(data.get("sequence_number") or 0) + 1)
            return event.raw
        self.renumber = True
        data = {**data, "sequence_number": self.sequence}
        self.sequence += 1
        return b"event: " + str(data["type"]).encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"

    @property
    def saw_end(self) -> bool:
        return self.completed is not None

    @property
    def calls(self) -> list[Message]:
        return [c for i in sorted(self.items) if (c := _call(self.items[i])) is not None]

    def _round_items(self) -> list[Json]:
        response = (self.completed or {}).get("response")
        output = response.get("output") if isinstance(response, dict) else None
        if isinstance(output, list) and output:
            return output
        return [self.items[i] for i in sorted(self.items)]

    def assistant(self) -> list[Message]:
        return item_messages([i for i in self._round_items() if isinstance(i, dict)], Origins())

    def shown(self) -> Message:
        return _shown(self.visible)

    def real_calls(self) -> list[bytes]:
        return []

    def take_dispatched(self) -> JsonObject:
        return {}

    def conclude(self, tool_calls: bool) -> None:
        return None

    def next_round(self) -> None:
        self.round += 1
        self.offset = len(self.visible)
        self.index_map, self.items, self.held = {}, {}, []
        self.completed, self.finished = None, False

    def closing(self, include_usage: bool) -> tuple[list[bytes], bool]:
        if self.round == 0 and not self.renumber and self.held:
            return self.held, True  # nothing was rewritten: the upstream's own last event
        completed = dict(self.completed or {"type": "response.completed"})
        response = dict(completed.get("response") or {})
        last = response.get("id")
        if self.first_id is not None:
            response["id"] = self.first_id
            if isinstance(last, str) and last != self.first_id:
                self.alias = (self.first_id, last)
        response["output"] = list(self.visible)
        if self.usage is not None:
            response["usage"] = self.usage
        completed["response"] = response
        completed["type"] = completed.get("type") or "response.completed"
        completed["sequence_number"] = self.sequence
        self.sequence += 1
        return [b"event: " + str(completed["type"]).encode() + b"\ndata: " + orjson.dumps(completed) + b"\n\n"], False
