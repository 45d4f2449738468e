"""Relaying: headers in both directions and the upstream's body back to the client.

The body goes back exactly as the upstream sent it (still content-encoded): read whole for
JSON, passed on chunk by chunk as it arrives for event streams and binary bodies. A stream
that breaks after its headers were sent ends with one SSE error event, never a hang.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from starlette.responses import Response, StreamingResponse

from proxy.errors import ProxyError, error_body

if TYPE_CHECKING:
    from proxy.accounting import CacheAccounting
from proxy.upstream import UpstreamResponse, header

log = logging.getLogger("keel.relay")

HOP_BY_HOP = frozenset(
    {
        "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "proxy-connection",
        "te", "trailer", "trailers", "transfer-encoding", "upgrade", "host", "content-length",
    }
)
# Headers that only mean something to Keel, or that the upstream must not see from the client.
_CLIENT_ONLY = frozenset({"authorization", "x-api-key", "x-keel-tenant", "x-keel-user", "x-keel-conversation",
                          "x-keel-timezone", "x-keel-memory"})


def upstream_headers(
    client: Mapping[str, str], authorization: str | None, extra: Mapping[str, str], request_id: str
) -> dict[str, str]:
    headers = {k: v for k, v in client.items() if k not in HOP_BY_HOP and k not in _CLIENT_ONLY}
    if authorization:
        headers["authorization"] = authorization
    headers.update(extra)
    headers["x-request-id"] = request_id
    return headers


def client_headers(upstream: UpstreamResponse, request_id: str) -> dict[str, str]:
    headers = {k: v for k, v in upstream.headers if k not in HOP_BY_HOP}
    headers["x-request-id"] = request_id
    return headers


def _streams(response: UpstreamResponse) -> bool:
    content_type = header(response, "content-type")
    return not content_type.startswith(("application/json", "text/plain", "text/html"))


@dataclass
class Outcome:
    """What one relayed response came to, for the access log and metrics."""

    status: int = 0
    bytes_out: int = 0
    error: str | None = None
    streamed: bool = False


async def relay(
    response: UpstreamResponse,
    request_id: str,
    on_done: Callable[[Outcome], None],
    extra_headers: Mapping[str, str] | None = None,
    accounting: CacheAccounting | None = None,
) -> Response:
    """`accounting` reads the upstream's usage from the body or the stream as it passes."""
    headers = client_headers(response, request_id)
    if extra_headers:
        headers.update(extra_headers)
    outcome = Outcome(status=response.status)
    if not _streams(response):
        body = await response.read()
        outcome.bytes_out = len(body)
        if accounting is not None and response.status == 200:
            headers.update(accounting.from_body(body))
        on_done(outcome)
        return Response(body, status_code=response.status, headers=headers)
    outcome.streamed = True
    is_sse = header(response, "content-type").startswith("text/event-stream")
    watch = accounting if is_sse and response.status == 200 else None
    return StreamingResponse(_stream(response, outcome, on_done, is_sse, watch), status_code=response.status,
                             headers=headers)


async def _stream(
    response: UpstreamResponse, outcome: Outcome, on_done: Callable[[Outcome], None], is_sse: bool,
    accounting: CacheAccounting | None = None,
) -> AsyncIterator[bytes]:
    try:
        async for chunk in response.iter_raw():
            outcome.bytes_out += len(chunk)
            if accounting is not None:
                accounting.watch(chunk)
            yield chunk
        if accounting is not None:
            accounting.finish()
    except ProxyError as exc:
        outcome.error = exc.code
        log.warning("upstream_stream_broken", extra={"error": exc.message})
        if is_sse:
            yield b"data: " + error_body(exc.message, exc.type, exc.code) + b"\n\n"
    except BaseException:  # the client went away: cancelled mid-stream
        outcome.error = "client_disconnected"
        raise
    finally:
        await response.aclose()
        on_done(outcome)
