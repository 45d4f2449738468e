"""Relaying: headers in both directions, the upstream's body back to the client, and the one
writer of every answer a client gets (`Writer`).

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
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from starlette.responses import Response, StreamingResponse

from proxy.credentials import CREDENTIAL_HEADERS
from proxy.encoding import Decoder, ReplyEncodingError, coding, decode_all, is_encoded
from proxy.errors import ProxyError, UpstreamConnectError
from proxy.shapes.chat import CHAT
from proxy.upstream import UpstreamResponse, header

if TYPE_CHECKING:
    from prometheus_client import Gauge

    from proxy.shapes import Shape

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


@dataclass
class Outcome:
    """What one response came to, for the access log and metrics."""

    status: int = 0
    bytes_out: int = 0
    error: str | None = None
    streamed: bool = False


class Watch(Protocol):
    """What reads the upstream's usage from a relayed answer as it passes (`proxy.accounting`)."""

    ended: bool  # the answer's last event has been read whole

    def from_body(self, body: bytes) -> Mapping[str, str]: ...

    def watch(self, chunk: bytes) -> None: ...

    def finish(self) -> None: ...

    async def settled(self) -> None: ...


class Writer:
    """The one writer of what a client gets for a request: every answer, relayed from the upstream
    or Keel's own (a round loop's, a cached one, an error), whole or streamed, goes out here. Each
    is reported once, when its last byte is out (`done`); a stream counts among the open ones
    while it runs, and one that breaks ends with one error event in the client's API shape."""

    def __init__(self, request_id: str, done: Callable[[Outcome], None], shape: Shape = CHAT,
                 streams_open: Gauge | None = None) -> None:
        self.request_id = request_id
        self.shape = shape
        self._done = [done]
        self._streams_open = streams_open

    def then(self, after: Callable[[], None]) -> None:
        """Run `after` once the response is reported (the savings meter's turn ends there)."""
        self._done.append(lambda outcome: after())

    def _report(self, outcome: Outcome) -> None:
        for done in self._done:
            done(outcome)

    def whole(self, body: bytes, status: int, headers: Mapping[str, str] | None = None,
              media_type: str | None = None) -> Response:
        self._report(Outcome(status=status, bytes_out=len(body)))
        return Response(body, status_code=status, headers=headers, media_type=media_type)

    def error(self, exc: ProxyError) -> Response:
        """A request Keel refuses or cannot complete: the error in the client's API shape."""
        self._report(Outcome(status=exc.status, error=exc.code))
        return error_response(exc, self.request_id, self.shape)

    def stream(self, chunks: AsyncIterator[bytes], status: int, headers: Mapping[str, str], *,
               events: bool = True, encoded: bool = False) -> StreamingResponse:
        """`chunks` as they come. A `ProxyError` they raise ends an event stream (`events`) with
        one error event; an encoded body cannot carry a plain event, so its connection is cut
        (the client's HTTP library reports it); any other body just ends there."""
        outcome = Outcome(status=status, streamed=True)
        if self._streams_open is not None:
            self._streams_open.inc()  # the body (and with it the matching dec) starts once returned
        return StreamingResponse(self._written(chunks, outcome, events, encoded), status_code=status,
                                 headers=headers)

    async def _written(self, chunks: AsyncIterator[bytes], outcome: Outcome, events: bool,
                       encoded: bool) -> AsyncIterator[bytes]:
        last = b""  # the newest bytes out: an error event must start after a blank line
        try:
            async for chunk in chunks:
                outcome.bytes_out += len(chunk)
                last = (last + chunk)[-4:]
                yield chunk
        except ProxyError as exc:
            outcome.error = exc.code
            log.warning("stream_broken", extra={"request_id": self.request_id, "error": exc.message})
            if encoded:
                raise
            if events:  # after a blank line, so that a half-sent event cannot swallow it
                separator = b"\n\n" if last and not last.endswith((b"\n\n", b"\r\n\r\n")) else b""
                yield separator + self.shape.error_event(exc)
        except BaseException:  # the client went away: cancelled mid-stream
            outcome.error = "client_disconnected"
            raise
        finally:
            try:
                if isinstance(chunks, AsyncGenerator):  # closed now, not by the collector, when the client left early
                    await chunks.aclose()
            finally:  # counted and reported even if closing the body fails
                if self._streams_open is not None:
                    self._streams_open.dec()
                self._report(outcome)

    async def relay(self, response: UpstreamResponse, extra_headers: Mapping[str, str] | None = None,
                    accounting: Watch | None = None, expect_end: bool = False) -> Response:
        """The upstream's reply as it came (still content-encoded): JSON read whole up to
        `INSPECT_LIMIT`, anything else chunk by chunk. `accounting` reads its usage from the body
        or the stream as it passes; `expect_end`: a stream must end with its shape's end marker
        (`Shape.stream_end`), else it gets an error event: the answer was cut."""
        try:
            headers = client_headers(response, self.request_id)
            if extra_headers:
                headers.update(extra_headers)
            prefix, rest = b"", None
            if not _streams(response):
                prefix, rest = await read_limited(response, INSPECT_LIMIT)
                if rest is None:
                    if accounting is not None and response.status == 200:
                        plain = _plain(response, prefix)
                        if plain is not None:
                            headers.update(accounting.from_body(plain))
                            await accounting.settled()  # what was relayed is on record before the client has it
                    return self.whole(prefix, response.status, headers)
            is_sse = header(response, "content-type").startswith("text/event-stream")
            watch = accounting if is_sse and response.status == 200 else None
            end = self.shape.stream_end if expect_end and is_sse and response.status == 200 else None
            reader = _Reader(response) if is_sse else None
            return self.stream(_relayed(response, watch, prefix, rest, end, reader), response.status, headers,
                               events=is_sse, encoded=reader is not None and reader.encoded)
        except BaseException:
            await response.aclose()
            raise

    def rest(self, response: UpstreamResponse, prefix: bytes, rest: AsyncIterator[bytes],
             headers: Mapping[str, str]) -> Response:
        """A body already partly read (`read_limited` ran out of room): the part, then the rest as it comes."""
        return self.stream(_relayed(response, None, prefix, rest), response.status, headers, events=False)


