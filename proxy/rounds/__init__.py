"""The response side: one round loop over wire-neutral rounds, one framing per API shape.

When the model calls `tool_search`, Keel answers it and calls the model again; the client
sees one answer. `responder.ToolSearchResponder` runs that loop once for every shape. What
differs per shape is how an answer is read and written, whole or as events:

    chat.py       Chat Completions: `choices[0].message`; `data:` chunks, `[DONE]`
    responses.py  Responses: `output` items; typed `response.*` events
    messages.py   Messages: content blocks; `message_start` … `message_stop` events

A framing reads an answer into a `Round` (the calls in it, the assistant messages to send
back when continuing, usage) and writes the client's answer: the calls Keel answered are left
out, the rounds' indexes stay contiguous, one id, one stop reason, usage summed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

from proxy.errors import ProxyError
from proxy.jsontext import Json, JsonObject
from proxy.messages import Message
from proxy.sse import Event
from proxy.tools.search import CALL_TOOL, SEARCH_TOOL
from proxy.upstream import UpstreamResponse, header


class BrokenUpstreamError(ProxyError):
    """The upstream's reply to a continued call is not a whole answer: say so, with its status."""

    status = 502
    type = "upstream_error"
    code = "upstream_error"


def retry_after(response: UpstreamResponse) -> str:
    value = header(response, "retry-after")
    return f" (retry after {value} s)" if value else ""


def is_search(call: Json) -> bool:
    return isinstance(call, dict) and (call.get("function") or {}).get("name") == SEARCH_TOOL


def is_generic(call: Json) -> bool:
    return isinstance(call, dict) and (call.get("function") or {}).get("name") == CALL_TOOL


def add_usage(total: Json, usage: Json) -> Json:
    """Sum two usage objects leaf by leaf (numbers add; nested details merge)."""
    if not isinstance(usage, dict):
        return total
    if not isinstance(total, dict):
        total = {}
    for key, value in usage.items():
        if isinstance(value, bool) or value is None:
            total.setdefault(key, value)
        elif isinstance(value, (int, float)):
            total[key] = (total.get(key) or 0) + value
        elif isinstance(value, dict):
            total[key] = add_usage(total.get(key), value)
        else:
            total.setdefault(key, value)
    return total


def well_formed_calls(calls: Json) -> bool:
    """View tool calls Keel can answer or rewrite: objects with a string id and a function whose
    name and arguments are strings. Anything else is the upstream's own business."""
    return isinstance(calls, list) and all(
        isinstance(c, dict) and isinstance(c.get("id"), str) and isinstance(c.get("function"), dict)
        and isinstance(c["function"].get("name"), str) and isinstance(c["function"].get("arguments", ""), str)
        for c in calls)


@dataclass
class Round:
    """One upstream answer, read whole: what the loop needs to decide and to continue."""

    data: Json  # the answer as parsed, in its shape (rewritten for the client at the end)
    calls: list[Message]  # its tool calls, as view calls
    assistant: list[Message]  # view messages to send back when continuing (the answer as produced)
    shown: Message  # the answer as one view message (its text and calls): what the client keeps
    usage: Json = None
    extra: JsonObject = field(default_factory=dict)


class JsonFraming(Protocol):
    def read(self, raw: bytes) -> Round | None:
        """The answer as a round, or None when it is not an answer Keel can read (relayed as sent)."""
        ...

    def write(self, last: Round, keep: Callable[[Message], bool], finish: str | None, usage: Json) -> bytes:
        """The client's answer: the last round with only the calls `keep` accepts, `finish` as its
        stop reason when Keel ended the turn after answering searches ("tool_calls" when the
        client has calls of its own to make, else "stop"), usage summed over the rounds."""
        ...

    def take_dispatched(self) -> JsonObject:
        """Generic `call_tool` calls `write` rewrote into the client's own, by call id (chat only)."""
        ...


class StreamFraming(Protocol):
    """Rewrites one client stream out of one or more upstream streams (one per round)."""

    error: bool  # the upstream sent an error event: it was relayed, stop
    finished: bool  # this round's stream ended as a whole answer does
    own_calls: list[Message]  # the client's calls forwarded so far, all rounds
    usage: Json
    alias: tuple[str, str] | None  # (the id the client was shown, the id the upstream stored it under)

    def feed(self, event: Event) -> bytes | None:
        """What of one upstream event goes to the client now (None: nothing)."""
        ...

    @property
    def calls(self) -> list[Message]:
        """This round's calls (as view calls), the withheld ones too."""
        ...

    def assistant(self) -> list[Message]:
        """This round's answer as view messages, as the provider produced it."""
        ...

    def shown(self) -> Message:
        """The answer as the client assembled it from the stream, as one view message."""
        ...

    def real_calls(self) -> list[bytes]:
        """Events for generic `call_tool` calls rewritten to the client's own (chat only)."""
        ...

    def take_dispatched(self) -> JsonObject: ...

    def next_round(self) -> None: ...

    def conclude(self, tool_calls: bool) -> None:
        """The answer ends with this round (Keel answered its searches): with the client's own
        calls to make, or with none."""
        ...

    def closing(self, include_usage: bool) -> tuple[list[bytes], bool]:
        """The last events, and whether they are the upstream's own (nothing was rewritten)."""
        ...

    @property
    def saw_end(self) -> bool:
        """The upstream's own stream ended with its end marker."""
        ...


class Framings(NamedTuple):
    """How a shape's answers are read and written: whole, and a new streamed reader per reply
    (`Shape.framings`)."""

    json: JsonFraming
    stream: Callable[[], StreamFraming]


class RenumberedStream:
    """What the Responses and Messages stream rewriters share: several upstream rounds become one
    client stream whose items (output items, content blocks) are renumbered around the withheld
    tool_search ones."""

    def __init__(self) -> None:
        self.error = False
        self.finished = False
        self.own_calls: list[Message] = []
        self.usage: Json = None
        self.alias: tuple[str, str] | None = None
        self.round = 0
        self.offset = 0  # visible items of earlier rounds (this round's index base)
        self.index_map: dict[int, int | None] = {}  # this round's index -> the client's (None: withheld)
        self.visible: list[Json] = []  # every visible item so far, all rounds, in order
        self.held: list[bytes] = []
