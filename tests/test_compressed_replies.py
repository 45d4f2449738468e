"""A provider that gzips its replies (as one behind a CDN does when the SDK asks): Keel reads
what the provider meant on every shape, JSON and SSE, and what the client gets is correctly
encoded and labelled. Real SDKs → Keel → the stand-in with `gzip=True`."""

from __future__ import annotations

import gzip
import zlib
from collections.abc import Callable, Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest
from conftest import KEY, ServerThread, keel_config, small_catalog, tenant
from recorder import Recorder
from test_shapes_e2e import ON, TEXT, WANTED, messages_tools, responses_tools

from proxy.encoding import BOMB_FLOOR, Decoder, ReplyEncodingError, accept_encoding, decode_all
from proxy.standin.app import StandIn, create_standin_app
from proxy.tokens import TokenCounter


@pytest.fixture
def gzip_standin(token_counter: TokenCounter) -> Iterator[ServerThread]:
    with ServerThread(create_standin_app(standin=StandIn(tokens=token_counter), gzip=True)) as server:
        yield server


@pytest.fixture
def keel_gzip(gzip_standin: ServerThread, start_keel: Callable[..., ServerThread]) -> ServerThread:
    return start_keel(keel_config(tenant(gzip_standin.url + "/v1", **ON)))


def _headers(gzip_standin: ServerThread) -> list[dict[str, str]]:
    return list(gzip_standin.app.state.standin.headers)


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_chat_search_through_a_gzipping_provider(keel_gzip: ServerThread, gzip_standin: ServerThread,
                                                 stream: bool) -> None:
    """The SDK asks for gzip, the provider gzips the model's tool_search call: the client still
    gets only its own tool's call (never tool_search), and Keel read the usage (x-keel-cache)."""
    client = openai.OpenAI(base_url=keel_gzip.url + "/v1", api_key=KEY, max_retries=0)
    request: dict[str, Any] = dict(model="gpt-4o-mini", tools=small_catalog(),
                                   messages=[{"role": "user", "content": TEXT}])
    if stream:
        chunks = list(client.chat.completions.create(**request, stream=True,
                                                     stream_options={"include_usage": True}))
        names = [c.function.name for chunk in chunks for choice in chunk.choices
                 for c in choice.delta.tool_calls or [] if c.function and c.function.name]
        assert chunks[-1].usage is not None and chunks[-1].usage.prompt_tokens > 0, "usage summed over both calls"
    else:
        raw = client.chat.completions.with_raw_response.create(**request)
        names = [c.function.name for c in raw.parse().choices[0].message.tool_calls or []]
        assert raw.headers.get("x-keel-cache"), "the usage of a compressed reply was read"
    assert names == [WANTED]
    assert "gzip" in _headers(gzip_standin)[-1].get("accept-encoding", ""), "the provider was asked for gzip"
    assert len(gzip_standin.app.state.standin.requests) == 2, "Keel answered the search and called again"


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_responses_search_through_a_gzipping_provider(keel_gzip: ServerThread, stream: bool) -> None:
    client = openai.OpenAI(base_url=keel_gzip.url + "/v1", api_key=KEY, max_retries=0)
    if stream:
        with client.responses.stream(model="m", input=TEXT, tools=responses_tools(), store=False) as events:
            kinds = [event.type for event in events]
            final = events.get_final_response()
        assert kinds[-1] == "response.completed"
    else:
        final = client.responses.create(model="m", input=TEXT, tools=responses_tools(), store=False)
    assert [(item.type, getattr(item, "name", None)) for item in final.output] == [("function_call", WANTED)]
    assert final.usage is not None and final.usage.input_tokens > 0


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_messages_search_through_a_gzipping_provider(keel_gzip: ServerThread, stream: bool) -> None:
    client = anthropic.Anthropic(base_url=keel_gzip.url, api_key=KEY, max_retries=0)
    request: dict[str, Any] = dict(model="claude", max_tokens=200, system="You run a help desk.",
                                   tools=messages_tools(), messages=[{"role": "user", "content": TEXT}])
    if stream:
        with client.messages.stream(**request) as events:
            final = events.get_final_message()
    else:
        final = client.messages.create(**request)
    assert [(b.type, getattr(b, "name", None)) for b in final.content] == [("tool_use", WANTED)]


def test_a_relayed_gzip_stream_keeps_its_encoding_and_is_read(keel_gzip: ServerThread) -> None:
    """A turn with nothing to search is relayed as the provider sent it (still gzip, labelled so),
    and Keel still reads its end marker (no error appended) and its usage."""
    with httpx.stream("POST", keel_gzip.url + "/v1/chat/completions", headers={
            "authorization": f"Bearer {KEY}", "accept-encoding": "gzip"},
            json={"model": "m", "stream": True, "stream_options": {"include_usage": True},
                  "messages": [{"role": "user", "content": "say something"}]}) as response:
        raw = b"".join(response.iter_raw())
        encoding = response.headers.get("content-encoding")
    assert encoding == "gzip"
    text = gzip.decompress(raw)
    assert text.rstrip().endswith(b"data: [DONE]") and b'"error"' not in text


