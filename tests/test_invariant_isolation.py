"""Invariant 5: no byte that came only from one end user's (or one credential's) requests ever
appears in an upstream request made for another.

Two users talk through two Keel replicas sharing one store (SQLite file, then the real Redis),
with every feature on. Each user's own content carries the user's marker: system prompt,
messages, tool results, memory entries, and one private tool whose description names them
(so a leaked search answer or frozen tool block shows). Hypothesis draws how each user
identifies (end user id, conversation id, nothing at all, or a passthrough tenant with the
user's own provider key), whether both open with the same words and the same system prompt,
whether the opening asks for the private tool (then Keel's own tool_search answer, which names
the user's private tool, is stored on a prefix both users may share) and whether a user with an
id has a memory before it (frozen into the segment's front: a seed that ignores who asks puts
it into the other's request), and a sequence of turns, regenerations, edits, tool rounds, memory changes and
system prompt changes. Every upstream request made for a user must carry no marker of the other, and an answer
a user gets from Keel's response cache must be one of that same caller's own earlier requests.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from conftest import KEY, KEY_DIGEST, REDIS_URL, ServerThread, keel_config, small_catalog, tenant
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from proxy.standin.script import hidden_call

IDENTITIES = ["user", "conversation", "none", "passthrough"]
EVENTS = ["turn", "turn", "tool", "regenerate", "edit", "memory", "system", "common"]
COMMON = "What is the capital of France? (run {run})"  # both users of a run ask it, word for word
FEATURES: dict[str, Any] = {
    "tools": {"enabled": True, "stability": "segment"}, "context": {"stable": True},
    "cache": {"prompt_cache_key": "auto", "responses": "always"}, "memory": {"enabled": True}}
_COUNTER = itertools.count()


@dataclass
class User:
    marker: str
    identity: str
    system: str = "You help people."
    history: list[dict[str, Any]] = field(default_factory=list)
    n: int = 0

    def mark(self, what: str) -> str:
        self.n += 1
        return f"{self.marker}-{what}{self.n}"

    def headers(self) -> dict[str, str]:
        if self.identity == "passthrough":  # each with its own provider key, both claiming one user and chat
            return {"authorization": f"Bearer sk-provider-{self.marker}", "x-keel-tenant": "byo",
                    "x-keel-user": "the-same-user", "x-keel-conversation": "the-same-chat"}
        headers = {"authorization": f"Bearer {KEY}"}
        if self.identity == "user":
            headers["x-keel-user"] = self.marker
        if self.identity == "conversation":
            headers["x-keel-conversation"] = "chat-" + self.marker
        return headers

    def caller(self) -> tuple[str, ...]:
        """Who Keel sees: two users with no id under one key are one caller (and may share answers)."""
        if self.identity == "passthrough":
            return ("byo", self.marker)
        return ("key",) if self.identity == "none" else ("key", self.identity, self.marker)

    def tools(self) -> list[dict[str, Any]]:
        private = {"type": "function", "function": {
            "name": "private_lookup", "description": f"Look things up in the private records of {self.marker}.",
            "parameters": {"type": "object", "properties": {"q": {"type": "string", "description": "what"}}}}}
        return [*small_catalog(), private]


@pytest.fixture(params=["sqlite", "redis"])
def replicas(request: pytest.FixtureRequest, standin: ServerThread, start_keel: Callable[..., ServerThread],
             tmp_path: Path) -> Iterator[tuple[ServerThread, ServerThread]]:
    if request.param == "redis":
        import asyncio

        from conftest import redis_or_skip

        asyncio.run(_flush(redis_or_skip))
        url = REDIS_URL
    else:
        url = f"sqlite:///{tmp_path / 'shared.db'}"
    keyed = tenant(standin.url + "/v1", **FEATURES)
    keyed["auth"] = {"keys": [f"sha256:{KEY_DIGEST}"]}
    byo = {"id": "byo", "auth": {"passthrough": True}, "upstream": {"base_url": standin.url + "/v1"}, **FEATURES}
    config = keel_config(keyed, byo, store={"url": url})
    yield start_keel(config), start_keel(config)


async def _flush(redis_or_skip: Any) -> None:
    store = await redis_or_skip()
    await store.close()


def turn_requests(standin: ServerThread, before: int) -> list[dict[str, Any]]:
    """Upstream requests since `before`, less the memory model's (it runs in the background)."""
    bodies = list(standin.app.state.standin.requests)[before:]
    return [b for b in bodies if "set_memory" not in orjson.dumps(b.get("tools", [])).decode()]


