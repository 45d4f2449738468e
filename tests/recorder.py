"""A recording upstream: a raw ASGI app that keeps what it received and answers fixed bytes."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any


async def lifespan(scope: dict[str, Any], receive: Any, send: Any) -> bool:
    """Answer ASGI lifespan events (True when this was the lifespan scope): for raw test apps."""
    if scope["type"] != "lifespan":
        return False
    while (await receive())["type"] != "lifespan.shutdown":
        await send({"type": "lifespan.startup.complete"})
    await send({"type": "lifespan.shutdown.complete"})
    return True


async def read_body(receive: Any) -> bytes:
    """A raw ASGI request's whole body."""
    chunks = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            return b"".join(chunks)


@dataclass
class Recorded:
    method: str
    path: str
    query: bytes
    headers: dict[str, str]
    body: bytes
    raw_path: bytes = b""


@dataclass
class Recorder:
    status: int = 200
    content_type: bytes = b"application/json"
    chunks: list[bytes] = field(default_factory=lambda: [b'{"ok":  true ,"id":"x"}'])
    chunk_delay: float = 0.0
    received: list[Recorded] = field(default_factory=list)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if await lifespan(scope, receive, send):
            return
        body = await read_body(receive)
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        self.received.append(Recorded(scope["method"], scope["path"], scope["query_string"], headers, body,
                                      scope.get("raw_path") or b""))
        await send({"type": "http.response.start", "status": self.status,
                    "headers": [(b"content-type", self.content_type), (b"x-upstream", b"yes")]})
        for chunk in self.chunks:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
            if self.chunk_delay:
                await asyncio.sleep(self.chunk_delay)
        await send({"type": "http.response.body", "body": b""})
