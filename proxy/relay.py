"""Relaying: headers in both directions and the upstream's body back to the client.

The body goes back exactly as the upstream sent it (still content-encoded): read whole for
JSON up to `INSPECT_LIMIT` (so its usage can be accounted and headers set), passed on chunk
by chunk as it arrives for event streams, binary bodies and larger JSON. What Keel reads of it
(usage, a stream's end) it reads decoded (`proxy.encoding`). A plain stream that breaks after
its headers were sent ends with one SSE error event, never a hang; an encoded one cannot carry
a plain event, so its connection is cut, which the client's HTTP library reports.
"""

from __future__ import annotations

import logging
import re
from collections.abc import AsyncIterator, Callable, Mapping
from typing import TYPE_CHECKING

from starlette.responses import Response, StreamingResponse

from proxy.credentials import CREDENTIAL_HEADERS
from proxy.encoding import Decoder, ReplyEncodingError, coding, decode_all, is_encoded
from proxy.errors import ProxyError, UpstreamConnectError
from proxy.shapes.chat import CHAT

if TYPE_CHECKING:
    from proxy.accounting import CacheAccounting
    from proxy.shapes import Shape
from proxy.turn import Outcome
from proxy.upstream import UpstreamResponse, header

log = logging.getLogger("keel.relay")
INSPECT_LIMIT = 4 * 1024 * 1024  # bytes of a JSON reply Keel holds to read it; beyond, it streams through unread

HOP_BY_HOP = frozenset(
    {
        "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "proxy-connection",
        "te", "trailer", "trailers", "transfer-encoding", "upgrade", "host", "content-length",
    }
)
# Headers that only mean something to Keel, or that the upstream must not see from the client (its
# credentials go upstream only as the caller's `upstream_credentials`).
_CLIENT_ONLY = frozenset({*CREDENTIAL_HEADERS, "x-keel-tenant", "x-keel-user", "x-keel-conversation",
                          "x-keel-timezone", "x-keel-memory"})


def upstream_headers(client: Mapping[str, str], credentials: Mapping[str, str], extra: Mapping[str, str],
                     request_id: str) -> dict[str, str]:
    headers = {k: v for k, v in client.items() if k not in HOP_BY_HOP and k not in _CLIENT_ONLY}
    headers.update(credentials)
    headers.update(extra)
    headers["x-request-id"] = request_id
    return headers


def client_headers(upstream: UpstreamResponse, request_id: str) -> dict[str, str]:
    """The upstream's headers for the client. The provider's `x-request-id` stays (an SDK's error
    and a support ticket quote it); Keel's own id goes beside it as `x-keel-request-id`, and stands
    in as `x-request-id` only when the provider sent none."""
    headers = {k: v for k, v in upstream.headers if k not in HOP_BY_HOP}
    headers.setdefault("x-request-id", request_id)
    headers["x-keel-request-id"] = request_id
    return headers


def provider_request_id(upstream: UpstreamResponse) -> str | None:
    """The provider's id for one reply: OpenAI's `x-request-id`, Anthropic's `request-id`."""
    return header(upstream, "x-request-id") or header(upstream, "request-id") or None


def _streams(response: UpstreamResponse) -> bool:
    content_type = header(response, "content-type")
    return not content_type.startswith(("application/json", "text/plain", "text/html"))


async def relay(
    response: UpstreamResponse,
    request_id: str,
    on_done: Callable[[Outcome], None],
    extra_headers: Mapping[str, str] | None = None,
    accounting: CacheAccounting | None = None,
    shape: Shape = CHAT,
    expect_end: bool = False,
) -> Response:
    """`accounting` reads the upstream's usage from the body or the stream as it passes;
    `shape`: the API shape of the answer (its error events); `expect_end`: a stream of it must end
    with its end marker (`Shape.stream_end`), or it gets an error event: the answer was cut."""
    headers = client_headers(response, request_id)
    if extra_headers:
        headers.update(extra_headers)
    outcome = Outcome(status=response.status)
    prefix, rest = b"", None
    if not _streams(response):
        prefix, rest = await read_limited(response, INSPECT_LIMIT)
        if rest is None:
            outcome.bytes_out = len(prefix)
            if accounting is not None and response.status == 200:
                plain = _plain(response, prefix)
                if plain is not None:
                    headers.update(accounting.from_body(plain))
                    await accounting.settled()  # what was relayed is on record before the client has it
            on_done(outcome)
            return Response(prefix, status_code=response.status, headers=headers)
    outcome.streamed = True
    is_sse = header(response, "content-type").startswith("text/event-stream")
    watch = accounting if is_sse and response.status == 200 else None
    end = shape.stream_end if expect_end and is_sse and response.status == 200 else None
    reader = _Reader(response) if is_sse else None
    return StreamingResponse(_stream(response, outcome, on_done, is_sse, watch, prefix, rest, end, shape,
                                     reader), status_code=response.status, headers=headers)


