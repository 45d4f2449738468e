"""proxy/relay.py on its own: headers both ways, a body passed on as the upstream sent it, and a
stream that breaks or stops short ended with one error event (never a hang, never silence)."""

from __future__ import annotations

import asyncio
import gzip
from collections.abc import AsyncIterator

import pytest
from starlette.responses import Response

from proxy.errors import UpstreamConnectError
from proxy.relay import (
    HOP_BY_HOP,
    Outcome,
    client_headers,
    provider_request_id,
    read_limited,
    relay,
    upstream_headers,
)
from proxy.shapes.messages import MESSAGES


class FakeUpstream:
    """An upstream reply made of chunks; `fail` raises a broken connection after them, `hold`
    waits forever after them (a client that goes away meanwhile cancels the relay)."""

    def __init__(self, chunks: list[bytes], content_type: str = "application/json", *, fail: bool = False,
                 hold: bool = False, status: int = 200, headers: list[tuple[str, str]] | None = None) -> None:
        self.status = status
        self.headers = [("content-type", content_type), *(headers or [])]
        self.chunks, self.fail, self.hold = chunks, fail, hold
        self.closed = 0

    async def iter_raw(self) -> AsyncIterator[bytes]:
        for chunk in self.chunks:
            yield chunk
        if self.hold:
            await asyncio.Event().wait()
        if self.fail:
            raise UpstreamConnectError("reset", code="upstream_reset")

    async def read(self) -> bytes:
        return b"".join(self.chunks)

    async def aclose(self) -> None:
        self.closed += 1


async def body_of(response: Response) -> bytes:
    iterator = getattr(response, "body_iterator", None)
    if iterator is not None:
        return b"".join([c async for c in iterator])
    return bytes(response.body)


async def relayed(upstream: FakeUpstream, **kwargs: object) -> tuple[Response, bytes, list[Outcome]]:
    outcomes: list[Outcome] = []
    response = await relay(upstream, "rid", outcomes.append, **kwargs)  # type: ignore[arg-type]
    return response, await body_of(response), outcomes


# --- headers ---------------------------------------------------------------------------------------


async def test_json_passes_whole_without_hop_by_hop_headers() -> None:
    upstream = FakeUpstream([b'{"ok":', b" true}"], headers=[
        ("x-request-id", "up-1"), ("connection", "close"), ("keep-alive", "timeout=5"),
        ("transfer-encoding", "chunked"), ("content-length", "999"), ("x-ratelimit-remaining", "7")])
    response, body, outcomes = await relayed(upstream)
    assert body == b'{"ok": true}'
    assert not {"connection", "keep-alive", "transfer-encoding"} & set(response.headers)
    assert response.headers["content-length"] == "12", "the length of what is sent, not the upstream's"
    assert response.headers["x-ratelimit-remaining"] == "7", "end-to-end headers pass"
    assert response.headers["x-request-id"] == "up-1" and response.headers["x-keel-request-id"] == "rid"
    assert outcomes == [Outcome(status=200, bytes_out=12)] and upstream.closed


def test_keels_request_id_stands_in_only_when_the_provider_sent_none() -> None:
    assert client_headers(FakeUpstream([]), "rid")["x-request-id"] == "rid"  # type: ignore[arg-type]
    anthropic = FakeUpstream([], headers=[("request-id", "req_1")])
    assert provider_request_id(anthropic) == "req_1"  # type: ignore[arg-type]
    assert provider_request_id(FakeUpstream([])) is None  # type: ignore[arg-type]


def test_upstream_headers_carry_the_callers_credentials_not_the_clients() -> None:
    """Hop-by-hop headers, the client's own credential headers and Keel's x-keel-* never go upstream;
    the caller's upstream credentials and Keel's request id do."""
    client = {"authorization": "Bearer sk-keel-x", "x-api-key": "sk-keel-x", "api-key": "sk-keel-x",
              "connection": "keep-alive", "host": "keel", "content-length": "5", "te": "trailers",
              "x-keel-tenant": "acme", "x-keel-user": "u", "x-keel-conversation": "c", "x-keel-memory": "off",
              "x-keel-timezone": "UTC", "openai-beta": "assistants=v2", "x-request-id": "client-id"}
    sent = upstream_headers(client, {"authorization": "Bearer sk-provider"}, {"x-extra": "1"}, "rid")
    assert sent == {"openai-beta": "assistants=v2", "authorization": "Bearer sk-provider", "x-extra": "1",
                    "x-request-id": "rid"}
    assert {"connection", "host", "content-length", "te", "transfer-encoding"} <= HOP_BY_HOP


# --- whole bodies ----------------------------------------------------------------------------------


async def test_an_error_status_is_relayed_as_sent() -> None:
    response, body, outcomes = await relayed(FakeUpstream([b'{"error":{"message":"no"}}'], status=429))
    assert response.status_code == 429 and body == b'{"error":{"message":"no"}}' and outcomes[0].status == 429


async def test_read_limited_holds_a_body_that_fits_and_streams_one_that_does_not() -> None:
    small = FakeUpstream([b"ab", b"cd"])
    assert await read_limited(small, 4) == (b"abcd", None) and small.closed  # type: ignore[arg-type]
    large = FakeUpstream([b"ab", b"cd", b"ef", b"gh"])
    prefix, rest = await read_limited(large, 3)  # type: ignore[arg-type]
    assert prefix == b"abcd" and rest is not None and not large.closed, "the rest is still to come"
    assert b"".join([c async for c in rest]) == b"efgh"