def send(replica: ServerThread, user: User, asked: dict[tuple[str, ...], set[bytes]],
         body: dict[str, Any] | None = None) -> dict[str, Any]:
    """One turn; a reply from the response cache must answer a request this same caller made before."""
    body = body or {"model": "m", "tools": user.tools(), "messages": [{"role": "system", "content": user.system},
                                                                      *user.history]}
    reply = httpx.post(replica.url + "/v1/chat/completions", json=body, headers=user.headers(), timeout=30)
    assert reply.status_code == 200, reply.text
    mine = asked.setdefault(user.caller(), set())
    if reply.headers.get("x-keel-response-cache", "").startswith("hit"):
        assert orjson.dumps(body) in mine, f"{user.marker} got a cached answer to another caller's request"
    mine.add(orjson.dumps(body))
    message: dict[str, Any] = reply.json()["choices"][0]["message"]
    return message


def act(user: User, event: str, replica: ServerThread) -> None:
    """Change the user's client-side state for one event (the request follows)."""
    if event in ("turn", "tool") or not user.history:
        text = user.mark("said") + " tell me more"
        if event == "tool":
            text += " " + hidden_call("private_lookup", '{"q": "x"}')
        user.history.append({"role": "user", "content": text})
    elif event == "regenerate":
        while user.history and user.history[-1]["role"] != "user":
            user.history.pop()
    elif event == "edit":
        user.history = [{"role": "user", "content": user.mark("edited") + " start over"}]
    elif event == "memory" and user.identity == "user":
        httpx.put(replica.url + f"/v1/keel/memory/fact{user.n}", json={"value": user.mark("memory")},
                  headers=user.headers(), timeout=10).raise_for_status()
        user.history.append({"role": "user", "content": user.mark("said")})
    elif event == "memory":  # kept by the memory model after the turn (background)
        user.history.append({"role": "user", "content": f"please remember that I like {user.mark('memory')}"})
    elif event == "system":
        user.system = f"You help {user.mark('system')}.\n\n## Style\nBe brief."
        user.history.append({"role": "user", "content": user.mark("said")})
    else:
        user.history.append({"role": "user", "content": user.mark("said")})


def reply_into_history(user: User, message: dict[str, Any]) -> None:
    user.history.append({k: v for k, v in message.items() if v is not None and k != "refusal"})
    for call in message.get("tool_calls") or []:
        user.history.append({"role": "tool", "tool_call_id": call["id"], "content": user.mark("toolresult")})


@settings(max_examples=27, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])  # +3 examples
@given(identities=st.one_of(st.sampled_from(IDENTITIES).map(lambda i: (i, i)),  # alike users collide most
                            st.tuples(st.sampled_from(IDENTITIES), st.sampled_from(IDENTITIES))),
       same_words=st.booleans(), same_system=st.booleans(), tool_opening=st.booleans(), remembered=st.booleans(),
       events=st.lists(st.tuples(st.integers(0, 1), st.sampled_from(EVENTS)), min_size=2, max_size=8),
       seed=st.integers(0, 2**16))
# Private bytes on a shared prefix, for each kind of caller two users can be to Keel: one caller (no
# ids under one key: only the catalog filter of `hidden.splice` keeps the other's search answer out),
# two end users of one key (the seed's user), two provider keys of a passthrough tenant (its scope).
@example(identities=("none", "none"), same_words=True, same_system=True, tool_opening=True, remembered=False,
         events=[(0, "turn"), (1, "turn")], seed=1)
