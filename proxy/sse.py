"""Server-sent events, incrementally: bytes in, whole events out (raw bytes and parsed data)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import orjson


@dataclass(frozen=True)
class Event:
    raw: bytes  # the event as received, with its terminating blank line
    data: bytes | None  # the joined `data:` payload, None for comments and keep-alives

    @property
    def done(self) -> bool:
        return self.data == b"[DONE]"

    def json(self) -> Any:
        return orjson.loads(self.data) if self.data and not self.done else None


class EventParser:
    def __init__(self) -> None:
        self._buffer = b""

    def feed(self, chunk: bytes) -> Iterator[Event]:
        self._buffer += chunk
        while True:
            end, sep = self._boundary()
            if end < 0:
                return
            raw = self._buffer[: end + sep]
            self._buffer = self._buffer[end + sep :]
            yield Event(raw, _data(raw))

    def rest(self) -> bytes:
        return self._buffer

    def _boundary(self) -> tuple[int, int]:
        candidates = [(self._buffer.find(s), len(s)) for s in (b"\n\n", b"\r\n\r\n")]
        found = [(i, n) for i, n in candidates if i >= 0]
        return min(found) if found else (-1, 0)


def _data(raw: bytes) -> bytes | None:
    lines = [line[5:].removeprefix(b" ") for line in raw.splitlines() if line.startswith(b"data:")]
    return b"\n".join(lines) if lines else None


def encode_event(payload: Any) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"
