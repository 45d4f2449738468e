"""The ids real clients already send (issue 19, part 2), read without configuration, each from
the exact bytes that client sends; they narrow a conversation, never widen it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import orjson
import pytest
from conftest import KEY, ServerThread, keel_config, tenant

from proxy.client_ids import conversation_id, end_user

CLAUDE_CODE_USER = ("user_2f8d0c41a3b7e9f1c5d2a6b8e0f4c7d9a1b3e5f7c9d1a3b5e7f9c1d3a5b7e9f1_account_"
                    "_session_8c1f6a2e-3b4d-4e5f-8a9b-0c1d2e3f4a5b")


@pytest.mark.parametrize(("client", "headers", "body", "conversation", "user"), [
    ("keel", {"x-keel-conversation": "c-7", "x-keel-user": "ana"}, {}, "c-7", "ana"),
    ("openai", {}, {"user": "u-1", "metadata": {"conversation_id": "c-2"}}, "c-2", "u-1"),
    ("openai responses", {}, {"safety_identifier": "sid-9", "conversation": "conv_68af"}, "conv_68af", "sid-9"),
    ("openai responses object", {}, {"conversation": {"id": "conv_68b0"}}, "conv_68b0", None),
    ("librechat", {"x-conversation-id": "6f1c2b0e-58a1-4a8e-9f3a-1c2d3e4f5a6b", "x-user-id": "65f1a2b3c4d5e6f708192a3b"},
     {}, "6f1c2b0e-58a1-4a8e-9f3a-1c2d3e4f5a6b", "65f1a2b3c4d5e6f708192a3b"),
    ("open webui", {"x-openwebui-user-id": "8a3f2c10-aaaa-4bbb-8ccc-1234567890ab",
                    "x-openwebui-chat-id": "b3c9e0d2-1111-4222-8333-abcdefabcdef", "x-openwebui-user-role": "user"},
     {}, "b3c9e0d2-1111-4222-8333-abcdefabcdef", "8a3f2c10-aaaa-4bbb-8ccc-1234567890ab"),
    ("claude code (header)", {"x-claude-code-session-id": "0d9a6c2e-7f41-4c3b-9e8d-5a6b7c8d9e0f"},
     {"metadata": {"user_id": CLAUDE_CODE_USER}}, "0d9a6c2e-7f41-4c3b-9e8d-5a6b7c8d9e0f",
     "user_2f8d0c41a3b7e9f1c5d2a6b8e0f4c7d9a1b3e5f7c9d1a3b5e7f9c1d3a5b7e9f1_account_"),
    ("claude code (metadata only)", {}, {"metadata": {"user_id": CLAUDE_CODE_USER}},
     "8c1f6a2e-3b4d-4e5f-8a9b-0c1d2e3f4a5b", "user_2f8d0c41a3b7e9f1c5d2a6b8e0f4c7d9a1b3e5f7c9d1a3b5e7f9c1d3a5b7e9f1_account_"),
    ("claude code (json metadata)", {}, {"metadata": {"user_id": orjson.dumps({
        "device_id": "d" * 64, "account_uuid": "acc-1", "session_id": "sess-2"}).decode()}}, "sess-2", "acc-1"),
    ("codex", {"session-id": "0199a0f1-sess", "thread-id": "0199a0f1-thread"},
     {"prompt_cache_key": "0199a0f1-thread"}, "0199a0f1-thread", None),
    ("codex, older", {"session_id": "0199a0f1-sess"}, {}, "0199a0f1-sess", None),
    ("nothing", {"user-agent": "curl/8"}, {"metadata": {"tag": "x"}}, None, None),
])
def test_each_clients_ids(client: str, headers: dict[str, str], body: dict[str, Any], conversation: str | None,
                          user: str | None) -> None:
    assert conversation_id(headers, body) == conversation, client
    assert end_user(headers, body) == user, client


def test_open_webui_users_of_one_key_never_meet(standin: ServerThread, start_keel: Callable[..., ServerThread]) -> None:
    """Two Open WebUI users behind one key, the same opener, the same chat id claimed: each
    request carries only its own system prompt, and the chat id names the conversation."""
    keel = start_keel(keel_config(tenant(standin.url + "/v1", context={"stable": True})))
    for user, secret in (("user-a", "zebra-tango"), ("user-b", "quiet-river")):
        reply = httpx.post(keel.url + "/v1/chat/completions", json={"model": "m", "messages": [
            {"role": "system", "content": f"Private notes: {secret}"}, {"role": "user", "content": "hi"}]},
            headers={"authorization": f"Bearer {KEY}", "x-openwebui-user-id": user, "x-openwebui-chat-id": "chat-1"})
        assert reply.headers["x-keel-conversation"] == "chat-1"
    assert "zebra-tango" not in orjson.dumps(standin.app.state.standin.requests[-1]).decode()


def test_long_ids_are_told_apart_not_cut() -> None:
    """Two end users whose ids agree for 512 characters are two users."""
    alice, bob = "u" * 600 + "alice", "u" * 600 + "bob"
    assert end_user({}, {"user": alice}) != end_user({}, {"user": bob})
    assert end_user({"x-keel-user": alice}, {}) != end_user({"x-keel-user": bob}, {})
    assert conversation_id({}, {"metadata": {"conversation_id": alice}}) != conversation_id(
        {}, {"metadata": {"conversation_id": bob}})
