"""Keel learns from a tenant's traffic and measures itself: a tool the model had to find by search
ships first-shot the next time a request is worded like that; first-shot hits and misses, gate
decisions and the memory gate's audit are counted per tenant."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import httpx
import openai
import pytest
from conftest import KEY, ServerThread, eventually, keel_config, small_catalog, tenant

from proxy.standin.script import hidden_call

AUTH = {"authorization": f"Bearer {KEY}"}
LEARNED = "put the stale lighthouse report away for good"  # words that do not rank archive_ticket
ALIKE = "put the lighthouse report away"


def sample(keel: ServerThread, name: str, **labels: str) -> float:
    value = keel.app.state.keel.metrics.registry.get_sample_value(name, {"tenant": "acme", **labels})
    return value or 0.0


def shipped_first(standin: ServerThread, before: int) -> list[str]:
    first = list(standin.app.state.standin.requests)[before]
    return [t["function"]["name"] for t in first["tools"]]


def ask(keel: ServerThread, text: str, tools: list[dict[str, Any]] | None = None) -> None:
    httpx.post(keel.url + "/v1/chat/completions", headers=AUTH, timeout=15, json={
        "model": "m", "tools": tools or small_catalog(),
        "messages": [{"role": "user", "content": text}]}).raise_for_status()


def test_a_tool_found_by_search_ships_first_shot_next_time(standin: ServerThread,
                                                            start_keel: Callable[..., ServerThread]) -> None:
    """First: the request's words do not rank `archive_ticket`, the model searches (with the
    user's words) and calls it: a miss, learned. Then a request worded alike (another
    conversation) ships it before the model runs: a hit."""
    keel = start_keel(keel_config(tenant(standin.url + "/v1", tools={"enabled": True, "stability": "per_turn"})))
    before = len(standin.app.state.standin.requests)
    ask(keel, "put the stale lighthouse report away for good " + hidden_call("archive_ticket", '{"id": "9"}'))
    assert "archive_ticket" not in shipped_first(standin, before)
    assert sample(keel, "keel_tool_first_shot_total", result="miss") == 1
    before = len(standin.app.state.standin.requests)
    ask(keel, "put the lighthouse report away " + hidden_call("archive_ticket", '{"id": "3"}'))
    assert "archive_ticket" in shipped_first(standin, before)
    assert sample(keel, "keel_tool_first_shot_total", result="hit") == 1


def test_learning_only_adds_tools(standin: ServerThread, start_keel: Callable[..., ServerThread]) -> None:
    """A recalled tool ships beside what the ranker picked, never in place of it: for the same
    request, the tools shipped with learning on include every tool shipped with it off."""
    learning = start_keel(keel_config(tenant(standin.url + "/v1", tools={"enabled": True, "stability": "per_turn"})))
    plain = start_keel(keel_config(tenant(standin.url + "/v1", tools={"enabled": True, "stability": "per_turn",
                                                                     "select": {"learn": False}})))
    for keel in (learning, plain):
        ask(keel, "put the stale lighthouse report away for good " + hidden_call("archive_ticket", '{"id": "9"}'))
    probes = ["open a ticket about the lighthouse report and put the old one away",
              "reset the password for the lighthouse report owner", "put the lighthouse report away"]
    for probe in probes:
        shipped = {}
        for name, keel in (("on", learning), ("off", plain)):
            before = len(standin.app.state.standin.requests)
            ask(keel, probe)
            shipped[name] = set(shipped_first(standin, before))
        assert shipped["off"] <= shipped["on"], probe
    assert "archive_ticket" in shipped["on"] and "archive_ticket" not in shipped["off"]


@pytest.mark.parametrize("who", ["credential", "end_user"])
def test_what_one_scope_learns_stays_in_that_scope(standin: ServerThread, start_keel: Callable[..., ServerThread],
                                                   who: str) -> None:
    """Learned phrases are scoped like every stored state (issue 20, finding 7): what caller X's
    turns taught ships for X's next request worded alike, never for Y's, whether X and Y are two
    provider keys of a passthrough tenant or two end users of one Keel key; so no caller can
    read another's words by probing, or push tools into another's requests."""
    keyed = tenant(standin.url + "/v1", tools={"enabled": True, "stability": "per_turn"})
    byo = {"id": "byo", "auth": {"passthrough": True}, "upstream": {"base_url": standin.url + "/v1"},
           "tools": {"enabled": True, "stability": "per_turn"}}
    keel = start_keel(keel_config(keyed, byo))

    def client(name: str) -> openai.OpenAI:
        if who == "credential":
            return openai.OpenAI(base_url=keel.url + "/v1", api_key=f"sk-provider-{name}", max_retries=0,
                                 default_headers={"x-keel-tenant": "byo"})
        return openai.OpenAI(base_url=keel.url + "/v1", api_key=KEY, max_retries=0,
                             default_headers={"x-keel-user": name})

    def first_shipped(caller: openai.OpenAI, text: str) -> list[str]:
        before = len(standin.app.state.standin.requests)
        caller.chat.completions.create(model="m", tools=small_catalog(),  # type: ignore[arg-type]
                                       messages=[{"role": "user", "content": text}])
        return shipped_first(standin, before)

    x, y = client("x"), client("y")
    assert "archive_ticket" not in first_shipped(x, LEARNED + " " + hidden_call("archive_ticket", '{"id": "9"}'))
    assert "archive_ticket" not in first_shipped(y, ALIKE)
    assert "archive_ticket" in first_shipped(x, ALIKE)


def test_learning_can_be_switched_off(standin: ServerThread, start_keel: Callable[..., ServerThread]) -> None:
    keel = start_keel(keel_config(tenant(standin.url + "/v1", tools={"enabled": True, "stability": "per_turn",
                                                                     "select": {"learn": False}})))
    ask(keel, "put the stale lighthouse report away for good " + hidden_call("archive_ticket", '{"id": "9"}'))
    before = len(standin.app.state.standin.requests)
    ask(keel, "put the lighthouse report away " + hidden_call("archive_ticket", '{"id": "3"}'))
    assert "archive_ticket" not in shipped_first(standin, before)


def test_gate_decisions_are_counted(standin: ServerThread, start_keel: Callable[..., ServerThread]) -> None:
    keel = start_keel(keel_config(tenant(standin.url + "/v1", tools={"enabled": True, "stability": "per_turn"})))
    ask(keel, "thanks, that was great!")
    ask(keel, "create a ticket for the printer on floor 3")
    assert sample(keel, "keel_tool_gate_decisions_total", decision="withheld") == 1
    assert sample(keel, "keel_tool_gate_decisions_total", decision="shipped") == 1


def test_memory_gate_audit_counts_what_the_gate_missed(standin: ServerThread,
                                                        start_keel: Callable[..., ServerThread]) -> None:
    """With audit_rate 1, every turn the gate skips runs the memory model anyway: a turn the
    model keeps something from is a miss, counted (and kept)."""
    memory = {"enabled": True, "gate": {"audit_rate": 1.0}}
    keel = start_keel(keel_config(tenant(standin.url + "/v1", memory=memory)))
    headers = {**AUTH, "x-keel-user": "zoe"}
    httpx.post(keel.url + "/v1/chat/completions", headers=headers, json={
        "model": "m", "messages": [{"role": "user", "content": "my locker code is 4411, when does the gym open?"}]}
    ).raise_for_status()  # a question: the gate skips it, the audited model keeps the code
    assert eventually(lambda: sample(keel, "keel_memory_gate_audit_total", outcome="missed") == 1)
    time.sleep(0.1)
    assert sample(keel, "keel_memory_gate_decisions_total", outcome="skip") == 1
