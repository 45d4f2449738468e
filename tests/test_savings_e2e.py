"""Savings end to end: a scripted conversation through the stand-in, then the page (in headless Chromium,
and over HTTP), `keel report --json`, and the x-keel headers of streamed and searched replies."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from browser import Browser, chromium_or_skip
from conftest import KEY, KEY_DIGEST, ServerThread, eventually, small_catalog

from proxy.app import create_app
from proxy.config import load_config
from proxy.standin.app import create_standin_app
from proxy.standin.script import hidden_call

ADMIN = "keel-admin-test"
SCREENSHOTS = Path(os.environ.get("KEEL_SCREENSHOT_DIR", "/tmp"))


class Chat:
    """One agent conversation: user messages, tool results until the model answers in text."""

    def __init__(self, url: str, conversation: str) -> None:
        self.http = httpx.Client(base_url=url + "/v1", timeout=30, headers={
            "authorization": f"Bearer {KEY}", "x-keel-conversation": conversation, "x-keel-user": "ana"})
        self.messages: list[dict[str, Any]] = [{"role": "system", "content": "You are Desk. Time: 10:00:01"}]
        self.calls = 0
        self.replies: list[httpx.Response] = []

    def say(self, text: str, clock: str = "10:00:01") -> None:
        self.messages.append({"role": "user", "content": text})
        while True:
            self.messages[0] = {"role": "system", "content": f"You are Desk. Time: {clock}"}
            reply = self.http.post("/chat/completions", json={"model": "gpt-4o", "messages": self.messages,
                                                               "tools": small_catalog()})
            assert reply.status_code == 200, reply.text
            self.calls += 1
            self.replies.append(reply)
            message = reply.json()["choices"][0]["message"]
            self.messages.append({k: v for k, v in message.items() if v is not None})
            if not message.get("tool_calls"):
                return
            for call in message["tool_calls"]:
                self.messages.append({"role": "tool", "tool_call_id": call["id"], "content": '{"ok": true}'})


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The stand-in and Keel (tools, context, cache hints, memory on), a conversation already had."""
    os.environ["KEEL_TEST_UPSTREAM_KEY"] = "sk-upstream-secret"
    directory = tmp_path_factory.mktemp("savings")
    with ServerThread(create_standin_app()) as standin:
        config_file = directory / "keel.yaml"
        config_file.write_text(yaml.safe_dump({
            "store": {"url": f"sqlite:///{directory / 'keel.db'}"},
            "tenants": [{"id": "desk", "auth": {"keys": [f"sha256:{KEY_DIGEST}"], "admin_keys": [
                f"sha256:{hashlib.sha256(ADMIN.encode()).hexdigest()}"]},
                "upstream": {"base_url": standin.url + "/v1"},
                "tools": {"enabled": True, "stability": "per_turn"}, "context": {"stable": True}, "memory": {"enabled": True},
                "cache": {"prompt_cache_key": "auto"}},
                {"id": "other", "auth": {"keys": ["sha256:" + "0" * 64]}, "upstream": {"base_url": standin.url + "/v1"}}],
        }))
        config = load_config(config_file)
        with ServerThread(create_app(config), server_config=config.server) as keel:
            chat = Chat(keel.url, "conv-1")
            chat.say("hello there")
            chat.say("Close ticket T-1, it is solved [[call close_ticket {\"id\": \"T-1\"}]]", "10:00:40")
            chat.say("Please remember that I prefer short answers", "10:01:13")
            chat.say("Could you reach out to the customer about the resolution please? "  # a fresh ask: searched
                     + hidden_call("send_sms", '{"id": "C-9"}'), "10:01:52")
            admin = {"authorization": f"Bearer {ADMIN}"}

            def summary() -> dict[str, Any]:
                return httpx.get(keel.url + "/keel/api/summary", headers=admin).json()  # type: ignore[no-any-return]

            assert eventually(lambda: summary()["turns"] == chat.calls and summary()["memory_gate"]["run"] == 1, 10)
            yield {"keel": keel, "chat": chat, "config": config_file, "summary": summary(), "live": summary}


def test_conversation_figures(served: dict[str, Any]) -> None:
    """What the conversation did shows in the figures: one search round, half the calls first-shot,
    fewer input tokens and dollars through Keel than direct, the memory gate's decisions."""
    figures, chat = served["summary"], served["chat"]
    assert figures["turns"] == chat.calls == 6
    assert figures["tool_search"] == {"rounds": 1, "turns_with_rounds": 1}
    assert figures["first_shot_recall"] == {"calls": 2, "first_shot": 1, "recall": 0.5}
    assert figures["input_tokens"]["keel"] < figures["input_tokens"]["direct"]
    assert figures["input_tokens"]["by_cause"]["tools"] > 0 > figures["input_tokens"]["by_cause"]["search"]
    assert 0 < figures["dollars"]["keel"] < figures["dollars"]["direct"]
    assert sum(figures["dollars"]["by_cause"].values()) == pytest.approx(figures["dollars"]["saved"], abs=1e-5)
    assert figures["memory_gate"]["run"] == 1 and figures["memory_gate"]["skip"] == 3
    assert figures["top_conversations"][0]["conversation"] == "conv-1"


