"""proxy/proofs.py on its own: what a relayed reply proves about who continues a conversation."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from proxy.proofs import MIN_SECRET_CHARS, SEEN, SHARED, Fragment, Proofs, fragments, random_id, sampled


def test_a_long_sampled_reply_is_strong_a_short_or_repeatable_one_is_not() -> None:
    long = {"role": "assistant", "content": "x" * MIN_SECRET_CHARS}
    assert [f.strong for f in fragments(long)] == [True]
    assert [f.strong for f in fragments({"role": "assistant", "content": "x" * (MIN_SECRET_CHARS - 1)})] == [False]
    assert [f.strong for f in fragments(long, sampled=False)] == [False]


def test_a_fragment_is_what_the_reply_says_not_its_spacing() -> None:
    assert fragments({"role": "assistant", "content": " hi\n there "}) == fragments({"role": "assistant",
                                                                                    "content": "hi there"})


@pytest.mark.parametrize(("call_id", "name", "random"), [
    ("call_Bq7xW2mKp9LzR4tYc8VnD3sF", "f", True),  # OpenAI's
    ("toolu_01A09q90qw90lq917835lq9", "f", True),  # Anthropic's
    ("functions.lookup_order:0", "lookup_order", False),  # a model that names and numbers its calls
    ("call_00000000000000000001", "f", False),  # a counter
    ("call_lookup_order_lookup_order", "lookup_order", False),
])
def test_a_tool_call_id_proves_only_when_random(call_id: str, name: str, random: bool) -> None:
    assert random_id(call_id, name) is random


@pytest.mark.parametrize(("body", "again"), [
    ({}, False), ({"temperature": 1}, False), ({"temperature": 0.3}, True), ({"temperature": 0.0501}, True),
    ({"top_p": 0.0001}, True), ({"top_k": 1}, True), ({"seed": 42, "temperature": 0.9}, True), ({"n": 2}, True),
])
def test_an_answer_the_same_request_would_get_again_proves_nothing(body: dict[str, Any], again: bool) -> None:
    assert sampled(body) is not again


def test_the_newest_strong_unshared_answer_of_this_caller_proves() -> None:
    a, b = [Fragment("a", True)], [Fragment("b", True), Fragment("c", True)]
    assert Proofs.proven("me", [a, b], [b"me ns1", None, None]) == "ns1"
    assert Proofs.proven("me", [a, b], [SHARED.encode(), b"me ns2", None]) == "ns2"
    assert Proofs.proven("me", [a, b], [(SEEN + "me ns1").encode(), None, b"me ns3"]) == "ns3"
    assert Proofs.proven("me", [a], [b"another ns1"]) is None, "relayed to another caller"
    assert Proofs.proven("me", [a], [SHARED.encode()]) is None, "two conversations share it"


class DictStore:
    """The two calls `Proofs.record` makes, over a dict."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}

    async def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        return [self.data.get(k) for k in keys]

    async def set(self, key: str, value: bytes, ttl: float | None = None) -> None:
        self.data[key] = value


async def proven_after(*relays: tuple[str, str, bool], asking: str = "me") -> str | None:
    """Relay one fragment ("same text") as given (caller, namespace, strong), then ask what it proves."""
    store = DictStore()
    proofs = Proofs(store, 60)  # type: ignore[arg-type]
    for caller, namespace, strong in relays:
        await proofs.record("acme", caller, namespace, [Fragment("same text", strong)])
    answers = [[Fragment("same text", True)]]
    return Proofs.proven(asking, answers, await store.get_many(proofs.keys("acme", answers)))


async def test_what_a_recorded_fragment_proves() -> None:
    assert await proven_after(("me", "ns1", True)) == "ns1"
    assert await proven_after(("me", "ns1", True), asking="you") is None
    assert await proven_after(("me", "ns1", False)) is None, "weak: recorded as seen, proves nothing"
    assert await proven_after(("me", "ns1", False), ("me", "ns1", True)) == "ns1", "a strong copy later proves"
    assert await proven_after(("me", "ns1", True), ("me", "ns1", True)) == "ns1", "relayed again: still mine"
    assert await proven_after(("me", "ns1", True), ("you", "ns9", True)) is None, "another caller got it: shared"
    assert await proven_after(("me", "ns1", True), ("me", "ns2", True)) is None, "another conversation: shared"
    assert await proven_after(("you", "ns9", False), ("me", "ns1", True)) is None, "seen weak elsewhere first"
    assert await proven_after(("me", "ns1", True), ("you", "ns9", True), ("me", "ns1", True)) is None, \
        "once shared, always shared"
