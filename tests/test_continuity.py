"""No client change: a conversation is known by what only its participants hold (issue 19).

Through the HTTP interface, no id of any kind sent: a request whose history carries an answer
Keel relayed to the same caller continues that conversation (its system prompt frozen, every
change a context update); what proves nothing (a first turn, a short or greedy answer, one
shared by two conversations, another caller's) starts a new one. The stand-in's `[[ramble N]]`
makes a long answer as a sampled model would."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import anthropic
import httpx
import openai
import pytest
from conftest import KEY, ServerThread, keel_config, tenant

from proxy.proofs import MIN_SECRET_CHARS

ON: dict[str, Any] = {"context": {"stable": True}, "cache": {"prompt_cache_key": "auto", "breakpoints": "auto"}}
AUTH = {"authorization": f"Bearer {KEY}"}


@pytest.fixture
def keel(standin: ServerThread, start_keel: Callable[..., ServerThread]) -> ServerThread:
    return start_keel(keel_config(tenant(standin.url + "/v1", **ON)))


def bodies(standin: ServerThread) -> list[dict[str, Any]]:
    return list(standin.app.state.standin.requests)


def chat(keel: ServerThread, system: str, history: list[dict[str, Any]], headers: dict[str, str] | None = None,
         **extra: Any) -> dict[str, Any]:
    """One chat request; the assistant's answer is appended to `history` as the client keeps it."""
    reply = httpx.post(keel.url + "/v1/chat/completions", headers={**AUTH, **(headers or {})}, timeout=30,
                       json={"model": "m", "messages": [{"role": "system", "content": system}, *history], **extra})
    assert reply.status_code == 200, reply.text
    message = reply.json()["choices"][0]["message"]
    history.append({k: v for k, v in message.items() if v is not None})
    return message


def upstream_system(standin: ServerThread) -> str:
    first = bodies(standin)[-1]["messages"][0]
    assert first["role"] == "system"
    return str(first["content"])


def sections(clock: str, memory: str, beta: bool, retrieved: str | None) -> str:
    parts = [f"Current time: {clock}", "You are the ACME assistant. Answer briefly.",
             f"<memory>\n{memory}\n</memory>"]
    if beta:
        parts.append("## Beta features\nUse the v2 API.")
    if retrieved:
        parts.append(f"<retrieved>\n{retrieved}\n</retrieved>")
    return "\n\n".join(parts)


# The LibreChat-like conversation of the issue: a clock with seconds, memory that changes, a
# section switched on and off, retrieved context, no `user`, no conversation id.
STEPS = [
    ("10:00:01", "The user likes tea.", False, None, None),
    ("10:00:47", "The user likes tea.", True, None, "Added section"),
    ("10:01:30", "The user likes coffee now.", True, None, "coffee"),
    ("10:02:05", "The user likes coffee now.", False, "Doc A: the deploy runbook.", "Doc A"),
    ("10:02:50", "The user likes coffee now.", False, "Doc B: the rollback runbook.", "Doc B"),
]


def test_a_chat_without_ids_keeps_one_system_prompt_and_delivers_each_change(keel: ServerThread,
                                                                              standin: ServerThread) -> None:
    """Chat Completions: one system prompt upstream for the whole conversation; the memory change,
    the toggle, each retrieved chunk arrive as a <context_update> on their own turn."""
    history: list[dict[str, Any]] = []
    systems = []
    for n, (clock, memory, beta, retrieved, expect) in enumerate(STEPS):
        history.append({"role": "user", "content": f"question {n} [[ramble 40]]"})
        chat(keel, sections(clock, memory, beta, retrieved), history)
        systems.append(upstream_system(standin))
        newest = bodies(standin)[-1]["messages"][-1]["content"]
        if expect:
            assert "<context_update>" in str(newest) and expect in str(newest), (n, newest)
    assert len(set(systems)) == 1 and "10:00:01" in systems[0] and "tea" in systems[0]


def test_a_responses_conversation_without_ids_is_one_conversation(keel: ServerThread, standin: ServerThread) -> None:
    """/v1/responses with the openai SDK: the instructions stay frozen, changes are updates."""
    client = openai.OpenAI(base_url=keel.url + "/v1", api_key=KEY, max_retries=0)
    items: list[Any] = []
    sent = []
    for n, (clock, memory, beta, retrieved, expect) in enumerate(STEPS):
        items.append({"role": "user", "content": f"question {n} [[ramble 40]]"})
        reply = client.responses.create(model="m", instructions=sections(clock, memory, beta, retrieved),
                                        input=items, store=False)
        items.append({"role": "assistant", "content": reply.output_text})
        body = bodies(standin)[-1]
        sent.append(body["instructions"])
        if expect:
            assert expect in str(body["input"][-1]), (n, body["input"][-1])
    assert len(set(sent)) == 1


