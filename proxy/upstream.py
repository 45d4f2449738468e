"""The upstream client: one pooled httpx.AsyncClient per upstream base URL.

`Upstream.open` sends a request and returns the response with its body unread, so callers
stream it on or read it whole. httpx's exceptions are translated here, once, into Keel's
error tree: a refused or reset connection is a 502, a timeout a 504.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Protocol

import httpx

from proxy.config import ServerConfig
from proxy.errors import ProxyError, UpstreamConnectError, UpstreamTimeoutError


class Upstream(Protocol):
    async def open(
        self, method: str, url: str, headers: Mapping[str, str], content: bytes | None
    ) -> httpx.Response: ...

    async def aclose(self) -> None: ...


def translate(exc: httpx.HTTPError, url: str) -> ProxyError:
    """Map an httpx failure to the error the client sees, naming what went wrong."""
    host = httpx.URL(url).host
    if isinstance(exc, httpx.TimeoutException):
        what = {
            httpx.ConnectTimeout: "connecting to",
            httpx.ReadTimeout: "waiting for a response from",
            httpx.WriteTimeout: "sending the request to",
            httpx.PoolTimeout: "waiting for a free connection to",
        }.get(type(exc), "talking to")
        return UpstreamTimeoutError(f"upstream timeout: timed out {what} {host}")
    if isinstance(exc, httpx.ConnectError):
        return UpstreamConnectError(f"upstream unreachable: connection to {host} refused or failed")
    if isinstance(exc, (httpx.ReadError, httpx.RemoteProtocolError, httpx.WriteError)):
        return UpstreamConnectError(f"upstream connection to {host} was reset or closed early", code="upstream_reset")
    return UpstreamConnectError(f"upstream error talking to {host}: {type(exc).__name__}")


class HttpUpstream:
    """All upstream traffic of one process; clients are pooled per base URL and kept alive."""

    def __init__(self, server: ServerConfig, transport: httpx.AsyncBaseTransport | None = None) -> None:
        t = server.timeouts
        self._timeout = httpx.Timeout(connect=t.connect, read=t.read, write=t.write, pool=t.pool)
        self._limits = httpx.Limits(
            max_connections=server.max_connections, max_keepalive_connections=server.keepalive_connections
        )
        self._transport = transport
        self._clients: dict[str, httpx.AsyncClient] = {}

    def _client(self, url: str) -> httpx.AsyncClient:
        origin = url.split("/", 3)
        base = "/".join(origin[:3])
        client = self._clients.get(base)
        if client is None:
            client = httpx.AsyncClient(
                timeout=self._timeout, limits=self._limits, transport=self._transport, follow_redirects=False
            )
            self._clients[base] = client
        return client

    async def open(
        self, method: str, url: str, headers: Mapping[str, str], content: bytes | None
    ) -> httpx.Response:
        client = self._client(url)
        # A bare Request: the client's default headers (user-agent, accept-encoding…) would
        # change what the upstream sees and how it encodes the body we pass back.
        request = httpx.Request(method, url, headers=headers, content=content)
        try:
            return await client.send(request, stream=True)
        except httpx.HTTPError as exc:
            raise translate(exc, url) from exc

    async def aclose(self) -> None:
        for client in self._clients.values():
            await client.aclose()
        self._clients.clear()


async def iter_raw(response: httpx.Response, url: str) -> AsyncIterator[bytes]:
    """The response body as it arrives (still encoded), with failures translated."""
    try:
        async for chunk in response.aiter_raw():
            yield chunk
    except httpx.HTTPError as exc:
        raise translate(exc, url) from exc


async def read_all(response: httpx.Response, url: str) -> bytes:
    try:
        return b"".join([chunk async for chunk in response.aiter_raw()])
    except httpx.HTTPError as exc:
        raise translate(exc, url) from exc
    finally:
        await response.aclose()
