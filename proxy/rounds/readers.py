"""Reading the answer of a reply Keel relays as it came (no round loop): what the client got,
as one view message, for the record of what was relayed to whom (`proxy.proofs`).

The same framings the round loop uses, fed passively: nothing they write goes anywhere.
"""

from __future__ import annotations

from proxy.messages import Message
from proxy.rounds import Framings, StreamFraming
from proxy.sse import Event


class AnswerReader:
    """One reply's answer: `body` for a whole one, `feed` then `shown` for a stream."""

    def __init__(self, framings: Framings) -> None:
        """`framings`: the shape's, without a dispatch catalog (the client's calls as sent)."""
        self._json, self._stream_type = framings
        self._stream: StreamFraming | None = None

    def body(self, raw: bytes) -> Message | None:
        answer = self._json.read(raw)
        return answer.shown if answer is not None else None

    def feed(self, event: Event) -> None:
        if self._stream is None:
            self._stream = self._stream_type()
        self._stream.feed(event)

    def shown(self) -> Message | None:
        if self._stream is None or self._stream.error:
            return None
        self._stream.real_calls()
        return self._stream.shown()