def test_a_messages_conversation_without_ids_is_one_conversation(keel: ServerThread, standin: ServerThread) -> None:
    """/v1/messages with the anthropic SDK: the system stays frozen, changes are updates."""
    client = anthropic.Anthropic(base_url=keel.url, api_key=KEY, max_retries=0)
    messages: list[Any] = []
    sent = []
    for n, (clock, memory, beta, retrieved, expect) in enumerate(STEPS):
        messages.append({"role": "user", "content": f"question {n} [[ramble 40]]"})
        reply = client.messages.create(model="claude", max_tokens=300, system=sections(clock, memory, beta, retrieved),
                                       messages=messages)
        messages.append({"role": "assistant", "content": reply.content[0].text})  # type: ignore[union-attr]
        body = bodies(standin)[-1]
        sent.append(str(body["system"]))
        if expect:
            assert expect in str(body["messages"][-1]), (n, body["messages"][-1])
    assert len(set(sent)) == 1


def _two_turns(keel: ServerThread, first_text: str, headers: dict[str, str] | None = None,
               **extra: Any) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Turn one under one clock, turn two under another: is turn two's system prompt turn one's?"""
    history: list[dict[str, Any]] = [{"role": "user", "content": first_text}]
    answer = chat(keel, "Now: 10:00:01\n\nYou help.", history, headers, **extra)
    history.append({"role": "user", "content": "and then?"})
    chat(keel, "Now: 10:09:59\n\nYou help.", history, headers, **extra)
    return answer, history


@pytest.mark.parametrize(("extra_chars", "proves"), [(-1, False), (0, True)])
def test_an_answer_proves_from_160_characters(keel: ServerThread, standin: ServerThread, extra_chars: int,
                                              proves: bool) -> None:
    """The boundary: a sampled answer of 159 characters proves nothing (a new conversation under
    the new system prompt); of 160 it proves the conversation (the first system prompt stays)."""
    text = "x" * (MIN_SECRET_CHARS - len("You said: ") + extra_chars)
    answer, _ = _two_turns(keel, text)
    assert len(answer["content"]) == MIN_SECRET_CHARS + extra_chars
    assert ("10:00:01" in upstream_system(standin)) is proves


def test_a_greedy_or_one_of_many_answer_proves_nothing(keel: ServerThread, standin: ServerThread) -> None:
    """Temperature 0 (anyone replaying the opener gets the same text) or n > 1: no proof."""
    _two_turns(keel, "tell me [[ramble 40]]", temperature=0)
    assert "10:09:59" in upstream_system(standin)
    _two_turns(keel, "tell me more [[ramble 40]]", n=2)
    assert "10:09:59" in upstream_system(standin)


def test_a_tool_call_id_proves_on_its_own(standin: ServerThread, start_keel: Callable[..., ServerThread]) -> None:
    """An answer that is only a call of the client's tool proves the conversation by its id."""
    keel = start_keel(keel_config(tenant(standin.url + "/v1", **ON)))
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]
    history: list[dict[str, Any]] = [{"role": "user", "content": "look it up [[call lookup]]"}]
    answer = chat(keel, "Now: 10:00:01\n\nYou help.", history, tools=tools)
    assert answer["tool_calls"][0]["function"]["name"] == "lookup" and not answer.get("content")
    history.append({"role": "tool", "tool_call_id": answer["tool_calls"][0]["id"], "content": "found"})
    chat(keel, "Now: 10:09:59\n\nYou help.", history, tools=tools)
    assert "10:00:01" in upstream_system(standin)


def test_a_proof_two_conversations_share_proves_nothing(keel: ServerThread, standin: ServerThread) -> None:
    """The same long answer relayed in two conversations (a deterministic reply to the same
    opener under two system prompts) belongs to neither: a history holding it starts anew."""
    opener = {"role": "user", "content": "[[words 40]]"}
    one: list[dict[str, Any]] = [dict(opener)]
    chat(keel, "Prompt one.", one)
    two: list[dict[str, Any]] = [dict(opener)]
    chat(keel, "Prompt two.", two)
    assert one[-1]["content"] == two[-1]["content"] and len(one[-1]["content"]) >= MIN_SECRET_CHARS
    one.append({"role": "user", "content": "go on"})
    chat(keel, "Prompt one, changed.", one)
    assert upstream_system(standin).startswith("Prompt one, changed.")


SECOND_KEY = "sk-keel-second"


