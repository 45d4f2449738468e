"""Server-sent events, incrementally: bytes in, whole events out (raw bytes and parsed data).

Linear in the stream's size: each chunk is scanned once for event boundaries and the
unfinished tail is kept, so a 100 MB stream of small events costs what reading it costs.
One event may not grow past `max_event_bytes` (an event that never ends is an error, not
unbounded memory).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

import orjson

from proxy.jsontext import Json

_BOUNDARY = re.compile(rb"\r\n\r\n|\n\n|\r\r")
MAX_EVENT_BYTES = 16 * 1024 * 1024


class EventTooLargeError(ValueError):
    """An event grew past the limit without ending."""


@dataclass(frozen=True)
class Event:
    raw: bytes  # the event as received, with its terminating blank line
    data: bytes | None  # the joined `data:` payload, None for comments and keep-alives

    @property
    def done(self) -> bool:
        return self.data == b"[DONE]"

    def json(self) -> Json:
        """The payload as JSON, or None when there is none or it is not JSON."""
        if not self.data or self.done:
            return None
        try:
            return orjson.loads(self.data)
        except orjson.JSONDecodeError:
            return None


class EventParser:
    def __init__(self, max_event_bytes: int = MAX_EVENT_BYTES) -> None:
        self._pending: list[bytes] = []  # chunks of the unfinished event
        self._pending_size = 0
        self._tail = b""  # the last three pending bytes (chunks may be shorter than a boundary)
        self._max = max_event_bytes

    def feed(self, chunk: bytes) -> Iterator[Event]:
        if self._pending:
            # A boundary can only start in the last three bytes of what is pending or in the new
            # chunk: look there first, and join the pending chunks only once an event is complete.
            if not _BOUNDARY.search(self._tail + chunk):
                self._grow(chunk)
                return
            self._pending.append(chunk)
            buffer = b"".join(self._pending)
            self._pending, self._pending_size, self._tail = [], 0, b""
        else:
            buffer = chunk
        start = 0
        for match in _BOUNDARY.finditer(buffer):
            raw = buffer[start : match.end()]
            start = match.end()
            yield Event(raw, _data(raw))
        if start < len(buffer):
            self._grow(buffer[start:])

    def _grow(self, piece: bytes) -> None:
        self._pending.append(piece)
        self._pending_size += len(piece)
        self._tail = (self._tail + piece[-3:])[-3:]
        if self._pending_size > self._max:
            raise EventTooLargeError(f"an event grew past {self._max} bytes without ending")

    def rest(self) -> bytes:
        """What arrived after the last complete event (an event the stream never finished)."""
        return b"".join(self._pending)


def _data(raw: bytes) -> bytes | None:
    lines = [line[5:].removeprefix(b" ") for line in raw.splitlines() if line.startswith(b"data:")]
    return b"\n".join(lines) if lines else None


def encode_event(payload: Json) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"
