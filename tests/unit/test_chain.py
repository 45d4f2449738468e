"""proxy/chain.py on its own: a message means the same in every transport form, and the seed
carries every part of who is asking, so two callers never share a chain."""

from __future__ import annotations

import pytest

from proxy.chain import Meanings, build_chain, caller_seed, chain_seed, meaning, namespace
from proxy.shapes.chat import CHAT
from proxy.shapes.messages import MESSAGES
from proxy.shapes.responses import RESPONSES

BASE = {"tenant": "acme", "user": "alice", "conversation": "c1", "scope": "key-digest", "cache_key": "k",
        "shape": "chat"}
SHAPES = {s.name: s for s in (CHAT, RESPONSES, MESSAGES)}


def seed(**changes: str | None) -> str:
    parts = {**BASE, **changes}
    return caller_seed(str(parts["tenant"]), parts["user"], parts["conversation"], scope=str(parts["scope"]),
                       cache_key=parts["cache_key"], tag=SHAPES[str(parts["shape"])].chain_tag)


@pytest.mark.parametrize(("part", "other"), [("tenant", "globex"), ("user", "bob"), ("user", None),
                                              ("conversation", "c2"), ("conversation", None), ("scope", "another-key"),
                                              ("scope", ""), ("cache_key", "k2"), ("cache_key", None),
                                              ("shape", "responses"), ("shape", "messages")])
def test_every_part_of_who_is_asking_changes_the_seed(part: str, other: str | None) -> None:
    assert seed(**{part: other}) != seed(), part


def test_parts_cannot_be_shifted_into_one_another() -> None:
    """Length-prefixed: tenant "a" with user "bc" is not tenant "ab" with user "c"."""
    assert seed(tenant="a", user="bc") != seed(tenant="ab", user="c")
    assert seed(user="", conversation="x") != seed(user="x", conversation="")


def test_a_namespace_is_the_caller_and_the_exact_system_prompt() -> None:
    assert namespace(seed(), "ctx1") != namespace(seed(), "ctx2") != namespace(seed(user="bob"), "ctx2")
    assert chain_seed("acme", "alice", "c1", scope="key-digest", cache_key="k", context="ctx1") == namespace(seed(),
                                                                                                             "ctx1")


def test_a_message_means_the_same_in_every_transport_form() -> None:
    plain = {"role": "assistant", "content": "hi", "tool_calls": [{"id": "c1", "type": "function",
                                                                   "function": {"name": "f", "arguments": '{"n": 52}'}}]}
    reserialized = {"content": [{"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}}],
                    "role": "assistant", "refusal": None, "annotations": [],
                    "tool_calls": [{"function": {"arguments": '{"n":52.0}', "name": "f"}, "id": "c1", "index": 0}]}
    assert meaning(plain) == meaning(reserialized)
    assert meaning(plain) != meaning({**plain, "content": "hi!"})
    assert meaning({"role": "tool", "content": "1"}) != meaning({"role": "tool", "content": 1})


def test_arguments_that_are_not_json_are_compared_as_text() -> None:
    call = {"role": "assistant", "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": "{not json"}}]}
    assert meaning(call) != meaning({**call, "tool_calls": [{"id": "c", "function": {"name": "f",
                                                                                     "arguments": "{not json!"}}]})


def test_system_messages_are_context_not_links() -> None:
    chain = build_chain("s", [{"role": "system", "content": "x"}, {"role": "user", "content": "hi"},
                              {"role": "assistant", "content": "yo"}, {"role": "developer", "content": "y"},
                              {"role": "user", "content": "more"}])
    assert [(link.index, link.role) for link in chain.links] == [(1, "user"), (2, "assistant"), (4, "user")]
    assert chain.newest_user is not None and chain.newest_user.index == 4
    assert build_chain("s", [{"role": "system", "content": "other"}, {"role": "user", "content": "hi"}]).links[0] == \
        chain.links[0]


def test_a_chain_extends_and_depends_on_its_seed_and_order() -> None:
    messages = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    one = Meanings.of(messages)
    assert one.chain("x").links[0].hash != one.chain("y").links[0].hash
    assert build_chain("x", messages[:1]).links == one.chain("x").links[:1], "a prefix has the prefix's hashes"
    assert build_chain("x", messages[::-1]).links[-1].hash != one.chain("x").links[-1].hash