def _plain(response: UpstreamResponse, body: bytes) -> bytes | None:
    """A whole body as the upstream meant it; None when it cannot be read (it is relayed as it came)."""
    if not is_encoded(response):
        return body
    try:
        return decode_all(body, coding(response))
    except ReplyEncodingError as exc:
        log.warning("upstream_reply_unreadable", extra={"error": exc.message})
        return None


class _Reader:
    """The relayed chunks as the upstream meant them, for what Keel reads of a stream it passes on."""

    def __init__(self, response: UpstreamResponse) -> None:
        self.encoded = is_encoded(response)
        self.readable = True
        self._decoder: Decoder | None = None
        if self.encoded:
            try:
                self._decoder = Decoder(coding(response))
            except ReplyEncodingError:
                self.readable = False

    def plain(self, chunk: bytes) -> bytes:
        if self._decoder is None:
            return chunk if self.readable else b""
        try:
            return self._decoder.feed(chunk)
        except ReplyEncodingError as exc:
            log.warning("upstream_reply_unreadable", extra={"error": exc.message})
            self._decoder, self.readable = None, False
            return b""


def relay_rest(response: UpstreamResponse, prefix: bytes, rest: AsyncIterator[bytes], headers: Mapping[str, str],
               on_done: Callable[[Outcome], None]) -> Response:
    """A body already partly read (`read_limited` ran out of room): the part, then the rest as it comes."""
    outcome = Outcome(status=response.status, streamed=True)
    return StreamingResponse(_stream(response, outcome, on_done, False, None, prefix, rest),
                             status_code=response.status, headers=headers)


async def read_limited(response: UpstreamResponse, limit: int) -> tuple[bytes, AsyncIterator[bytes] | None]:
    """The whole body when it fits in `limit` (and None); else what was read, and the rest to stream."""
    chunks: list[bytes] = []
    size = 0
    body = response.iter_raw()
    try:
        async for chunk in body:
            chunks.append(chunk)
            size += len(chunk)
            if size > limit:
                return b"".join(chunks), body
    except BaseException:
        await response.aclose()
        raise
    await response.aclose()
    return b"".join(chunks), None


async def _stream(
    response: UpstreamResponse, outcome: Outcome, on_done: Callable[[Outcome], None], is_sse: bool,
    accounting: CacheAccounting | None = None, prefix: bytes = b"", rest: AsyncIterator[bytes] | None = None,
    stream_end: re.Pattern[bytes] | None = None, shape: Shape = CHAT, reader: _Reader | None = None,
) -> AsyncIterator[bytes]:
    tail = b""  # the newest decoded bytes: where the end marker and an error event are looked for
    ended = False  # the stream's end marker went by (it may sit far from the last bytes: a big last event)
    encoded = reader is not None and reader.encoded
    try:
        if prefix:  # what was read before the body turned out too large to hold
            outcome.bytes_out += len(prefix)
            yield prefix
        async for chunk in rest if rest is not None else response.iter_raw():
            outcome.bytes_out += len(chunk)
            if reader is not None and chunk:
                plain = reader.plain(chunk)
                if accounting is not None and plain:
                    accounting.watch(plain)
                    if accounting.ended:  # the answer is whole: on record before its end goes out
                        accounting.finish()
                        await accounting.settled()
                if is_sse and plain:
                    if stream_end is not None and not ended:
                        ended = bool(stream_end.search(tail[-64:] + plain))
                    tail = (tail + plain)[-256:]
            yield chunk
        if reader is not None and not reader.readable:
            return  # nothing more can be said of a stream Keel could not read
        if accounting is not None:
            accounting.finish()
        if stream_end is not None and not ended and b'"error"' not in tail:
            raise UpstreamConnectError("the upstream's stream ended before its end marker: the answer may be cut short",
                                       code="upstream_stream_incomplete")
    except ProxyError as exc:
        outcome.error = exc.code
        log.warning("upstream_stream_broken", extra={"error": exc.message})
        if encoded:  # a plain event inside an encoded body would be garbage: cut the connection instead
            raise
        if is_sse:  # after a blank line, so that a half-sent event cannot swallow it
            separator = b"\n\n" if tail and not tail.endswith((b"\n\n", b"\r\n\r\n")) else b""
            yield separator + shape.error_event(exc)
    except BaseException:  # the client went away: cancelled mid-stream
        outcome.error = "client_disconnected"
        raise
    finally:
        await response.aclose()
        on_done(outcome)
