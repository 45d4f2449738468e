"""Reading the answer of a reply Keel relays as it came (no round loop): what the client got,
as one view message, for the record of what was relayed to whom (`proxy.proofs`).

The same framings the round loop uses, fed passively: nothing they write goes anywhere.
"""

from __future__ import annotations

from collections.abc import Callable

from proxy.messages import Message
from proxy.rounds import JsonFraming, StreamFraming
from proxy.rounds.chat import ChatJson, ChatStream
from proxy.rounds.messages import MessagesJson, MessagesStream
from proxy.rounds.responses import ResponsesJson, ResponsesStream
from proxy.sse import Event


def framings(shape: str) -> tuple[JsonFraming, Callable[[], StreamFraming]]:
    """The shape's framings, whole and streamed (no dispatch catalog: the client's calls as sent)."""
    if shape == "responses":
        return ResponsesJson(), ResponsesStream
    if shape == "messages":
        return MessagesJson(), MessagesStream
    return ChatJson(), ChatStream


class AnswerReader:
    """One reply's answer: `body` for a whole one, `feed` then `shown` for a stream."""

    def __init__(self, shape: str) -> None:
        self._json, self._stream_type = framings(shape)
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