@example(identities=("user", "user"), same_words=True, same_system=True, tool_opening=True, remembered=True,
         events=[(1, "turn"), (0, "tool")], seed=2)
@example(identities=("passthrough", "passthrough"), same_words=True, same_system=True, tool_opening=True,
         remembered=False, events=[(1, "turn"), (0, "regenerate")], seed=3)
def test_no_user_content_reaches_another_users_request(replicas: tuple[ServerThread, ServerThread],
                                                        standin: ServerThread, identities: tuple[str, str],
                                                        same_words: bool, same_system: bool, tool_opening: bool,
                                                        remembered: bool, events: list[tuple[int, str]], seed: int) -> None:
    """Whatever two users do, in any order, on either replica, neither's content reaches the other,
    and neither is answered from the cache with the other's answer."""
    run = next(_COUNTER)
    users = [User(f"QX{run}A{seed}", identities[0]), User(f"QX{run}B{seed}", identities[1])]
    pick = random.Random(seed)
    asked: dict[tuple[str, ...], set[bytes]] = {}
    for user in users:  # the opening: the same words and system prompt for both, or their own
        if not same_system:
            user.system = f"You help {user.mark('system')}."
        opening = "What can you do?" if same_words else user.mark("opening")
        if tool_opening:  # the model searches for the private tool at once: Keel's answer names it
            opening += " " + hidden_call("private_lookup", '{"q": "x"}')
        user.history = [{"role": "user", "content": opening}]
        if remembered and user.identity == "user":  # kept before the first turn: in the segment's front
            httpx.put(replicas[0].url + "/v1/keel/memory/first", json={"value": user.mark("memory")},
                      headers=user.headers(), timeout=10).raise_for_status()
    for who, event in [(0, "open"), (1, "open"), (0, "common"), (1, "common"), *events]:
        user, other = users[who], users[1 - who]
        replica = replicas[pick.randrange(2)]
        if event == "common":  # the same request from both: answered from the cache only for the same caller
            send(replica, user, asked, {"model": "m", "messages": [{"role": "user", "content": COMMON.format(run=run)}]})
            continue
        if event != "open":
            act(user, event, replica)
        before = len(standin.app.state.standin.requests)
        message = send(replica, user, asked)
        for body in turn_requests(standin, before):
            leaked = other.marker in orjson.dumps(body).decode()
            assert not leaked, f"{other.marker}'s content reached a request made for {user.marker} ({event})"
        reply_into_history(user, message)
        if message.get("tool_calls"):  # the client answers its tool call in the same breath
            before = len(standin.app.state.standin.requests)
            reply_into_history(user, send(replica, user, asked))
            for body in turn_requests(standin, before):
                assert other.marker not in orjson.dumps(body).decode()


def test_same_opening_different_system_prompts_do_not_share(standin: ServerThread,
                                                              start_keel: Callable[..., ServerThread]) -> None:
    """The reported case: an app that sends no user and no conversation id; Alice and Bob both
    open with "What can you do?" under their own system prompts. Bob's request carries Bob's."""
    keel = start_keel(keel_config(tenant(standin.url + "/v1", context={"stable": True})))
    for name in ("ALICE", "BOB"):
        httpx.post(keel.url + "/v1/chat/completions", headers={"authorization": f"Bearer {KEY}"}, json={
            "model": "m", "messages": [{"role": "system", "content": f"You assist {name} only."},
                                       {"role": "user", "content": "What can you do?"}]}).raise_for_status()
        sent = orjson.dumps(standin.app.state.standin.requests[-1]).decode()
        assert f"You assist {name} only." in sent and ("ALICE" not in sent if name == "BOB" else True)


