"""The httpx upstream client: one pooled AsyncClient per upstream origin."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping

import httpx

from proxy.config import ServerConfig
from proxy.errors import ProxyError
from proxy.upstream import header_pairs, origin, reset, timeout_error, unreachable

_PHASES = {
    httpx.ConnectTimeout: "connecting to",
    httpx.ReadTimeout: "waiting for a response from",
    httpx.WriteTimeout: "sending the request to",
    httpx.PoolTimeout: "waiting for a free connection to",
}


def translate(exc: httpx.HTTPError, url: str) -> ProxyError:
    host = httpx.URL(url).host
    if isinstance(exc, httpx.TimeoutException):
        return timeout_error(host, _PHASES.get(type(exc), "talking to"))
    if isinstance(exc, httpx.ConnectError):
        return unreachable(host)
    return reset(host)


class HttpxResponse:
    def __init__(self, response: httpx.Response, url: str) -> None:
        self._response = response
        self._url = url
        self.status = response.status_code
        self.headers = header_pairs(response.headers.raw)

    async def iter_raw(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._response.aiter_raw():
                yield chunk
        except httpx.HTTPError as exc:
            raise translate(exc, self._url) from exc

    async def read(self) -> bytes:
        try:
            return b"".join([chunk async for chunk in self.iter_raw()])
        finally:
            await self._response.aclose()

    async def aclose(self) -> None:
        await self._response.aclose()


class HttpxUpstream:
    def __init__(self, server: ServerConfig, transport: httpx.AsyncBaseTransport | None = None) -> None:
        t = server.timeouts
        self._timeout = httpx.Timeout(connect=t.connect, read=t.read, write=t.write, pool=t.pool)
        self._limits = httpx.Limits(
            max_connections=server.max_connections, max_keepalive_connections=server.keepalive_connections
        )
        self._transport = transport
        self._clients: dict[str, httpx.AsyncClient] = {}

    def _client(self, url: str) -> httpx.AsyncClient:
        key = origin(url)
        client = self._clients.get(key)
        if client is None:
            client = httpx.AsyncClient(timeout=self._timeout, limits=self._limits, transport=self._transport)
            self._clients[key] = client
        return client

    async def open(self, method: str, url: str, headers: Mapping[str, str], content: bytes | None) -> HttpxResponse:
        client = self._client(url)
        # A bare Request: the client's default headers (user-agent, accept-encoding…) would
        # change what the upstream sees and how it encodes the body we pass back.
        request = httpx.Request(method, url, headers=headers, content=content)
        try:
            return HttpxResponse(await client.send(request, stream=True), url)
        except httpx.HTTPError as exc:
            raise translate(exc, url) from exc

    async def aclose(self) -> None:
        for client in self._clients.values():
            await client.aclose()
        self._clients.clear()
