"""What the attack review of the savings page, /v1/responses and /v1/messages, learning from traffic and
isolation on the new shapes found, each reproduced through HTTP against real servers."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from conftest import KEY, KEY_DIGEST, ServerThread, keel_config, small_catalog, tenant

from proxy.standin.app import StandIn, create_standin_app
from proxy.tokens import TokenCounter

ADMIN = "keel-admin-attack"
ADMIN_DIGEST = hashlib.sha256(ADMIN.encode()).hexdigest()
AUTH = {"authorization": f"Bearer {KEY}"}
ADMIN_AUTH = {"authorization": f"Bearer {ADMIN}"}
EVERYTHING: dict[str, Any] = {"tools": {"enabled": True}, "context": {"stable": True},
                              "cache": {"prompt_cache_key": "auto", "breakpoints": "auto"}}


@pytest.fixture
def stand(token_counter: TokenCounter) -> Iterator[ServerThread]:
    with ServerThread(create_standin_app(standin=StandIn(tokens=token_counter))) as server:
        yield server


def admin_tenant(url: str, **overrides: Any) -> dict[str, Any]:
    return tenant(url, auth={"keys": [f"sha256:{KEY_DIGEST}"], "admin_keys": [f"sha256:{ADMIN_DIGEST}"]},
                  **{**EVERYTHING, **overrides})


@pytest.fixture
def keel_on(stand: ServerThread, start_keel: Callable[..., ServerThread]) -> ServerThread:
    """Keel with every request feature on, in front of the stand-in; ADMIN opens its page."""
    return start_keel(keel_config(admin_tenant(stand.url + "/v1")))


def bodies(shape: str, **extra: Any) -> dict[str, Any]:
    if shape == "chat":
        return {"model": "m", "messages": [{"role": "user", "content": "hi"}], **extra}
    if shape == "responses":
        return {"model": "m", "input": "hi", **extra}
    return {"model": "c", "max_tokens": 20, "messages": [{"role": "user", "content": "hi"}], **extra}


PATHS = {"chat": "/v1/chat/completions", "responses": "/v1/responses", "messages": "/v1/messages"}


# --- 1. x-keel-conversation echoes metadata.conversation_id into a response header -----------------------

@pytest.mark.parametrize("shape", ["chat", "responses", "messages"])
@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("conversation", ["会话-1", "a\r\nx-injected: 1", "c" * 100_000])
def test_conversation_id_header_is_safe(keel_on: ServerThread, shape: str, stream: bool,
                                        conversation: str) -> None:
    """A conversation id from the body (a unicode one, one with a line break, a very long one) used to be
    echoed as `x-keel-conversation`: a 500 after the upstream had answered (not latin-1), a dropped
    connection (a CR/LF in a header), or a header no client reads (100 KB). The reply is the upstream's,
    and the header a short printable label the page finds the conversation by."""
    body = bodies(shape, stream=stream, metadata={"conversation_id": conversation})
    if shape == "chat" and stream:
        body["stream_options"] = {"include_usage": True}  # a streamed chat turn is metered only with its usage
    with httpx.Client(timeout=10) as client:
        reply = client.post(keel_on.url + PATHS[shape], headers=AUTH, json=body)
        assert reply.status_code == 200, reply.text[:300]
        label = reply.headers["x-keel-conversation"]
        assert 0 < len(label) <= 128 and label.isascii() and label.isprintable() and " " not in label
        assert "x-injected" not in reply.headers
        deadline = time.monotonic() + 5
        while True:
            page = client.get(keel_on.url + "/keel/api/conversation", params={"id": label}, headers=ADMIN_AUTH)
            if page.json()["turns"] or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert len(page.json()["turns"]) == 1


def test_plain_conversation_ids_are_unchanged(keel_on: ServerThread) -> None:
    """The usual ids (a uuid, `conv-1`) stay what the client sent, on the header and the page."""
    for conversation in ("conv-1", "5f0c6c8e-8f1e-4b8e-9a51-0b6d3c1f2a77"):
        reply = httpx.post(keel_on.url + "/v1/chat/completions", headers={**AUTH, "x-keel-conversation": conversation},
                           json=bodies("chat"))
        assert reply.headers["x-keel-conversation"] == conversation


# --- 2. ?since= reaching back centuries -------------------------------------------------------------------

@pytest.mark.parametrize("since", ["0001-01-01", "100000d", "9" * 400 + "d", "1000000w"])
def test_since_far_back_is_bounded_by_retention(keel_on: ServerThread, since: str) -> None:
    """`since` reaching back past the retention used to read one store key per hour of the range,
    built on the event loop: `0001-01-01` hung the worker (17.5 million hours; every tenant's traffic
    with it), `100000d` took seconds and ended in a 500, a number too large for a float a 500. Nothing
    older than `savings.retention_days` exists: the range starts there at the earliest."""
    started = time.monotonic()
    for path in ("/keel/api/summary", "/keel/"):
        reply = httpx.get(keel_on.url + path, params={"since": since}, headers=ADMIN_AUTH, timeout=10)
        assert reply.status_code == 200, reply.text[:300]
    assert time.monotonic() - started < 3
    ping = httpx.post(keel_on.url + "/v1/chat/completions", headers=AUTH, json=bodies("chat"), timeout=5)
    assert ping.status_code == 200
