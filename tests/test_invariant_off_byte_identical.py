"""Invariant 1: with every feature off, bytes pass through Keel unchanged in both directions."""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx
import orjson
from conftest import CATALOGS, KEY, ServerThread, keel_config, needs_catalogs, tenant
from recorder import Recorder

# Odd spacing, key order and unicode: anything that re-serialized would change these bytes.
ODD_BODY = (
    b'{ "stream":false,"messages" : [ {"content":"h\\u00e9llo \xc3\xa9 \\ud83d\\ude00","role":"user"} ],'
    b' "model":"m", "temperature": 1.0e0, "zzz": {"b":1,"a":2} }'
)

def _start(start_keel: Callable[..., ServerThread], recorder: Recorder) -> tuple[ServerThread, ServerThread]:
    upstream = ServerThread(recorder).__enter__()
    return upstream, start_keel(keel_config(tenant(upstream.url + "/v1")))

def test_request_bytes_unchanged(start_keel: Callable[..., ServerThread]) -> None:
    """The upstream receives the client's body byte for byte, with the key substituted."""
    recorder = Recorder()
    upstream, keel = _start(start_keel, recorder)
    try:
        r = httpx.post(keel.url + "/v1/chat/completions", content=ODD_BODY,
                       headers={"authorization": f"Bearer {KEY}", "content-type": "application/json",
                                "x-request-id": "req-123"})
    finally:
        upstream.__exit__()
    assert r.status_code == 200
    (seen,) = recorder.received
    assert seen.body == ODD_BODY
    assert seen.path == "/v1/chat/completions"
    assert seen.headers["authorization"] == "Bearer sk-upstream-secret"
    assert seen.headers["x-request-id"] == "req-123" == r.headers["x-request-id"]
    assert KEY not in str(seen.headers)

def test_response_bytes_unchanged(start_keel: Callable[..., ServerThread]) -> None:
    """The client receives the upstream's body byte for byte (non-streaming)."""
    odd = b'{"id":"x",   "choices":[],"z":"\\u00e9","a":1}'
    recorder = Recorder(chunks=[odd[:10], odd[10:]])
    upstream, keel = _start(start_keel, recorder)
    try:
        r = httpx.post(keel.url + "/v1/chat/completions", content=b'{"messages":[]}',
                       headers={"authorization": f"Bearer {KEY}"})
    finally:
        upstream.__exit__()
    assert r.content == odd
    assert r.headers["x-upstream"] == "yes"

def test_stream_bytes_unchanged_and_not_buffered(start_keel: Callable[..., ServerThread]) -> None:
    """SSE bytes arrive unchanged, each chunk as the upstream sends it (no buffering)."""
    chunks = [b'data: {"a":1}\n\n', b'data: {"b" : 2}\n\n', b": keep-alive\n\n", b"data: [DONE]\n\n"]
    recorder = Recorder(content_type=b"text/event-stream", chunks=chunks, chunk_delay=0.3)
    upstream, keel = _start(start_keel, recorder)
    arrivals = []
    try:
        with httpx.stream("POST", keel.url + "/v1/chat/completions", content=b'{"stream":true,"messages":[]}',
                          headers={"authorization": f"Bearer {KEY}"}) as r:
            started = time.monotonic()
            received = b""
            for piece in r.iter_raw():
                received += piece
                arrivals.append(time.monotonic() - started)
    finally:
        upstream.__exit__()
    assert received == b"".join(chunks)
    assert arrivals[0] < 0.25, "the first chunk must not wait for the rest"
    assert len(arrivals) >= 3

@needs_catalogs
def test_large_real_tool_catalog_unchanged(start_keel: Callable[..., ServerThread]) -> None:
    """A 200-tool request from a real catalog passes through byte for byte."""
    tools = (CATALOGS / "agent_8servers.json").read_bytes()
    start = tools.index(b'"tools"')
    body = b'{"model":"m","messages":[{"role":"user","content":"hi"}],' + tools[start:].rstrip()[:-1].rstrip() + b"}"

    parsed = orjson.loads(body)  # still valid JSON (the catalog's trailing keys came along)
    assert len(parsed["tools"]) >= 200
    recorder = Recorder()
    upstream, keel = _start(start_keel, recorder)
    try:
        httpx.post(keel.url + "/v1/chat/completions", content=body, headers={"authorization": f"Bearer {KEY}"})
    finally:
        upstream.__exit__()
    assert recorder.received[0].body == body

def test_other_paths_forwarded_verbatim(start_keel: Callable[..., ServerThread]) -> None:
    """Any /v1/* path goes upstream with its method, query and body; hop-by-hop headers are dropped."""
    recorder = Recorder(chunks=[b'{"data":[]}'])
    upstream, keel = _start(start_keel, recorder)
    try:
        r = httpx.request("DELETE", keel.url + "/v1/files/file-1?purpose=x&a=%20b", content=b"raw-bytes",
                          headers={"authorization": f"Bearer {KEY}", "connection": "keep-alive",
                                   "openai-beta": "assistants=v2", "x-keel-user": "u1",
                                   "x-keel-memory": "off"})
    finally:
        upstream.__exit__()
    seen = recorder.received[0]
    assert (seen.method, seen.path, seen.query, seen.body) == ("DELETE", "/v1/files/file-1", b"purpose=x&a=%20b",
                                                                b"raw-bytes")
    assert seen.headers["openai-beta"] == "assistants=v2"
    assert "x-keel-user" not in seen.headers and "x-keel-memory" not in seen.headers
    assert r.content == b'{"data":[]}'
