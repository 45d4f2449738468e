"""The upstream seam: send a request, get a status, headers and a body to read or stream.

Two implementations, chosen by `server.upstream_client` (`proxy.defaults`) and measured in
`bench/overhead.py`: aiohttp (the default: its C parser costs a third of httpx's CPU per
request) and httpx. Each translates its library's failures here, once, into Keel's error
tree: a refused or reset connection is a 502, a timeout a 504, and the message says which.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Mapping
from typing import Protocol

from proxy.errors import ProxyError, UpstreamConnectError, UpstreamTimeoutError


class UpstreamResponse(Protocol):
    status: int
    headers: list[tuple[str, str]]  # as received, names lower-cased

    def iter_raw(self) -> AsyncIterator[bytes]:
        """The body as it arrives, still content-encoded; failures raise `ProxyError`."""
        ...

    async def read(self) -> bytes:
        """The whole body (still content-encoded); releases the connection."""
        ...

    async def aclose(self) -> None: ...


class Upstream(Protocol):
    async def open(
        self, method: str, url: str, headers: Mapping[str, str], content: bytes | None
    ) -> UpstreamResponse: ...

    async def aclose(self) -> None: ...


def header(response: UpstreamResponse, name: str, default: str = "") -> str:
    for key, value in response.headers:
        if key == name:
            return value
    return default


def json_headers(api_key: str | None) -> dict[str, str]:
    """Headers of a JSON request Keel makes itself (judges, embeddings, the memory model)."""
    return {"content-type": "application/json", **({"authorization": f"Bearer {api_key}"} if api_key else {})}


def header_pairs(raw: Iterable[tuple[bytes, bytes]]) -> list[tuple[str, str]]:
    """A client library's raw response headers as lower-cased (name, value) pairs, order and repeats kept."""
    return [(k.decode("latin-1").lower(), v.decode("latin-1")) for k, v in raw]


def timeout_error(host: str, phase: str) -> ProxyError:
    return UpstreamTimeoutError(f"upstream timeout: timed out {phase} {host}")


def unreachable(host: str) -> ProxyError:
    return UpstreamConnectError(f"upstream unreachable: connection to {host} refused or failed")


def reset(host: str) -> ProxyError:
    return UpstreamConnectError(f"upstream connection to {host} was reset or closed early", code="upstream_reset")


def origin(url: str) -> str:
    """scheme://host:port of a URL: the key of a connection pool."""
    return "/".join(url.split("/", 3)[:3])
