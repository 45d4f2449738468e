"""Invariant 2: within a segment, each request Keel renders begins with the previous one's tools,
system prompt and messages, byte for byte, whatever the client changes in its system prompt."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import httpx
import orjson
import pytest
from conftest import KEY, ServerThread, keel_config, large_catalog, tenant
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.standin.script import hidden_call

Body = dict[str, Any]


def canon(value: Any) -> bytes:
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)


def catalog() -> list[dict[str, Any]]:
    tools = large_catalog()
    return tools


def assert_prefix(before: Body, after: Body) -> None:
    """`after` begins with `before`: same tools (extended at most at the end), same messages so far."""
    old_tools, new_tools = before.get("tools", []), after.get("tools", [])
    assert [canon(t) for t in new_tools[: len(old_tools)]] == [canon(t) for t in old_tools], "tool block changed"
    old, new = before["messages"], after["messages"]
    assert len(new) >= len(old)
    for i, (a, b) in enumerate(zip(old, new, strict=False)):
        assert canon(a) == canon(b), f"message {i} changed: {canon(a)[:200]!r} -> {canon(b)[:200]!r}"


class Chat:
    """A client that resends the whole history, with a system prompt that changes under it."""

    def __init__(self, standin: ServerThread, keel: ServerThread) -> None:
        self.standin, self.keel = standin, keel
        self.sections: dict[str, str] = {
            "clock": "Current time: 2026-11-30 10:00:01",
            "rules": "You are a helpful assistant for the ACME team.",
            "memory": "<memory>\nThe user likes tea.\n</memory>",
        }
        self.history: list[Body] = []
        # No conversation id: the first answer, long and sampled, is what proves each later request
        # continues this conversation while its system prompt changes (see proxy/proofs.py).
        self.headers = {"authorization": f"Bearer {KEY}", "x-keel-user": "alice"}

    def system(self) -> str:
        return "\n\n".join(self.sections.values())

    def upstream(self) -> list[Body]:
        return list(self.standin.app.state.standin.requests)

    def send(self, text: str | None, *, keep: bool = True) -> tuple[Body, list[Body]]:
        """One client turn (None: resend the history as it is, a regeneration)."""
        if text is not None:
            self.history.append({"role": "user", "content": text if self.history else text + " [[sample 40]]"})
        before = len(self.upstream())
        body = {"model": "m", "tools": catalog(), "messages": [{"role": "system", "content": self.system()},
                                                                  *self.history]}
        reply = httpx.post(self.keel.url + "/v1/chat/completions", json=body, headers=self.headers, timeout=30)
        assert reply.status_code == 200, reply.text
        message = reply.json()["choices"][0]["message"]
        if keep:
            self.history.append({k: v for k, v in message.items() if v is not None and k != "refusal"})
            for call in message.get("tool_calls") or []:
                self.history.append({"role": "tool", "tool_call_id": call["id"], "content": "done"})
        return reply.json(), self.upstream()[before:]


def other_date_zone() -> str:
    """A time zone whose local date differs from UTC's right now (one of these two always does)."""
    now = datetime.now(UTC)
    for zone in ("Etc/GMT+12", "Pacific/Kiritimati"):
        if now.astimezone(ZoneInfo(zone)).date() != now.date():
            return zone
    raise AssertionError("unreachable: UTC-12 and UTC+14 cannot both share UTC's date")


def start(standin: ServerThread, start_keel: Callable[..., ServerThread], db: Path,
          stability: str = "segment") -> ServerThread:
    config = keel_config(tenant(standin.url + "/v1", tools={"enabled": True, "stability": stability},
                                context={"stable": True}),
                        # a store call that overran a loaded test machine's budget would pass the turn
                        # through unplanned (by design): this test is about what planning renders
                        store={"url": f"sqlite:///{db}", "budget_ms": 5000})
    return start_keel(config)


