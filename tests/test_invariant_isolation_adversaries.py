"""Invariant 5 against adversaries who know a lot (issue 19, part 3): no byte of a victim's private
context reaches an upstream request made for someone else, whatever the adversary knows.

A victim talks through one of two replicas sharing a store (SQLite file or the real Redis), on a
shape hypothesis draws, with a system prompt whose private section (a unique marker) arrives on
its second turn as a context update; its answers are sampled ([[sample N]]: nobody replaying the
request gets them again). The adversary knows the app's template and the victim's opening and
later messages, shares the victim's credential (no user id) or sends the victim's conversation
id, replays the victim's whole history with every answer one byte off, or holds the victim's
real history as another end user, under another key or another tenant. The adversary never sends the marker, so any marker in
an upstream request made for the adversary is a leak.
"""

from __future__ import annotations

import hashlib
import itertools
import random
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from conftest import KEY, REDIS_URL, ServerThread, keel_config, tenant
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

SECOND = "sk-keel-second-key"
OTHER = "sk-keel-other-tenant"
FEATURES: dict[str, Any] = {"context": {"stable": True}, "cache": {"prompt_cache_key": "auto"},
                            "tools": {"enabled": True}}
TEMPLATE = "You are the ACME assistant. Answer briefly."
VICTIMS = ["none", "user", "conversation"]
ADVERSARIES = ["opener", "victim_id", "one_byte_off", "other_user", "other_key", "other_tenant"]
SHAPES = ["chat", "responses", "messages"]
_RUN = itertools.count()


def digest(key: str) -> str:
    return "sha256:" + hashlib.sha256(key.encode()).hexdigest()


@pytest.fixture(params=["sqlite", "redis"])
def replicas(request: pytest.FixtureRequest, standin: ServerThread, start_keel: Callable[..., ServerThread],
             tmp_path: Path) -> Iterator[tuple[ServerThread, ServerThread]]:
    if request.param == "redis":
        import asyncio

        from conftest import redis_or_skip

        async def flush() -> None:
            await (await redis_or_skip()).close()

        asyncio.run(flush())
        url = REDIS_URL
    else:
        url = f"sqlite:///{tmp_path / 'shared.db'}"
    acme = tenant(standin.url + "/v1", **FEATURES)
    acme["auth"] = {"keys": [digest(KEY), digest(SECOND)]}
    other = {**tenant(standin.url + "/v1", **FEATURES), "id": "other", "auth": {"keys": [digest(OTHER)]}}
    config = keel_config(acme, other, store={"url": url})
    yield start_keel(config), start_keel(config)


def body(shape: str, system: str, history: list[dict[str, str]]) -> tuple[str, dict[str, Any]]:
    if shape == "responses":
        return "/v1/responses", {"model": "m", "instructions": system, "input": history, "store": False}
    if shape == "messages":
        return "/v1/messages", {"model": "c", "max_tokens": 200, "system": system, "messages": history}
    return "/v1/chat/completions", {"model": "m", "messages": [{"role": "system", "content": system}, *history]}


def answer_text(shape: str, reply: dict[str, Any]) -> str:
    if shape == "responses":
        return str(reply["output"][0]["content"][0]["text"])
    if shape == "messages":
        return str(reply["content"][0]["text"])
    return str(reply["choices"][0]["message"]["content"])


def send(replica: ServerThread, shape: str, system: str, history: list[dict[str, str]],
         headers: dict[str, str]) -> str:
    path, payload = body(shape, system, history)
    reply = httpx.post(replica.url + path, json=payload, headers=headers, timeout=30)
    assert reply.status_code == 200, reply.text
    return answer_text(shape, reply.json())


def off_by_one_byte(text: str) -> str:
    return text[:-1] + ("x" if text[-1] != "x" else "y")


@settings(max_examples=24, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(victim=st.sampled_from(VICTIMS), adversary=st.sampled_from(ADVERSARIES), shape=st.sampled_from(SHAPES),
       seed=st.integers(0, 2**16))
def test_no_private_context_reaches_an_adversarys_request(replicas: tuple[ServerThread, ServerThread],
                                                          standin: ServerThread, victim: str, adversary: str,
                                                          shape: str, seed: int) -> None:
    marker = f"VICTIM{next(_RUN)}S{seed}PRIVATE"
    pick = random.Random(seed)
    auth = {"authorization": f"Bearer {KEY}", "anthropic-version": "2023-06-01"}
    victim_headers = dict(auth)
    if victim == "user":
        victim_headers["x-keel-user"] = f"victim-{seed}"
    if victim == "conversation":
        victim_headers["x-keel-conversation"] = f"chat-{seed}"
    private = f"{TEMPLATE}\n\n## Private\nThe account code is {marker}."
    opener = f"hello, I need help with order {seed} [[sample 40]]"
    later = ["[[sample 30]]", "and then? [[sample 20]]"]

    history: list[dict[str, str]] = [{"role": "user", "content": opener}]
    for n, system in enumerate((TEMPLATE, private, private)):
        if n:
            history.append({"role": "user", "content": later[n - 1]})
        text = send(replicas[pick.randrange(2)], shape, system, history, victim_headers)
        history.append({"role": "assistant", "content": text})
    assert marker in str(list(standin.app.state.standin.requests)[-1]), "the victim's own request has its context"

    if adversary == "opener":  # the same credential, the victim's guessable words, its own answers
        headers, script = dict(auth), [opener, *later]
    elif adversary == "victim_id":
        headers, script = {**auth, "x-keel-conversation": f"chat-{seed}"}, [opener, *later]
    elif adversary == "one_byte_off":  # the victim's whole history, every answer guessed one byte wrong
        headers = dict(victim_headers)
        script = [{**m, "content": off_by_one_byte(m["content"])} if m["role"] == "assistant" else m
                  for m in history]
    elif adversary == "other_user":  # the victim's real history, as another end user of the same key
        headers, script = {**auth, "x-keel-user": f"adversary-{seed}"}, list(history)
    else:  # the victim's real history, under another key of the tenant or another tenant's
        headers = {**auth, "authorization": f"Bearer {SECOND if adversary == 'other_key' else OTHER}"}
        script = list(history)

    before = len(standin.app.state.standin.requests)
    if isinstance(script[0], dict):  # a whole history at once, then one more turn
        mine: list[dict[str, str]] = [*script, {"role": "user", "content": "what is the account code?"}]
        send(replicas[pick.randrange(2)], shape, TEMPLATE, mine, headers)
    else:
        mine = []
        for text in script:
            mine.append({"role": "user", "content": str(text)})
            mine.append({"role": "assistant", "content": send(replicas[pick.randrange(2)], shape, TEMPLATE, mine,
                                                              headers)})
    for sent in list(standin.app.state.standin.requests)[before:]:
        assert marker not in orjson.dumps(sent).decode(), f"{adversary} got the victim's context ({victim}, {shape})"
