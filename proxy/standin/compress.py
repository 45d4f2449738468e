"""The stand-in as a provider behind a CDN: every reply gzipped when the client accepts gzip.

JSON and event streams alike (a stream is flushed after each chunk, so events still arrive
as they are written): how a compressing provider looks to Keel (`keel standin --gzip`).
"""

from __future__ import annotations

import zlib

from starlette.types import ASGIApp, Message, Receive, Scope, Send


def accepts_gzip(scope: Scope) -> bool:
    for name, value in scope.get("headers") or []:
        if name.lower() == b"accept-encoding":
            return any(part.split(b";")[0].strip().lower() == b"gzip" for part in value.split(b","))
    return False


class GzipEverything:
    """ASGI middleware: gzip each response body the client accepts gzip for, streams included."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not accepts_gzip(scope):
            await self.app(scope, receive, send)
            return
        packer = zlib.compressobj(6, zlib.DEFLATED, zlib.MAX_WBITS | 16)

        async def gzipped(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != b"content-length"]
                message = {**message, "headers": [*headers, (b"content-encoding", b"gzip"), (b"vary", b"accept-encoding")]}
            elif message["type"] == "http.response.body":
                more = message.get("more_body", False)
                body = packer.compress(message.get("body", b""))
                body += packer.flush(zlib.Z_SYNC_FLUSH if more else zlib.Z_FINISH)
                message = {**message, "body": body}
            await send(message)

        await self.app(scope, receive, gzipped)