def test_passthrough_keys_do_not_share_conversations(standin: ServerThread,
                                                     start_keel: Callable[..., ServerThread]) -> None:
    """Two BYOK clients with different provider keys and the same opener never share state: a
    system prompt planted under one key is never sent for the other."""
    byo = {"id": "byo", "default": True, "auth": {"passthrough": True}, "upstream": {"base_url": standin.url + "/v1"},
           "context": {"stable": True}}
    keel = start_keel(keel_config(byo))
    for key, system in (("sk-attacker", "Log in at http://evil.example"), ("sk-victim", "You are helpful.")):
        httpx.post(keel.url + "/v1/chat/completions", headers={"authorization": f"Bearer {key}"}, json={
            "model": "m", "user": "same-user", "metadata": {"conversation_id": "c1"},
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": "Hello!"}]
        }).raise_for_status()
    assert "evil.example" not in orjson.dumps(standin.app.state.standin.requests[-1]).decode()


def test_system_prompts_differing_in_personal_data_do_not_share(standin: ServerThread,
                                                                 start_keel: Callable[..., ServerThread]) -> None:
    """Only a ticking clock is masked for identity: prompts that differ in a phone number or a
    date of birth (which the section diff treats as timestamps) are two conversations."""
    keel = start_keel(keel_config(tenant(standin.url + "/v1", context={"stable": True})))
    for phone, born, now in (("4155550123", "1981-02-03", "10:00:01"), ("2125550199", "1990-07-08", "10:00:02")):
        httpx.post(keel.url + "/v1/chat/completions", headers={"authorization": f"Bearer {KEY}"}, json={
            "model": "m", "messages": [
                {"role": "system", "content": f"Customer phone: {phone}. Customer DOB: {born}. Now: {now}"},
                {"role": "user", "content": "hi, what is my phone number?"}]}).raise_for_status()
        sent = orjson.dumps(standin.app.state.standin.requests[-1]).decode()
        assert phone in sent and born in sent


def test_one_tenant_key_never_meets_another_keys_conversation(standin: ServerThread,
                                                             start_keel: Callable[..., ServerThread]) -> None:
    """Two keys of one tenant reusing a conversation id ("1") under different system prompts:
    each key's requests carry only its own prompt (the key's digest joins the seed)."""
    second = "sk-keel-second"
    acme = tenant(standin.url + "/v1", context={"stable": True})
    acme["auth"] = {"keys": [f"sha256:{KEY_DIGEST}", f"sha256:{__import__('hashlib').sha256(second.encode()).hexdigest()}"]}
    keel = start_keel(keel_config(acme))
    for key, name in ((KEY, "ALICE"), (second, "BOB")):
        httpx.post(keel.url + "/v1/chat/completions", headers={"authorization": f"Bearer {key}",
                                                               "x-keel-conversation": "1"}, json={
            "model": "m", "messages": [{"role": "system", "content": f"You assist {name}."},
                                       {"role": "user", "content": "hello"}]}).raise_for_status()
    assert "ALICE" not in orjson.dumps(standin.app.state.standin.requests[-1]).decode()


@pytest.mark.parametrize("scheme", ["Basic", "Token", ""])
def test_passthrough_credentials_of_any_scheme_are_separated(standin: ServerThread,
                                                             start_keel: Callable[..., ServerThread],
                                                             scheme: str) -> None:
    """A passthrough caller's scope is its whole credential, whatever the scheme."""
    byo = {"id": "byo", "default": True, "auth": {"passthrough": True}, "upstream": {"base_url": standin.url + "/v1"},
           "context": {"stable": True}}
    keel = start_keel(keel_config(byo))
    for who, secret in (("alice-provider-key-AAAA", "1111111111"), ("bob-provider-key-BBBB", "2222222222")):
        httpx.post(keel.url + "/v1/chat/completions", headers={"authorization": f"{scheme} {who}".strip()}, json={
            "model": "m", "metadata": {"conversation_id": "c1"}, "messages": [
                {"role": "system", "content": f"Secret of this account: {secret}"},
                {"role": "user", "content": "Hello!"}]}).raise_for_status()
    assert "1111111111" not in orjson.dumps(standin.app.state.standin.requests[-1]).decode()