def test_headers_on_searched_and_streamed_replies(served: dict[str, Any]) -> None:
    """x-keel-tools counts what was finally surfaced (the search's finds too); a streamed reply carries
    what is known at its first byte, and its usage (in the final chunk) is metered like any turn's."""
    chat: Chat = served["chat"]
    searched = next(r for r in chat.replies if r.headers.get("x-keel-tool-search-rounds") == "1")
    surfaced, offered = map(int, searched.headers["x-keel-tools"].split("/"))
    assert offered == 30 and surfaced >= 1 and searched.headers["x-keel-conversation"] == "conv-1"
    with chat.http.stream("POST", "/chat/completions", json={
            "model": "gpt-4o", "stream": True, "stream_options": {"include_usage": True},
            "messages": [*chat.messages, {"role": "user", "content": "bye"}], "tools": small_catalog()}) as streamed:
        assert streamed.headers["x-keel-conversation"] == "conv-1"
        assert streamed.headers["x-keel-tools"].endswith("/30")
        assert b"[DONE]" in streamed.read()
    assert eventually(lambda: served["live"]()["turns"] == 7)


def test_keel_report_json(served: dict[str, Any]) -> None:
    """`keel report --json` prints the page's figures, from the store, without a running Keel."""
    out = subprocess.run([sys.executable, "-m", "proxy", "report", "--config", str(served["config"]),
                          "--tenant", "desk", "--since", "1d", "--json"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    import json

    printed = json.loads(out.stdout)
    live = served["live"]()
    for name in ("turns", "input_tokens", "cached_tokens", "tool_search", "first_shot_recall", "tool_gate"):
        assert printed[name] == live[name], name
    text = subprocess.run([sys.executable, "-m", "proxy", "report", "--config", str(served["config"]),
                           "--tenant", "desk"], capture_output=True, text=True, timeout=60).stdout
    assert "first-shot recall: 50.0% (1/2" in text and "conv-1" in text
    bad = subprocess.run([sys.executable, "-m", "proxy", "report", "--config", str(served["config"]), "--tenant", "x"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "no tenant 'x'" in bad.stderr


def test_page_needs_an_admin_key(served: dict[str, Any]) -> None:
    """Without an admin key: the login form (HTML) or a 401 (API); the login sets a cookie that holds the
    key's digest and opens only the page; an admin sees only its own tenants."""
    url = served["keel"].url
    assert "Sign in" in httpx.get(url + "/keel/").text
    assert httpx.get(url + "/keel/api/summary").status_code == 401
    assert httpx.get(url + "/keel/api/summary", headers={"authorization": f"Bearer {KEY}"}).status_code == 401
    assert httpx.post(url + "/keel/login", data={"key": KEY}).status_code == 401
    assert httpx.post(url + "/keel/login", data={"key": "x" * 10_000}).status_code == 413
    login = httpx.post(url + "/keel/login", data={"key": ADMIN})
    assert login.status_code == 303
    cookie = login.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie.replace("Strict", "strict") and "Path=/keel" in cookie
    assert ADMIN not in cookie
    value = login.cookies["keel_admin"]
    page = httpx.get(url + "/keel/", cookies={"keel_admin": value})
    assert page.status_code == 200 and 'data-figure="usd_saved"' in page.text
    chat = httpx.post(url + "/v1/chat/completions", cookies={"keel_admin": value}, json={"model": "m", "messages": []})
    assert chat.status_code == 401
    assert httpx.get(url + "/keel/?tenant=other", cookies={"keel_admin": value}).status_code == 403


async def test_page_in_headless_chromium(served: dict[str, Any], tmp_path: Path) -> None:
    """Sign in through the form, read the figures the page shows, open the conversation inspector."""
    binary = chromium_or_skip()
    url, expected = served["keel"].url, served["live"]()
    async with Browser(binary, tmp_path / "profile") as browser:
        await browser.goto(url + "/keel/")
        assert await browser.js("document.title") == "Keel: sign in"
        await browser.act(f"document.querySelector('input[name=key]').value = '{ADMIN}';"
                          "document.querySelector('form').submit()")
        shown = await browser.figures()
        dollars = expected["dollars"]
        assert shown["tenant"] == "desk" and shown["turns"] == str(expected["turns"])
        assert shown["usd_saved"] == f"${dollars['saved']:,.4f}"
        assert shown["usd_direct"] == f"${dollars['direct']:,.4f}" and shown["usd_keel"] == f"${dollars['keel']:,.4f}"
        assert shown["input_direct"] == f"{expected['input_tokens']['direct']:,}"
        assert shown["input_keel"] == f"{expected['input_tokens']['keel']:,}"
        assert shown["recall"] == "50.0%" and shown["rounds"] == "1"
        memory = expected["memory_gate"]
        assert shown["memory_gate"] == f"run {memory['run']}, skip {memory['skip']}, failed 0"
        assert shown["cause_tools"].startswith("$") and float(shown["cause_tools"][1:]) > 0
        assert await browser.js("document.querySelectorAll('svg rect').length") >= 4  # the charts drew
        await browser.screenshot(SCREENSHOTS / "keel-savings-page.png")
        await browser.act("document.querySelector('table[data-figure=top_conversations] a').click()")
        inspector = await browser.figures()
        assert inspector["conversation"] == "conv-1" and inspector["turn_count"] == str(expected["turns"])
        text = await browser.js("document.body.innerText")
        assert "close_ticket ✓" in text and "send_sms (searched)" in text and "found send_sms" in text
        assert "tool results" in text and "Memory entry added" in text  # what Keel told the model, and why
        await browser.screenshot(SCREENSHOTS / "keel-conversation-inspector.png")
