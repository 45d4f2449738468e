"""Both upstream clients (aiohttp, the default, and httpx) behave the same through real servers."""

from __future__ import annotations

import socket
from collections.abc import Callable

import httpx
import pytest
from conftest import KEY, ServerThread, keel_config, tenant
from recorder import Recorder

AUTH = {"authorization": f"Bearer {KEY}"}
CLIENTS = ["aiohttp", "httpx"]


@pytest.mark.parametrize("client", CLIENTS)
def test_bytes_both_ways(client: str, start_keel: Callable[..., ServerThread]) -> None:
    """Request and response bytes pass unchanged; the client's content-encoding request is honoured."""
    body = b'{"messages": [ ],"b":1, "a":"\\u00e9"}'
    recorder = Recorder(chunks=[b'{"x":  1}'])
    with ServerThread(recorder) as upstream:
        keel = start_keel(keel_config(tenant(upstream.url + "/v1"), server={"upstream_client": client}))
        r = httpx.post(keel.url + "/v1/chat/completions?x=%2F", content=body, headers=AUTH)
    assert r.content == b'{"x":  1}'
    seen = recorder.received[0]
    assert seen.body == body and seen.query == b"x=%2F"
    assert "user-agent" in seen.headers  # the client's own (httpx's test client) user-agent, forwarded
    assert seen.headers["user-agent"].startswith("python-httpx")


@pytest.mark.parametrize("client", CLIENTS)
def test_failures(client: str, standin: ServerThread, start_keel: Callable[..., ServerThread]) -> None:
    """Refused → 502, slow → 504, cut stream → error event; the same with either client."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    server = {"upstream_client": client, "timeouts": {"read": 0.3}}
    down = start_keel(keel_config(tenant(f"http://127.0.0.1:{dead}/v1"), server=server))
    r = httpx.post(down.url + "/v1/chat/completions", json={"messages": []}, headers=AUTH)
    assert r.status_code == 502 and r.json()["error"]["code"] == "upstream_unreachable"

    keel = start_keel(keel_config(tenant(standin.url + "/v1"), server=server))
    slow = httpx.post(keel.url + "/v1/chat/completions", headers=AUTH,
                      json={"messages": [{"role": "user", "content": "[[sleep 2]]"}]})
    assert slow.status_code == 504 and slow.json()["error"]["code"] == "upstream_timeout"

    cut = httpx.post(keel.url + "/v1/chat/completions", headers=AUTH,
                     json={"stream": True, "messages": [{"role": "user", "content": "[[words 5]] [[cut]]"}]})
    assert b"upstream_reset" in cut.content and b"[DONE]" not in cut.content
