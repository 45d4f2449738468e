"""The aiohttp upstream client (the default): one pooled ClientSession per upstream origin.

Bodies pass through still encoded (`auto_decompress=False`) and no default headers are
added, so the upstream sees what the client sent and the client gets what the upstream sent.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping

import aiohttp
from yarl import URL

from proxy.config import ServerConfig
from proxy.errors import ProxyError
from proxy.upstream import header_pairs, origin, reset, timeout_error, unreachable

_SKIP = ("User-Agent", "Accept", "Accept-Encoding", "Content-Type")


def translate(exc: BaseException, url: str, phase: str) -> ProxyError:
    host = URL(url).host or url
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        return timeout_error(host, "connecting to")
    if isinstance(exc, (aiohttp.ServerTimeoutError, asyncio.TimeoutError)):
        return timeout_error(host, phase)
    if isinstance(exc, aiohttp.ClientConnectorError):
        return unreachable(host)
    return reset(host)


class AiohttpResponse:
    def __init__(self, response: aiohttp.ClientResponse, url: str) -> None:
        self._response = response
        self._url = url
        self.status = response.status
        self.headers = header_pairs(response.raw_headers)

    async def iter_raw(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._response.content.iter_any():
                yield chunk
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise translate(exc, self._url, "waiting for a response from") from exc

    async def read(self) -> bytes:
        try:
            body = b"".join([chunk async for chunk in self.iter_raw()])
        except BaseException:
            self._response.close()
            raise
        self._response.release()
        return body

    async def aclose(self) -> None:
        # An unfinished body cannot go back to the pool: close drops the connection.
        if self._response.content.at_eof():
            self._response.release()
        else:
            self._response.close()


class AiohttpUpstream:
    def __init__(self, server: ServerConfig) -> None:
        t = server.timeouts
        self._timeout = aiohttp.ClientTimeout(total=None, connect=t.pool + t.connect, sock_connect=t.connect,
                                              sock_read=t.read)
        self._server = server
        self._sessions: dict[str, aiohttp.ClientSession] = {}

    def _session(self, url: str) -> aiohttp.ClientSession:
        key = origin(url)
        session = self._sessions.get(key)
        if session is None:
            connector = aiohttp.TCPConnector(limit=self._server.max_connections, limit_per_host=0,
                                             keepalive_timeout=30, enable_cleanup_closed=True)
            session = aiohttp.ClientSession(connector=connector, timeout=self._timeout, auto_decompress=False,
                                            skip_auto_headers=_SKIP, cookie_jar=aiohttp.DummyCookieJar())
            self._sessions[key] = session
        return session

    async def open(self, method: str, url: str, headers: Mapping[str, str], content: bytes | None) -> AiohttpResponse:
        session = self._session(url)
        try:
            response = await session.request(method, URL(url, encoded=True), headers=dict(headers), data=content,
                                             allow_redirects=False, compress=None)
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise translate(exc, url, "waiting for a response from") from exc
        return AiohttpResponse(response, url)

    async def aclose(self) -> None:
        for session in self._sessions.values():
            await session.close()
        self._sessions.clear()