@pytest.mark.parametrize("bob_differs_by", ["end user", "keel key", "provider key"])
def test_another_callers_copy_of_an_answer_proves_nothing(standin: ServerThread,
                                                          start_keel: Callable[..., ServerThread],
                                                          bob_differs_by: str) -> None:
    """Bob (another end user of the same key, another Keel key of the tenant, or another provider
    key of a passthrough tenant) sends Alice's whole history, her long answer included, under his
    own system prompt: nothing of Alice's reaches his request."""
    import hashlib

    keyed = tenant(standin.url + "/v1", **ON)
    keyed["auth"] = {"keys": [f"sha256:{hashlib.sha256(k.encode()).hexdigest()}" for k in (KEY, SECOND_KEY)]}
    byo = {"id": "byo", "auth": {"passthrough": True}, "upstream": {"base_url": standin.url + "/v1"}, **ON}
    keel = start_keel(keel_config(keyed, byo))
    alice_headers, bob_headers = {
        "end user": ({"x-keel-user": "alice"}, {"x-keel-user": "bob"}),
        "keel key": ({}, {"authorization": f"Bearer {SECOND_KEY}"}),
        "provider key": ({"authorization": "Bearer sk-provider-alice", "x-keel-tenant": "byo"},
                         {"authorization": "Bearer sk-provider-bob", "x-keel-tenant": "byo"}),
    }[bob_differs_by]
    for headers in (alice_headers, bob_headers):  # a provider key is planned in full once the provider took it
        chat(keel, "Warm up.", [{"role": "user", "content": "hi"}], headers)
    alice: list[dict[str, Any]] = [{"role": "user", "content": "hello [[ramble 40]]"}]
    chat(keel, "Alice's prompt.", alice, alice_headers)
    alice.append({"role": "user", "content": "[[words 3]]"})  # an answer that does not echo the update
    chat(keel, "Alice's prompt.\n\n## Plan\nThe secret plan: zebra-tango.", alice, alice_headers)
    assert "zebra-tango" in str(bodies(standin)[-1]["messages"][-1]), "Alice's change, as an update"
    bob = [*alice, {"role": "user", "content": "what is the plan?"}]
    chat(keel, "Bob's prompt.", bob, bob_headers)
    sent = str(bodies(standin)[-1])
    assert "zebra-tango" not in sent and upstream_system(standin).startswith("Bob's prompt.")


def test_a_conversation_id_narrows_and_never_widens(keel: ServerThread, standin: ServerThread) -> None:
    """Two end users of one key, no user id, both sending X-Keel-Conversation: 1 and the same
    opener: B's request carries B's own system prompt, never A's."""
    same = {"x-keel-conversation": "1"}
    chat(keel, "A's prompt with A's secret zebra-tango.", [{"role": "user", "content": "hi"}], same)
    chat(keel, "B's prompt.", [{"role": "user", "content": "hi"}], same)
    assert upstream_system(standin).startswith("B's prompt.") and "zebra-tango" not in str(bodies(standin)[-1])


def test_clock_shaped_values_never_join_callers_without_ids(keel: ServerThread, standin: ServerThread) -> None:
    """Callers whose prompts differ only in a time-shaped value share nothing without an id."""
    for value in ("10:00:01", "2026-12-06T10:00:01Z", "+05:30", "1733479201"):
        chat(keel, f"Account pin {value}. You help.", [{"role": "user", "content": "hi"}])
        chat(keel, "Account pin 11:22:33. You help." if ":" in value else "Account pin 99. You help.",
             [{"role": "user", "content": "hi"}])
        assert value not in str(bodies(standin)[-1]), value


def test_a_regeneration_after_an_edited_system_prompt_delivers_the_edit(keel: ServerThread,
                                                                        standin: ServerThread) -> None:
    """The client regenerates an answer after editing its system prompt: the model hears the edit."""
    history: list[dict[str, Any]] = [{"role": "user", "content": "hi [[ramble 40]]"}]
    chat(keel, "Rules: be terse.", history)
    history.append({"role": "user", "content": "and now?"})
    chat(keel, "Rules: be terse.", history)
    history.pop()  # the client drops the answer to regenerate it, under an edited prompt
    chat(keel, "Rules: be terse.\n\n## Tone\nAlways answer in French.", history)
    assert "French" in str(bodies(standin)[-1]["messages"][-1])


def test_records_a_proof_no_longer_covers_are_not_reused(keel: ServerThread, standin: ServerThread) -> None:
    """A victim's answer proves its conversation until the same answer is relayed elsewhere (a
    deterministic reply the attacker elicits under another prompt). From then on, a copy of the
    victim's history (its other answers short and guessable) under the victim's first prompt
    reuses nothing the victim said under another prompt: only records written under that exact
    prompt are reused without proof."""
    victim: list[dict[str, Any]] = [{"role": "user", "content": "[[words 40]]"}]
    chat(keel, "Base prompt.", victim)
    private = "Base prompt.\n\n## Private\nThe vault code is zebra-tango."
    victim.append({"role": "user", "content": "[[words 3]]"})  # answers that do not echo the update
    chat(keel, private, victim)
    assert "zebra-tango" in str(bodies(standin)[-1]["messages"][-1]), "the victim's change, as an update"
    victim.append({"role": "user", "content": "[[words 2]]"})
    chat(keel, private, victim)
    chat(keel, "Another prompt.", [{"role": "user", "content": "[[words 40]]"}])  # the answer is now shared
    copy = [dict(m) for m in victim[:-1]]  # the victim's history up to its last message, resent
    chat(keel, "Base prompt.", copy)
    assert "zebra-tango" not in str(bodies(standin)[-1])