async def relay(response: UpstreamResponse, request_id: str, on_done: Callable[[Outcome], None],
                extra_headers: Mapping[str, str] | None = None, accounting: Watch | None = None,
                shape: Shape = CHAT, expect_end: bool = False) -> Response:
    """One reply relayed by a writer of its own (`Writer.relay`)."""
    return await Writer(request_id, on_done, shape).relay(response, extra_headers, accounting, expect_end)


def error_response(exc: ProxyError, rid: str | None = None, shape: Shape = CHAT) -> Response:
    """An error in an API shape's JSON (OpenAI's unless `shape` says otherwise), with Keel's request id."""
    headers = {"x-request-id": rid, "x-keel-request-id": rid} if rid else None
    return Response(shape.error_body(exc), status_code=exc.status, media_type="application/json", headers=headers)


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


async def _relayed(
    response: UpstreamResponse, accounting: Watch | None = None, prefix: bytes = b"",
    rest: AsyncIterator[bytes] | None = None, stream_end: re.Pattern[bytes] | None = None, reader: _Reader | None = None,
) -> AsyncIterator[bytes]:
    """The upstream's body as it comes (after `prefix`, what was read of it already), its usage
    watched as it passes; raises `UpstreamConnectError` for a stream that ends before its end
    marker (the writer turns it into an error event)."""
    tail = b""  # the newest decoded bytes: where the end marker and an error event are looked for
    ended = False  # the stream's end marker went by (it may sit far from the last bytes: a big last event)
    try:
        if prefix:  # what was read before the body turned out too large to hold
            yield prefix
        async for chunk in rest if rest is not None else response.iter_raw():
            if reader is not None and chunk:
                plain = reader.plain(chunk)
                if accounting is not None and plain:
                    accounting.watch(plain)
                    if accounting.ended:  # the answer is whole: on record before its end goes out
                        accounting.finish()
                        await accounting.settled()
                if plain and stream_end is not None and not ended:
                    ended = bool(stream_end.search(tail[-64:] + plain))
                tail = (tail + plain)[-256:] if plain else tail
            yield chunk
        if reader is not None and not reader.readable:
            return  # nothing more can be said of a stream Keel could not read
        if accounting is not None:
            accounting.finish()
        if stream_end is not None and not ended and b'"error"' not in tail:
            raise UpstreamConnectError("the upstream's stream ended before its end marker: the answer may be cut short",
                                       code="upstream_stream_incomplete")
    finally:
        await response.aclose()