@pytest.mark.parametrize("stability", ["segment", "dispatch"])
def test_prefix_stable_through_a_scripted_conversation(standin: ServerThread,
                                                       start_keel: Callable[..., ServerThread],
                                                       tmp_path: Path, stability: str) -> None:
    """Clock ticks, memory change, toggles, retrieved context, date rollover, tool discovery,
    regeneration, an edit, a restart and a second process: every request extends the last
    (and with dispatch stability the tool block never changes at all)."""
    keel = start(standin, start_keel, tmp_path / "keel.db", stability)
    chat = Chat(standin, keel)
    _, sent = chat.send("hello, can you help me with my repo?")
    last = sent[-1]
    system = last["messages"][0]
    first_tools = last["tools"]

    def turn(text: str | None, **kw: Any) -> list[Body]:
        nonlocal last
        _, calls = chat.send(text, **kw)
        assert_prefix(last, calls[0])
        for a, b in itertools.pairwise(calls):  # a tool_search continuation extends its own call
            assert_prefix(a, b)
        assert canon(calls[0]["messages"][0]) == canon(system), "system prompt changed within the segment"
        if stability == "dispatch":
            for c in calls:
                assert [t["function"]["name"] for t in c["tools"]] == [t["function"]["name"] for t in first_tools]
                assert canon(c["tools"]) == canon(first_tools), "dispatch changed the tool block"
        last = calls[-1]
        return calls

    chat.sections["clock"] = "Current time: 2026-11-30 10:00:47"  # a clock line with seconds
    turn("what can you do today?")  # speaks of time: the model is told the date, and later its change
    chat.sections["beta"] = "## Beta features\nUse the v2 API."  # toggled on
    calls = turn("ok, use the new API")
    assert '<context_update>' in calls[0]["messages"][-1]["content"]
    assert 'Added section "## Beta features"' in calls[0]["messages"][-1]["content"]
    chat.sections["memory"] = "<memory>\nThe user likes coffee now.\n</memory>"  # memory changes
    del chat.sections["beta"]  # toggled off
    calls = turn("noted")
    update = calls[0]["messages"][-1]["content"]
    assert 'Changed section "<memory>"' in update and "coffee" in update and 'Removed section "## Beta' in update
    chat.sections["beta"] = "## Beta features\nUse the v2 API."  # on again
    chat.sections["retrieved"] = "<retrieved>\nDoc A: the deploy runbook.\n</retrieved>"  # per-turn retrieval
    turn("how do we deploy?")
    chat.sections["retrieved"] = "<retrieved>\nDoc B: the rollback runbook.\n</retrieved>"
    chat.headers["x-keel-timezone"] = other_date_zone()  # the user's local date rolls over
    calls = turn("and roll back?")
    assert "The current date is now" in calls[0]["messages"][-1]["content"]
    calls = turn("please do it " + hidden_call("convert_time"))  # a tool discovered mid-conversation
    assert len(calls) == 2 and "tool_search" in [t["function"]["name"] for t in calls[0]["tools"]]
    assert chat.history[-2]["tool_calls"][0]["function"]["name"] == "convert_time"  # the client's own tool
    turn(None)  # the tool result goes back: the hidden search exchange is spliced in place

    regenerated_from = list(chat.history)
    calls = turn("summarize what we did")
    first = calls[0]
    chat.history = [*regenerated_from, {"role": "user", "content": "summarize what we did"}]
    _, again = chat.send(None)
    assert canon(again[0]) == canon(first), "a regeneration renders the same bytes"
    last = again[-1]

    chat.history = [*regenerated_from, {"role": "user", "content": "summarize it in one line"}]  # an edit
    _, edited = chat.send(None)
    shared = len(regenerated_from) + 1  # system + history before the edited message
    assert [canon(m) for m in edited[0]["messages"][:shared]] == [canon(m) for m in first["messages"][:shared]]
    last = edited[-1]

    keel.__exit__()  # a restart with the store kept
    keel = start(standin, start_keel, tmp_path / "keel.db", stability)
    chat.keel = keel
    turn("are you still there?")
    other = start(standin, start_keel, tmp_path / "keel.db", stability)  # a second process, same store
    chat.keel = other
    turn("one more question")

    fork_point, fork_last = list(chat.history), last  # a fork: two continuations share their prefix
    turn("branch one")
    chat.history, last = [*fork_point], fork_last
    turn("branch two")

    chat.history = [{"role": "user", "content": "Summary of our chat so far: deploys and rollbacks."}]
    chat.sections["clock"] = "Current time: 2026-12-01 09:00:00"  # a compaction opens a new segment
    _, compacted = chat.send("let's continue")
    new_system = compacted[0]["messages"][0]
    assert canon(new_system) != canon(system) and "2026-12-01 09:00:00" in new_system["content"]


def test_context_off_changes_nothing(standin: ServerThread, start_keel: Callable[..., ServerThread]) -> None:
    """With context.stable off the system prompt and messages go upstream as the client sent them."""
    keel = start_keel(keel_config(tenant(standin.url + "/v1")))
    body = {"model": "m", "messages": [{"role": "system", "content": "Now: 10:00:01"}, {"role": "user", "content": "x"}]}
    raw = orjson.dumps(body)
    httpx.post(keel.url + "/v1/chat/completions", content=raw, headers={"authorization": f"Bearer {KEY}"})
    assert orjson.dumps(standin.app.state.standin.requests[-1]) == raw


EVENTS = ["tick", "memory", "toggle", "retrieved", "discover", "regenerate", "plain"]


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(events=st.lists(st.sampled_from(EVENTS), min_size=2, max_size=7), stability=st.sampled_from(
    ["segment", "dispatch"]))
def test_prefix_stable_for_generated_event_sequences(standin: ServerThread, start_keel: Callable[..., ServerThread],
                                                    tmp_path: Path, events: list[str], stability: str) -> None:
    """Any sequence of clock ticks, memory changes, toggles, retrieved context, tool discovery,
    regenerations and plain turns keeps every request a byte-for-byte extension of the last."""
    keel = start(standin, start_keel, tmp_path / f"{stability}.db", stability)
    chat = Chat(standin, keel)
    chat.headers["x-keel-user"] = f"user-{len(events)}-{hash(tuple(events))}"
    _, sent = chat.send("hello")
    last = previous_turn = sent[-1]
    for n, event in enumerate(events):
        if event == "regenerate":
            if chat.history and chat.history[-1].get("role") == "assistant" and not chat.history[-1].get("tool_calls"):
                chat.history.pop()
                _, calls = chat.send(None)  # the same history again: a regeneration
                assert_prefix(previous_turn, calls[0])
                last = calls[-1]
            continue
        if event == "tick":
            chat.sections["clock"] = f"Current time: 2026-11-30 10:{n:02d}:{(n * 13) % 60:02d}"
        elif event == "memory":
            chat.sections["memory"] = f"<memory>\nfact number {n}\n</memory>"
        elif event == "toggle":
            if "beta" in chat.sections:
                del chat.sections["beta"]
            else:
                chat.sections["beta"] = "## Beta\nOn."
        elif event == "retrieved":
            chat.sections["retrieved"] = f"<retrieved>\nchunk {n}\n</retrieved>"
        text = f"turn {n}" + (" " + hidden_call("convert_time") if event == "discover" else "")
        previous_turn = last
        _, calls = chat.send(text)
        if chat.history[-1].get("role") == "tool":  # the client answers its tool call
            _, more = chat.send(None)
            calls += more
        assert_prefix(last, calls[0])
        for a, b in itertools.pairwise(calls):
            assert_prefix(a, b)
        last = calls[-1]
