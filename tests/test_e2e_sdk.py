"""End to end: the real openai SDK → Keel → the stand-in, all real servers on real sockets."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable

import httpx
import openai
import pytest
from conftest import KEY, ServerThread, keel_config, tenant, tool

WEATHER = tool("get_weather", "Current weather for a city", city="string")


def client(server: ServerThread, key: str = KEY, **kw: object) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=key, max_retries=0, **kw)  # type: ignore[arg-type]


def test_plain_answer(keel: ServerThread) -> None:
    """A non-streaming completion comes back with the stand-in's answer and usage."""
    reply = client(keel).chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": "ping"}])
    assert reply.choices[0].message.content == "You said: ping"
    assert reply.usage is not None and reply.usage.prompt_tokens > 0


def test_stream_with_usage(keel: ServerThread) -> None:
    """A streamed completion arrives as deltas that add up to the answer, then a usage chunk."""
    stream = client(keel).chat.completions.create(
        model="gpt-4o-mini", stream=True, stream_options={"include_usage": True},
        messages=[{"role": "user", "content": "[[words 30]]"}],
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == " ".join(f"word{i}" for i in range(30))
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["stop"]


def test_tool_call_round_trip(keel: ServerThread) -> None:
    """The model calls the client's tool; the client answers it and gets text back."""
    c = client(keel)
    messages: list[dict[str, object]] = [{"role": "user", "content": 'weather? [[call get_weather {"city":"Oslo"}]]'}]
    first = c.chat.completions.create(model="m", messages=messages, tools=[WEATHER])  # type: ignore[arg-type,list-item]
    call = first.choices[0].message.tool_calls[0]  # type: ignore[index]
    assert first.choices[0].finish_reason == "tool_calls"
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Oslo"}
    messages += [first.choices[0].message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": call.id, "content": "4°C, rain"}]
    second = c.chat.completions.create(model="m", messages=messages, tools=[WEATHER])  # type: ignore[arg-type,list-item]
    assert second.choices[0].message.content == "The get_weather tool returned: 4°C, rain"


def test_streamed_tool_call(keel: ServerThread) -> None:
    """Streamed tool_call deltas reassemble into the full call."""
    stream = client(keel).chat.completions.create(
        model="m", stream=True, tools=[WEATHER],  # type: ignore[list-item]
        messages=[{"role": "user", "content": '[[call get_weather {"city":"Lisbon, Portugal"}]]'}],
    )
    name, args = "", ""
    for chunk in stream:
        for d in chunk.choices[0].delta.tool_calls or []:
            name += d.function.name or "" if d.function else ""
            args += d.function.arguments or "" if d.function else ""
    assert name == "get_weather" and json.loads(args) == {"city": "Lisbon, Portugal"}


async def test_async_client_stream(keel: ServerThread) -> None:
    """The async SDK streams through Keel too."""
    async with openai.AsyncOpenAI(base_url=keel.url + "/v1", api_key=KEY, max_retries=0) as ac:
        stream = await ac.chat.completions.create(
            model="m", stream=True, messages=[{"role": "user", "content": "[[words 5]]"}]
        )
        text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    assert text == "word0 word1 word2 word3 word4"


@pytest.mark.parametrize("status, error", [(400, openai.BadRequestError), (429, openai.RateLimitError),
                                           (500, openai.InternalServerError), (503, openai.InternalServerError)])
def test_upstream_error_status_relayed(keel: ServerThread, status: int, error: type[Exception]) -> None:
    """An upstream 4xx/5xx reaches the client with the same status and the upstream's message."""
    with pytest.raises(error) as info:
        client(keel).chat.completions.create(model="m", messages=[{"role": "user", "content": f"[[error {status}]]"}])
    assert info.value.status_code == status  # type: ignore[attr-defined]
    assert f"stand-in error {status}" in str(info.value)


def test_upstream_down(start_keel: Callable[..., ServerThread]) -> None:
    """A refused upstream connection is a 502 that says so."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    keel = start_keel(keel_config(tenant(f"http://127.0.0.1:{dead}/v1")))
    with pytest.raises(openai.APIStatusError) as info:
        client(keel).chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    assert info.value.status_code == 502
    assert "unreachable" in info.value.message


def test_slow_upstream_times_out(standin: ServerThread, start_keel: Callable[..., ServerThread]) -> None:
    """An upstream slower than the read timeout is a 504, not a hang."""
    config = keel_config(tenant(standin.url + "/v1"), server={"timeouts": {"read": 0.3}})
    keel = start_keel(config)
    started = time.monotonic()
    with pytest.raises(openai.APIStatusError) as info:
        client(keel).chat.completions.create(model="m", messages=[{"role": "user", "content": "[[sleep 3]]"}])
    assert info.value.status_code == 504
    assert "timed out" in info.value.message
    assert time.monotonic() - started < 2.5


def test_stream_cut_midway_ends_with_error_event(keel: ServerThread) -> None:
    """A stream the upstream breaks ends with an error event and no [DONE]."""
    with httpx.stream("POST", keel.url + "/v1/chat/completions", headers={"authorization": f"Bearer {KEY}"},
                      json={"model": "m", "stream": True, "messages": [{"role": "user", "content": "[[words 9]] [[cut]]"}]},
                      timeout=5) as r:
        body = b"".join(r.iter_raw())
    assert r.status_code == 200
    events = [e for e in body.split(b"\n\n") if e]
    assert b"word0" in events[1]
    assert b'"error"' in events[-1] and b"upstream_reset" in events[-1]
    assert b"[DONE]" not in body


def test_bad_key(keel: ServerThread) -> None:
    """A wrong key is a 401 and never reaches the upstream."""
    with pytest.raises(openai.AuthenticationError) as info:
        client(keel, key="sk-wrong").chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
    assert info.value.status_code == 401


def test_missing_key(keel: ServerThread) -> None:
    r = httpx.post(keel.url + "/v1/chat/completions", json={"messages": []})
    assert r.status_code == 401 and r.json()["error"]["code"] == "missing_api_key"


def test_oversized_body(standin: ServerThread, start_keel: Callable[..., ServerThread]) -> None:
    """A body over the limit is a 413 in OpenAI's error format."""
    keel = start_keel(keel_config(tenant(standin.url + "/v1"), server={"body_limit_bytes": 10_000}))
    with pytest.raises(openai.APIStatusError) as info:
        client(keel).chat.completions.create(model="m", messages=[{"role": "user", "content": "x" * 20_000}])
    assert info.value.status_code == 413
    assert info.value.body["type"] == "invalid_request_error"  # type: ignore[index]


@pytest.mark.parametrize("body, code", [(b"{not json", "invalid_json"), (b"[1,2]", "invalid_json"),
                                        (b'{"messages": "hi"}', "invalid_request"),
                                        (b'{"messages": ["hi"]}', "invalid_request")])
def test_malformed_requests(keel: ServerThread, body: bytes, code: str) -> None:
    """Malformed bodies get a 400 with an OpenAI-style error and are never forwarded."""
    r = httpx.post(keel.url + "/v1/chat/completions", content=body,
                   headers={"authorization": f"Bearer {KEY}", "content-type": "application/json"})
    assert r.status_code == 400
    assert set(r.json()["error"]) >= {"message", "type", "code"}
    assert r.json()["error"]["code"] == code
    assert "Traceback" not in r.text


def test_client_disconnect_cancels_upstream(keel: ServerThread, standin: ServerThread) -> None:
    """A client that leaves mid-stream frees Keel's stream slot (the upstream request is closed)."""
    with httpx.stream("POST", keel.url + "/v1/chat/completions", headers={"authorization": f"Bearer {KEY}"},
                      json={"model": "m", "stream": True,
                            "messages": [{"role": "user", "content": "[[words 200000]]"}]}, timeout=5) as r:
        first = next(r.iter_raw())
        assert first.startswith(b"data: ")
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        metrics = httpx.get(keel.url + "/metrics").text
        if 'keel_streams_open{tenant="acme"} 0.0' in metrics:
            break
        time.sleep(0.05)
    assert 'keel_streams_open{tenant="acme"} 0.0' in metrics
    assert 'keel_requests_total{route="chat",status="200",tenant="acme"} 1.0' in metrics