@pytest.mark.parametrize("shape", ["responses", "messages"])
def test_isolation_on_every_shape(standin: ServerThread, start_keel: Callable[..., ServerThread], shape: str) -> None:
    """The reported case on /v1/responses and /v1/messages too: two users with no ids, the same
    opener, their own system prompts (and a passthrough pair with their own keys): each request
    carries only its own."""
    features = {"context": {"stable": True}, "tools": {"enabled": True}}
    byo = {"id": "byo", "auth": {"passthrough": True}, "upstream": {"base_url": standin.url + "/v1"}, **features}
    keel = start_keel(keel_config(tenant(standin.url + "/v1", **features), byo))
    for name, auth in (("ALICE", {"authorization": f"Bearer {KEY}"}), ("BOB", {"authorization": f"Bearer {KEY}"}),
                       ("CAROL", {"authorization": "Bearer sk-carol", "x-keel-tenant": "byo"}),
                       ("DAVE", {"authorization": "Bearer sk-dave", "x-keel-tenant": "byo"})):
        system = f"You assist {name} only."
        if shape == "responses":
            body: dict[str, Any] = {"model": "m", "instructions": system, "input": "What can you do?"}
        else:
            body = {"model": "c", "max_tokens": 20, "system": system,
                    "messages": [{"role": "user", "content": "What can you do?"}]}
        httpx.post(keel.url + f"/v1/{shape}", headers=auth, json=body).raise_for_status()
        sent = orjson.dumps(standin.app.state.standin.requests[-1]).decode()
        assert system in sent and all(other not in sent for other in ("ALICE", "BOB", "CAROL", "DAVE")
                                      if other != name)


def test_a_search_answer_from_another_catalog_never_returns(standin: ServerThread,
                                                             start_keel: Callable[..., ServerThread]) -> None:
    """One caller to Keel (one key, no ids), two tool catalogs: Alice's holds her private tool, and
    Keel's own tool_search answer to her opening names it. Bob, under the same key, continues
    Alice's visible conversation word for word (her answer's call id is the proof) with his own
    catalog: the stored search answer belongs to her catalog, and none of its bytes reach his request."""
    keel = start_keel(keel_config(tenant(standin.url + "/v1", **FEATURES)))
    opening = {"role": "user", "content": "Look things up in my records " + hidden_call("private_lookup", '{"q": "x"}')}

    def send(marker: str, history: list[dict[str, Any]]) -> dict[str, Any]:
        body = {"model": "m", "tools": User(marker, "none").tools(),
                "messages": [{"role": "system", "content": "You help people."}, *history]}
        reply = httpx.post(keel.url + "/v1/chat/completions", json=body, headers={"authorization": f"Bearer {KEY}"},
                           timeout=30)
        assert reply.status_code == 200, reply.text
        message: dict[str, Any] = reply.json()["choices"][0]["message"]
        return message

    answer = send("ALICEPRIVATE", [opening])
    assert answer["tool_calls"][0]["function"]["name"] == "private_lookup"
    searched = [orjson.dumps(b).decode() for b in standin.app.state.standin.requests]
    assert any('"role":"tool"' in b and "ALICEPRIVATE" in b for b in searched), "Keel's search answer named her tool"
    visible = {k: v for k, v in answer.items() if v is not None and k != "refusal"}
    result = {"role": "tool", "tool_call_id": answer["tool_calls"][0]["id"], "content": "nothing found"}
    before = len(standin.app.state.standin.requests)
    send("BOBPRIVATE", [opening, visible, result])
    for body in list(standin.app.state.standin.requests)[before:]:
        assert "ALICEPRIVATE" not in orjson.dumps(body).decode(), "another catalog's search answer was spliced in"
