"""Invariant 7: with features on, what Keel forwards keeps the client's key order, number text,
unknown fields and unicode; only what a planner means to change differs."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import httpx
import orjson
import pytest
from conftest import KEY, ServerThread, keel_config, tenant, tool
from recorder import Recorder

from proxy import jsontext

REPLY = (b'{"id":"c1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant",'
         b'"content":"ok"},"finish_reason":"stop"}]}')
FEATURES = {"tools": {"enabled": True}, "context": {"stable": True},
            "cache": {"prompt_cache_key": "auto", "breakpoints": "auto"}}


@pytest.fixture
def upstream() -> Iterator[tuple[Recorder, ServerThread]]:
    recorder = Recorder(chunks=[REPLY])
    with ServerThread(recorder) as server:
        yield recorder, server


@pytest.fixture
def keel_on(upstream: tuple[Recorder, ServerThread], start_keel: Callable[..., ServerThread]) -> ServerThread:
    return start_keel(keel_config(tenant(upstream[1].url + "/v1", **FEATURES)))


def catalog() -> list[dict[str, Any]]:
    """Fourteen tools: enough to be deferred; `lookup_order` has properties in a meaningful order."""
    tools = [tool(f"tool_{i:02d}", f"does thing number {i} with a long enough description to be deferred", x="string")
             for i in range(13)]
    tools.append({"type": "function", "function": {
        "name": "lookup_order", "description": "Look up an order by id and explain the status in detail for the user",
        "parameters": {"type": "object", "properties": {"zeta": {"type": "string"}, "alpha": {"type": "integer",
                       "maximum": "<1e400>", "multipleOf": "<1.50>"}, "mid": {"type": "number"}},
                       "required": ["zeta"], "x-vendor": {"b": 1, "a": 2}}}})
    return tools


def send(keel: ServerThread, raw: bytes) -> httpx.Response:
    return httpx.post(keel.url + "/v1/chat/completions", content=raw, timeout=30,
                      headers={"authorization": f"Bearer {KEY}", "content-type": "application/json"})


def forwarded(recorder: Recorder) -> bytes:
    return recorder.received[-1].body


def numbers(raw: bytes) -> bytes:
    """Numbers Python cannot write as the test wants them written, put in as text."""
    return raw.replace(b'"<1e400>"', b"1e400").replace(b'"<1.50>"', b"1.50")


def body_bytes(**extra: Any) -> bytes:
    body = {"model": "m", "tools": catalog(),
            "messages": [{"role": "system", "content": "You are terse."},
                         {"role": "user", "content": "please use lookup_order for order 7"}], **extra}
    return numbers(jsontext.dumps(body))


def test_response_format_schema_keeps_property_order(keel_on: ServerThread, upstream: Any) -> None:
    """Structured Outputs generate fields in schema order: `reasoning` must stay before `answer`."""
    schema = {"type": "json_schema", "json_schema": {"name": "r", "strict": True, "schema": {
        "type": "object", "properties": {"reasoning": {"type": "string"}, "answer": {"type": "string"}},
        "required": ["reasoning", "answer"], "additionalProperties": False}}}
    assert send(keel_on, body_bytes(response_format=schema)).status_code == 200
    sent = forwarded(upstream[0])
    assert sent != body_bytes(response_format=schema), "features are on: the body was planned"
    assert b'"properties":{"reasoning":{"type":"string"},"answer":{"type":"string"}}' in sent
    assert b'"response_format":{"type":"json_schema","json_schema":{"name":"r","strict":true' in sent


def test_surfaced_tool_parameters_keep_order_and_numbers(keel_on: ServerThread, upstream: Any) -> None:
    """A surfaced tool's schema is the client's: property order, vendor keys and number text intact."""
    assert send(keel_on, body_bytes()).status_code == 200
    sent = orjson.loads(forwarded(upstream[0]).replace(b"1e400", b"0"))
    names = [t["function"]["name"] for t in sent["tools"]]
    assert "lookup_order" in names and "tool_search" in names and len(names) < 14
    raw = forwarded(upstream[0])
    assert (b'"properties":{"zeta":{"type":"string"},"alpha":{"type":"integer","maximum":1e400,"multipleOf":1.50},'
            b'"mid":{"type":"number"}},"required":["zeta"],"x-vendor":{"b":1,"a":2}') in raw


def test_numbers_keep_their_text(keel_on: ServerThread, upstream: Any) -> None:
    """1.0, 1.50, 1e5, 1e400 and an integer beyond 64 bits reach the upstream as written."""
    raw = body_bytes()[:-1] + (b',"temperature":1.0,"top_p":0.50,"seed":123456789012345678901234567890,'
                               b'"x_big":1e400,"x_exp":1E5,"x_neg":-0.0}')
    assert send(keel_on, raw).status_code == 200
    sent = forwarded(upstream[0])
    for text in (b'"temperature":1.0', b'"top_p":0.50', b'"seed":123456789012345678901234567890',
                 b'"x_big":1e400', b'"x_exp":1E5', b'"x_neg":-0.0'):
        assert text in sent, text


def test_content_parts_unknown_fields_and_unicode(keel_on: ServerThread, upstream: Any) -> None:
    """Nested content parts, unknown top-level and message fields, and unicode pass through."""
    parts = [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA", "detail": "low"}},
             {"type": "text", "text": "héllo 😀 — 東京", "x_part": {"z": 1, "a": [3, 2, 1]}}]
    body = {"model": "m", "zz_top": {"b": 2, "a": 1}, "tools": catalog(), "messages": [
        {"role": "system", "content": "Be nice."},
        {"role": "user", "content": parts, "name": "ann", "x_message": True}]}
    assert send(keel_on, numbers(jsontext.dumps(body))).status_code == 200
    sent = forwarded(upstream[0])
    assert b'"zz_top":{"b":2,"a":1}' in sent
    assert b'"name":"ann","x_message":true' in sent
    assert b'{"type":"image_url","image_url":{"url":"data:image/png;base64,AAAA","detail":"low"}}' in sent
    assert '"text":"héllo 😀 — 東京","x_part":{"z":1,"a":[3,2,1]}'.encode() in sent
    assert list(orjson.loads(sent))[:2] == ["model", "zz_top"], "top-level key order kept"


def test_too_deep_body_is_forwarded_as_sent(keel_on: ServerThread, upstream: Any) -> None:
    """A body nested deeper than Keel can hold is not a 500: it goes upstream as the client sent it."""
    deep = b'{"model":"m","messages":[{"role":"user","content":"hi"}],"x":' + b"[" * 600 + b"]" * 600 + b"}"
    response = send(keel_on, deep)
    assert response.status_code == 200
    assert forwarded(upstream[0]) == deep


def test_system_message_keeps_its_parts_fields_and_breakpoints(upstream: Any,
                                                                start_keel: Callable[..., ServerThread]) -> None:
    """The frozen front is the client's own system message: its content parts, a cache_control the
    client set (with its ttl), unknown fields and key order; Keel's context is a part after them."""
    anthropic = tenant(upstream[1].url + "/v1", **FEATURES)
    anthropic["upstream"]["kind"] = "anthropic-compatible"
    keel = start_keel(keel_config(anthropic))
    system = {"content": [{"type": "text", "text": "You are terse. " * 200,
                           "cache_control": {"type": "ephemeral", "ttl": "1h"}},
                          {"type": "text", "text": "Second part."}], "role": "system", "x_msg_unknown": 1.10}
    today = {"role": "user", "content": "what is on for today?"}  # speaks of time: Keel's context has the date
    body = numbers(jsontext.dumps({"model": "m", "messages": [system, today]}))
    assert send(keel, body.replace(b"1.1,", b"1.10,").replace(b"1.1}", b"1.10}")).status_code == 200
    sent = forwarded(upstream[0])
    front = orjson.loads(sent)["messages"][0]
    assert list(front) == ["content", "role", "x_msg_unknown"] and b'"x_msg_unknown":1.10' in sent
    assert front["content"][0]["cache_control"] == {"type": "ephemeral", "ttl": "1h"}
    assert front["content"][1] == {"type": "text", "text": "Second part."}
    assert front["content"][2]["text"].startswith("<keel_context>")
    assert b'"ttl":"1h"' in sent and sent.count(b'"cache_control"') == 1, "the client's own breakpoint, alone"


def test_minus_zero_keeps_its_sign(keel_on: ServerThread, upstream: Any) -> None:
    assert send(keel_on, body_bytes()[:-1] + b',"x_zero":-0}').status_code == 200
    assert b'"x_zero":-0' in forwarded(upstream[0])


def test_a_client_field_named_like_keels_own_goes_as_sent(upstream: Any, start_keel: Callable[..., ServerThread]) -> None:
    """Keel marks its view objects with `_keel`; a client body that carries that key itself is not
    planned (its objects would read as Keel's): it goes upstream byte for byte."""
    keel = start_keel(keel_config(tenant(upstream[1].url + "/v1", **FEATURES)), clients_send_keel_keys=True)
    body = b'{"model":"m","messages":[{"role":"system","content":"s","_keel":"front"},{"role":"user","content":"hi"}]}'
    assert send(keel, body).status_code == 200
    assert forwarded(upstream[0]) == body
