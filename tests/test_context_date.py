"""The date where it matters (issue 21, item 7): "hi" costs what it costs direct; a turn that
speaks of time is told today's date; once the model knows a date, a change of local date is
announced on the next turn whatever it says."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import anthropic
import httpx
import openai
import pytest
from conftest import KEY, ServerThread, keel_config, tenant
from test_invariant_prefix_stable import other_date_zone

from proxy.context.dates import speaks_of_time


@pytest.fixture
def keel(standin: ServerThread, start_keel: Callable[..., ServerThread]) -> ServerThread:
    return start_keel(keel_config(tenant(standin.url + "/v1", context={"stable": True})))


def sent(standin: ServerThread) -> str:
    return str(standin.app.state.standin.requests[-1])


def test_hi_carries_no_date_on_any_shape(keel: ServerThread, standin: ServerThread) -> None:
    """A greeting needs no date: the provider gets no date block on chat, Responses or Messages."""
    openai.OpenAI(base_url=keel.url + "/v1", api_key=KEY).chat.completions.create(
        model="m", messages=[{"role": "user", "content": "hi"}])
    assert "Current date" not in sent(standin)
    openai.OpenAI(base_url=keel.url + "/v1", api_key=KEY).responses.create(model="m", input="hi", store=False)
    assert "Current date" not in sent(standin)
    anthropic.Anthropic(base_url=keel.url, api_key=KEY).messages.create(
        model="c", max_tokens=20, messages=[{"role": "user", "content": "hi"}])
    assert "Current date" not in sent(standin)
    usage = standin.app.state.standin.served[-1]
    assert usage.prompt_tokens < 12, "as cheap as the request sent direct"


def test_a_turn_about_time_gets_the_date_and_later_its_change(keel: ServerThread, standin: ServerThread) -> None:
    headers = {"authorization": f"Bearer {KEY}"}
    history: list[dict[str, Any]] = [{"role": "user", "content": "hi [[ramble 40]]"}]

    def send(text: str, extra: dict[str, str] | None = None) -> None:
        if text:
            history.append({"role": "user", "content": text})
        reply = httpx.post(keel.url + "/v1/chat/completions", headers={**headers, **(extra or {})},
                           json={"model": "m", "messages": history})
        history.append(reply.json()["choices"][0]["message"])

    send("")
    assert "date" not in sent(standin).lower().replace("update", "")
    send("what should I do tomorrow?")
    assert "The current date is now" in str(standin.app.state.standin.requests[-1]["messages"][-1])
    send("thanks, noted", {"x-keel-timezone": other_date_zone()})  # says nothing of time, but the date rolled
    assert "The current date is now" in str(standin.app.state.standin.requests[-1]["messages"][-1])


def test_a_client_that_states_the_date_gets_none_from_keel(keel: ServerThread, standin: ServerThread) -> None:
    """Claude Code says "Today's date is …" in its system prompt, Codex `<current_date>` in a user
    message: Keel's date would say it twice, so a turn about time gets none (and costs what it costs direct)."""
    today = datetime.now(UTC).strftime("%Y-%m-%d")
    client = openai.OpenAI(base_url=keel.url + "/v1", api_key=KEY)
    client.chat.completions.create(model="m", messages=[
        {"role": "system", "content": f"You are a coding agent. Today's date is {today}."},
        {"role": "user", "content": "what should I do tomorrow?"}])
    assert "current date" not in sent(standin).lower()
    client.responses.create(model="m", store=False, input=[
        {"role": "user", "content": f"<environment_context><current_date>{today}</current_date></environment_context>"},
        {"role": "user", "content": "what time is it in Tokyo?"}])
    assert "current date" not in sent(standin).lower()
    client.chat.completions.create(model="m", messages=[
        {"role": "system", "content": "You are a coding agent. Today's date is 2019-04-01."},
        {"role": "user", "content": "what should I do tomorrow?"}])
    assert "Current date" in sent(standin), "another day than today: Keel's date goes in"


@pytest.mark.parametrize(("text", "needs"), [
    ("hi", False), ("thanks!", False), ("fix the bug in parser.py", False),
    ("what's the weather today?", True), ("book it for Friday", True), ("remind me in 3 days", True),
    ("how long ago was 2019-04-01?", True), ("明天的会议", True), ("¿qué hay para mañana?", True),
])
def test_which_messages_speak_of_time(text: str, needs: bool) -> None:
    assert speaks_of_time(text) is needs
