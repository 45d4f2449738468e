"""Coalescing: identical requests in flight share one upstream call.

The first request for a key leads: its answer (planned and relayed as usual) is read by one
background task, the pump, into a buffer every client of the flight reads from at its own pace:
the leader, and any follower that arrived meanwhile wanting the same form (JSON, or a stream
with the same stream options). A follower that wants the other form waits for the whole
answer and gets it converted, as from the cache.

Each client's disconnect is its own: a client that leaves stops reading, and the upstream call
is closed (as Keel does for a lone client) only when no client is left reading or waiting.
So a follower leaving never cuts the leader's answer, and the leader leaving never cuts a
follower's. A buffer past the entry limit is shared with no new follower, and what every
reader has had of it is let go.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterable, AsyncIterator, Callable
from dataclasses import dataclass

from proxy.respcache.entries import Entry


@dataclass(frozen=True)
class Form:
    """How a client wants its answer: whole, or streamed with these stream options."""

    stream: bool
    options: bytes = b""  # stream_options, canonical
    usage_asked: bool = False  # a chat stream that asks for its usage (stream_options.include_usage)


@dataclass(frozen=True)
class Head:
    status: int
    headers: tuple[tuple[bytes, bytes], ...]  # as the leader's client got them
    streamed: bool
    encoded: bool  # content-encoded: not shared as is (a follower may not accept the coding); converted instead


class Flight:
    """One answer on its way, shared by the clients that asked for it while it was."""

    def __init__(self, key: str, form: Form, limit: int) -> None:
        self.key, self.form, self.limit = key, form, limit
        self.head: asyncio.Future[Head | None] = asyncio.get_running_loop().create_future()
        self.chunks: list[bytes] = []
        self.base = 0  # the position of chunks[0] (what every reader has had is let go past the limit)
        self.size = 0
        self.shareable = True
        self.finished = asyncio.Event()
        self.error: BaseException | None = None
        self.entry: Entry | None = None  # the whole answer, once read (the cache sets it)
        self.sharers = 0  # followers that read the leader's bytes
        self.waiting = 0  # followers waiting for the head or the whole answer
        self.pump: asyncio.Task[None] | None = None
        self._readers: dict[int, int] = {}  # reader -> the position of its next chunk
        self._ids = itertools.count()
        self._moved = asyncio.Event()

    def begin(self, head: Head | None) -> None:
        """The leader's answer started (None: the leader failed before it had one)."""
        if not self.head.done():
            self.head.set_result(head)
        if head is None:
            self.end()

    def push(self, chunk: bytes) -> None:
        self.chunks.append(chunk)
        self.size += len(chunk)
        if self.size > self.limit:
            self.shareable = False
        self._notify()

    def end(self, error: BaseException | None = None) -> None:
        self.error = error
        self.finished.set()
        self._notify()

    @property
    def body(self) -> bytes:
        return b"".join(self.chunks)

    def join(self) -> int:
        """A new reader, from the first byte (only while the flight is shareable)."""
        reader = next(self._ids)
        self._readers[reader] = self.base
        return reader

    async def read(self, reader: int) -> AsyncIterator[bytes]:
        """The answer's bytes for one reader, as they arrive; its leaving is its own."""
        try:
            while True:
                at = self._readers[reader]
                if at - self.base < len(self.chunks):
                    self._readers[reader] = at + 1
                    chunk = self.chunks[at - self.base]
                    self._trim()
                    yield chunk
                    continue
                if self.finished.is_set():
                    if self.error is not None:
                        raise self.error
                    return
                await self._moved.wait()
        finally:
            self.leave(reader)

    def leave(self, reader: int) -> None:
        self._readers.pop(reader, None)
        self.cancel_if_alone()

    def cancel_if_alone(self) -> None:
        """Nobody reads or waits any more: close the upstream call (as for a lone client that left)."""
        if not self._readers and not self.waiting and not self.finished.is_set() and self.pump is not None:
            self.pump.cancel()

    def start_pump(self, body: AsyncIterable[bytes | str | memoryview], landed: Callable[[Flight], None]) -> None:
        async def pump() -> None:
            try:
                async for chunk in body:
                    self.push(chunk.encode() if isinstance(chunk, str) else bytes(chunk))
            except asyncio.CancelledError:
                self.end(ConnectionAbortedError("every client of this answer left"))
                raise
            except Exception as exc:  # the relay cut an encoded stream: every reader's is cut the same way
                self.end(exc)
            else:
                self.end()
            finally:
                landed(self)  # kept when whole, else let go: a later request never joins a dead flight

        self.pump = asyncio.get_running_loop().create_task(pump())

    def _trim(self) -> None:
        if self.shareable or not self._readers:
            return
        drop = min(self._readers.values()) - self.base
        if drop > 0:
            del self.chunks[:drop]
            self.base += drop

    def _notify(self) -> None:
        moved, self._moved = self._moved, asyncio.Event()
        moved.set()


class Flights:
    """The flights of one process, by key (a landed flight stays until its entry is in the store)."""

    def __init__(self) -> None:
        self._flying: dict[str, Flight] = {}

    def get(self, key: str) -> Flight | None:
        return self._flying.get(key)

    def start(self, key: str, form: Form, limit: int) -> Flight:
        flight = Flight(key, form, limit)
        self._flying[key] = flight
        return flight

    def land(self, flight: Flight) -> None:
        if self._flying.get(flight.key) is flight:
            del self._flying[flight.key]

    def __len__(self) -> int:
        return len(self._flying)