async def test_a_body_that_breaks_while_held_closes_the_upstream_and_raises() -> None:
    upstream = FakeUpstream([b'{"partial'], fail=True)
    with pytest.raises(UpstreamConnectError):
        await relay(upstream, "rid", lambda _: None)  # type: ignore[arg-type]
    assert upstream.closed


# --- streams ---------------------------------------------------------------------------------------


async def test_an_event_stream_passes_chunk_by_chunk_and_unchanged() -> None:
    chunks = [b'data: {"x":1}\n\n', b'data: {"y":2}\n', b"\ndata: [DONE]\n\n"]
    response, body, outcomes = await relayed(FakeUpstream(chunks, "text/event-stream"), expect_end=True)
    assert body == b"".join(chunks) and "content-length" not in response.headers
    assert outcomes == [Outcome(status=200, bytes_out=len(body), streamed=True)]


async def test_a_broken_stream_ends_with_one_error_event_after_a_blank_line() -> None:
    """Broken in the middle of an event: a blank line first, so the half-sent event cannot swallow the error."""
    upstream = FakeUpstream([b'data: {"x":1}\n\n', b'data: {"y"'], "text/event-stream", fail=True)
    _, body, outcomes = await relayed(upstream, expect_end=True)
    assert body.startswith(b'data: {"x":1}\n\ndata: {"y"\n\ndata: {"error"') and body.count(b'"error"') == 1
    assert outcomes[0].error == "upstream_reset" and upstream.closed == 1 and len(outcomes) == 1


async def test_a_stream_broken_between_events_gets_no_extra_blank_line() -> None:
    upstream = FakeUpstream([b'data: {"x":1}\r\n\r\n'], "text/event-stream", fail=True)
    _, body, _ = await relayed(upstream)
    assert body.startswith(b'data: {"x":1}\r\n\r\ndata: {"error"')


async def test_the_error_event_speaks_the_answers_shape() -> None:
    upstream = FakeUpstream([b"event: message_start\ndata: {}\n\n"], "text/event-stream", fail=True)
    _, body, _ = await relayed(upstream, shape=MESSAGES)
    assert b"event: error" in body and b'"type":"error"' in body.replace(b" ", b"")


async def test_a_stream_cut_before_its_end_marker_is_reported() -> None:
    _, body, outcomes = await relayed(FakeUpstream([b'data: {"x":1}\n\n'], "text/event-stream"), expect_end=True)
    assert b"upstream_stream_incomplete" in body and outcomes[0].error == "upstream_stream_incomplete"
    _, whole, outcomes = await relayed(FakeUpstream([b'data: {"x":1}\n\n', b"data: [DONE]\n\n"], "text/event-stream"),
                                       expect_end=True)
    assert b"error" not in whole and outcomes[0].error is None


async def test_an_end_marker_split_across_chunks_counts() -> None:
    chunks = [b'data: {"x":1}\n\ndata: [DO', b"NE]\n\n"]
    _, body, _ = await relayed(FakeUpstream(chunks, "text/event-stream"), expect_end=True)
    assert body == b"".join(chunks)


async def test_a_stream_the_upstream_ended_with_its_own_error_gets_no_second() -> None:
    chunks = [b'data: {"x":1}\n\n', b'data: {"error": {"message": "overloaded"}}\n\n']
    _, body, _ = await relayed(FakeUpstream(chunks, "text/event-stream"), expect_end=True)
    assert body == b"".join(chunks)


async def test_a_non_200_stream_is_not_held_to_an_end_marker() -> None:
    _, body, _ = await relayed(FakeUpstream([b"data: nope\n\n"], "text/event-stream", status=500), expect_end=True)
    assert body == b"data: nope\n\n"


async def test_a_compressed_stream_that_breaks_is_cut_not_given_a_plain_event() -> None:
    """A plain error event inside a gzip body would be garbage to the client's decoder: the
    connection is cut instead, which the client's HTTP library reports."""
    packed = gzip.compress(b'data: {"x":1}\n\n')
    upstream = FakeUpstream([packed[:10]], "text/event-stream", fail=True, headers=[("content-encoding", "gzip")])
    outcomes: list[Outcome] = []
    response = await relay(upstream, "rid", outcomes.append, expect_end=True)  # type: ignore[arg-type]
    seen: list[bytes] = []
    with pytest.raises(UpstreamConnectError):
        async for chunk in response.body_iterator:  # type: ignore[attr-defined]
            seen.append(chunk)
    assert seen == [packed[:10]] and outcomes[0].error == "upstream_reset" and upstream.closed


async def test_a_compressed_stream_is_relayed_still_compressed() -> None:
    packed = gzip.compress(b'data: {"x":1}\n\ndata: [DONE]\n\n')
    upstream = FakeUpstream([packed[:7], packed[7:]], "text/event-stream", headers=[("content-encoding", "gzip")])
    response, body, outcomes = await relayed(upstream, expect_end=True)
    assert body == packed and response.headers["content-encoding"] == "gzip" and outcomes[0].error is None


async def test_a_client_that_goes_away_mid_stream_closes_the_upstream() -> None:
    upstream = FakeUpstream([b'data: {"x":1}\n\n'], "text/event-stream", hold=True)
    outcomes: list[Outcome] = []
    response = await relay(upstream, "rid", outcomes.append)  # type: ignore[arg-type]
    iterator = response.body_iterator  # type: ignore[attr-defined]
    assert await iterator.__anext__() == b'data: {"x":1}\n\n'
    waiting = asyncio.ensure_future(iterator.__anext__())
    await asyncio.sleep(0)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert outcomes == [Outcome(status=200, bytes_out=15, error="client_disconnected", streamed=True)]
    assert upstream.closed