class SlowProofs:
    """A real store whose writes of what Keel relayed take a while (a loaded store)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def set(self, key: str, value: bytes, ttl: float | None = None) -> None:
        if ":proof:" in key:
            await asyncio.sleep(0.25)
        await self.inner.set(key, value, ttl)


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_the_next_request_never_overtakes_the_record_of_the_answer(
        standin: ServerThread, start_keel: Callable[..., ServerThread], tmp_path: Any, stream: bool) -> None:
    """The client sends its next turn the moment it has the answer: the answer's record is
    written before the answer's last bytes go out, so the next turn is proven even on a slow store."""
    from proxy.stores.sqlite import SqliteStore

    keel = start_keel(keel_config(tenant(standin.url + "/v1", **ON)),
                      store=SlowProofs(SqliteStore(str(tmp_path / "k.db"))))
    history: list[dict[str, Any]] = [{"role": "user", "content": "hi [[ramble 40]]"}]
    body = {"model": "m", "stream": stream, "messages": [{"role": "system", "content": "Now: 10:00:01"}, *history]}
    with httpx.stream("POST", keel.url + "/v1/chat/completions", headers=AUTH, json=body) as reply:
        raw = reply.read()
    if stream:
        text = "".join(e["choices"][0]["delta"].get("content") or "" for e in
                       (json.loads(line[6:]) for line in raw.decode().splitlines()
                        if line.startswith("data: {")) if e.get("choices"))
    else:
        text = json.loads(raw)["choices"][0]["message"]["content"]
    history += [{"role": "assistant", "content": text}, {"role": "user", "content": "next"}]
    chat(keel, "Now: 10:00:59", history)
    assert "10:00:01" in upstream_system(standin), "proven by the answer just relayed"


def test_a_hidden_search_never_returns_under_another_catalog(standin: ServerThread,
                                                             start_keel: Callable[..., ServerThread]) -> None:
    """Keel answered a tool_search from one tools array; the next request of the same
    conversation comes with another array: the stored search answer (the schemas it showed) is
    not spliced back, so no tool the client no longer sends reaches the provider."""
    from conftest import small_catalog

    from proxy.standin.script import hidden_call

    keel = start_keel(keel_config(tenant(standin.url + "/v1", tools={"enabled": True, "stability": "per_turn"},
                                         **ON)))
    private = {"type": "function", "function": {
        "name": "private_lookup", "description": "Look up the vault records (code zebra-tango).",
        "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}}
    history: list[dict[str, Any]] = [{"role": "user", "content": "look it up " + hidden_call("private_lookup")}]
    answer = chat(keel, "You help.", history, tools=[*small_catalog(), private])
    assert answer["tool_calls"][0]["function"]["name"] == "private_lookup"
    assert any("zebra-tango" in str(b) and b["messages"][-1].get("role") == "tool" for b in bodies(standin)), \
        "the search answer showed the private tool"
    history.append({"role": "tool", "tool_call_id": answer["tool_calls"][0]["id"], "content": "found nothing"})
    chat(keel, "You help.", history, tools=small_catalog())  # the private tool is gone from the client's array
    assert "zebra-tango" not in str(bodies(standin)[-1])


def test_a_long_reply_two_callers_got_proves_nothing(keel: ServerThread, standin: ServerThread) -> None:
    """A long reply the app gives everyone (here the stand-in's deterministic words) was relayed to
    the victim first; once another caller of the key got it too, it proves neither's conversation:
    an attacker who got it as another user, then claims the victim's user id, continues nothing."""
    victim: list[dict[str, Any]] = [{"role": "user", "content": "[[words 40]]"}]
    chat(keel, "Base.", victim, {"x-keel-user": "victim"})
    victim.append({"role": "user", "content": "[[words 3]]"})
    chat(keel, "Base.\n\n## Private\nThe vault code is zebra-tango.", victim, {"x-keel-user": "victim"})
    attacker: list[dict[str, Any]] = [{"role": "user", "content": "[[words 40]]"}]
    chat(keel, "Base.", attacker, {"x-keel-user": "attacker"})  # the same long reply, to another caller
    copy = [*victim, {"role": "user", "content": "what is the code?"}]  # the victim's turns, guessed
    chat(keel, "Base.", copy, {"x-keel-user": "victim"})  # claiming the victim's user id on the same key
    assert "zebra-tango" not in str(bodies(standin)[-1])