def test_only_codings_keel_reads_are_asked_for(keel_gzip: ServerThread, gzip_standin: ServerThread) -> None:
    """A client that accepts brotli and zstd: the provider is asked only for what Keel decodes."""
    httpx.post(keel_gzip.url + "/v1/chat/completions", headers={
        "authorization": f"Bearer {KEY}", "accept-encoding": "br, zstd, gzip;q=0.5"},
        json={"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    assert _headers(gzip_standin)[-1]["accept-encoding"] == "gzip;q=0.5"
    assert accept_encoding("br, zstd") == "identity"


def test_a_reply_that_does_not_decode(start_keel: Callable[..., ServerThread]) -> None:
    """A body labelled gzip that is not gzip. Relayed: byte for byte as it came, labelled as it
    came, with no usage read from it (the client's library reports it). Where Keel must read it to
    answer (a deferred catalog, so tool_search may be in it): a 502 in the shape, never a 500."""
    recorder = Recorder(chunks=[b"not gzip at all"])
    with ServerThread(_labelled(recorder, [(b"content-encoding", b"gzip")])) as upstream:
        keel = start_keel(keel_config(tenant(upstream.url + "/v1", **ON)))
        headers = {"authorization": f"Bearer {KEY}", "accept-encoding": "gzip"}
        with httpx.stream("POST", keel.url + "/v1/chat/completions", headers=headers,
                          json={"model": "m", "messages": [{"role": "user", "content": "hi"}]}) as relayed:
            raw = b"".join(relayed.iter_raw())
        searched = httpx.post(keel.url + "/v1/chat/completions", headers=headers,
                              json={"model": "m", "tools": small_catalog(), "messages": [{"role": "user", "content": "hi"}]})
    assert relayed.status_code == 200 and raw == b"not gzip at all"
    assert relayed.headers["content-encoding"] == "gzip" and "x-keel-cache" not in relayed.headers
    assert searched.status_code == 502 and searched.json()["error"]["code"] == "upstream_bad_encoding"


def _labelled(app: Recorder, extra: list[tuple[bytes, bytes]]) -> Any:
    async def labelled(scope: dict[str, Any], receive: Any, send: Any) -> None:
        async def with_headers(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message["headers"], *extra]}
            await send(message)

        await app(scope, receive, with_headers)

    return labelled


def test_a_decompression_bomb_is_refused() -> None:
    """Past 16 MiB a reply may not inflate more than 200:1: a bomb is refused a piece at a time,
    never inflated whole; a real answer of the same size decodes."""
    bomb = gzip.compress(b"\0" * (BOMB_FLOOR * 4))
    assert len(bomb) < BOMB_FLOOR // 200
    with pytest.raises(ReplyEncodingError):
        decode_all(bomb, "gzip")
    honest = b"x" * 1000
    assert decode_all(gzip.compress(honest), "gzip") == honest


def test_deflate_with_and_without_its_header_and_gzip_members() -> None:
    """deflate as the RFC says (zlib-wrapped) and as some servers send it (raw); two gzip
    members one after the other; a coding Keel does not read is refused by name."""
    text = b'{"usage": {"prompt_tokens": 3}}'
    assert decode_all(zlib.compress(text), "deflate") == text
    packer = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    assert decode_all(packer.compress(text) + packer.flush(), "deflate") == text
    assert decode_all(gzip.compress(text[:10]) + gzip.compress(text[10:]), "gzip") == text
    decoder = Decoder("gzip")
    packed = gzip.compress(text)
    assert b"".join(decoder.feed(packed[i:i + 3]) for i in range(0, len(packed), 3)) + decoder.flush() == text
    with pytest.raises(ReplyEncodingError, match="br"):
        Decoder("br")


def test_every_coding_applied_comes_off_and_a_cut_body_is_an_error() -> None:
    """`gzip, gzip` (compressed twice), identity beside gzip, bytes after the last member that are
    no member, an empty body: read as meant. A body cut short is an error, never a shorter answer."""
    text = b'{"choices": [{"message": {"content": "whole"}}]}'
    twice = gzip.compress(gzip.compress(text))
    assert decode_all(twice, "gzip, gzip") == text
    assert decode_all(gzip.compress(text), "identity, gzip") == text == decode_all(gzip.compress(text), "gzip, identity")
    assert decode_all(zlib.compress(gzip.compress(text)), "gzip, deflate") == text
    assert decode_all(gzip.compress(text) + b"\r\n", "gzip") == text
    assert decode_all(b"", "gzip") == b""
    with pytest.raises(ReplyEncodingError, match="cut short"):
        decode_all(gzip.compress(text)[:-9], "gzip")


def test_a_cut_gzip_answer_never_reaches_the_client_as_a_shorter_one(
        start_keel: Callable[..., ServerThread]) -> None:
    """A provider's gzipped answer cut short while Keel must read it (a deferred catalog): a 502
    in the shape, not a 200 with part of the answer (or Keel's own tool_search call) in it."""
    whole = gzip.compress(b'{"id":"c","object":"chat.completion","choices":[{"index":0,"finish_reason":"tool_calls",'
                          b'"message":{"role":"assistant","content":null,"tool_calls":[{"id":"call_1",'
                          b'"type":"function","function":{"name":"tool_search","arguments":"{}"}}]}}]}')
    recorder = Recorder(chunks=[whole[:-12]])
    with ServerThread(_labelled(recorder, [(b"content-encoding", b"gzip")])) as upstream:
        keel = start_keel(keel_config(tenant(upstream.url + "/v1", **ON)))
        reply = httpx.post(keel.url + "/v1/chat/completions", headers={"authorization": f"Bearer {KEY}"},
                           json={"model": "m", "tools": small_catalog(), "messages": [{"role": "user", "content": "hi"}]})
    assert reply.status_code == 502 and "tool_search" not in reply.text
