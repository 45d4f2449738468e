"""The request spine's pieces on their own (no servers, no network): the store breaker, the SSE
parser, the relay, the hidden-exchange splice, message meaning and proofs, the authenticator.
`make test-fast` runs this tier in seconds; the end-to-end tests sit on top of it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest

from proxy.chain import Meanings, meaning
from proxy.config import parse_config
from proxy.conversations import TurnRecord
from proxy.errors import AuthenticationError, UpstreamConnectError
from proxy.hidden import HiddenExchange, fingerprint, splice
from proxy.ingress import Authenticator
from proxy.proofs import MIN_SECRET_CHARS, SEEN, SHARED, Fragment, Proofs, fragments, random_id, sampled
from proxy.relay import Outcome, relay
from proxy.sse import EventParser, EventTooLargeError
from proxy.stores import StoreError
from proxy.stores.guard import Breaker, GuardedStore

# --- the store breaker -------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_breaker_opens_after_threshold_then_allows_one_trial_per_cooldown() -> None:
    clock, changes = Clock(), []
    breaker = Breaker(threshold=2, cooldown=5, clock=clock, on_change=changes.append)
    breaker.failure()
    assert breaker.closed and breaker.allow()
    breaker.failure()
    assert not breaker.closed and not breaker.allow() and changes == [False]
    clock.now += 5
    assert breaker.allow() and not breaker.allow(), "one trial, not two"
    breaker.failure()  # the trial failed: another cooldown
    clock.now += 4.9
    assert not breaker.allow()
    clock.now += 0.1
    assert breaker.allow()
    breaker.success()
    assert breaker.closed and changes == [False, True]


class SlowStore:
    def __init__(self, delay: float) -> None:
        self.delay = delay

    async def get(self, key: str) -> bytes | None:
        await asyncio.sleep(self.delay)
        return b"v"


async def test_guarded_store_turns_overruns_into_store_errors_and_opens() -> None:
    breaker = Breaker(threshold=2, cooldown=60)
    store = GuardedStore(SlowStore(0.05), 0.01, breaker)  # type: ignore[arg-type]
    for _ in range(2):
        with pytest.raises(StoreError, match="budget"):
            await store.get("k")
    with pytest.raises(StoreError, match="circuit open"):
        await store.get("k")
    assert not store.healthy


# --- SSE -----------------------------------------------------------------------------------------


def test_sse_events_split_anywhere_and_every_line_ending() -> None:
    stream = b'data: {"a":1}\n\n: keep-alive\n\nevent: x\r\ndata: two\r\n\r\ndata: [DONE]\r\r'
    for cut in range(1, len(stream)):
        parser = EventParser()
        events = [*parser.feed(stream[:cut]), *parser.feed(stream[cut:])]
        assert [e.data for e in events] == [b'{"a":1}', None, b"two", b"[DONE]"], cut
        assert events[0].json() == {"a": 1} and events[-1].done


def test_an_event_that_never_ends_is_an_error_not_memory() -> None:
    parser = EventParser(max_event_bytes=100)
    with pytest.raises(EventTooLargeError):
        for _ in range(20):
            list(parser.feed(b"data: " + b"x" * 10))


# --- the relay -----------------------------------------------------------------------------------


class FakeUpstream:
    """An upstream reply made of chunks; `fail` raises a broken connection after them."""

    def __init__(self, chunks: list[bytes], content_type: str, fail: bool = False, status: int = 200,
                 extra: list[tuple[str, str]] | None = None) -> None:
        self.status = status
        self.headers = [("content-type", content_type), ("x-request-id", "up-1"), ("connection", "close"),
                        *(extra or [])]
        self.chunks, self.fail, self.closed = chunks, fail, False

    async def iter_raw(self) -> AsyncIterator[bytes]:
        for chunk in self.chunks:
            yield chunk
        if self.fail:
            raise UpstreamConnectError("reset", code="upstream_reset")

    async def read(self) -> bytes:
        return b"".join(self.chunks)

    async def aclose(self) -> None:
        self.closed = True


async def _body(response: Any) -> bytes:
    if hasattr(response, "body_iterator"):
        return b"".join([c async for c in response.body_iterator])
    return bytes(response.body)


async def test_relay_passes_json_whole_and_drops_hop_by_hop_headers() -> None:
    outcomes: list[Outcome] = []
    upstream = FakeUpstream([b'{"ok":', b" true}"], "application/json")
    response = await relay(upstream, "rid", outcomes.append)  # type: ignore[arg-type]
    assert await _body(response) == b'{"ok": true}' and "connection" not in response.headers
    assert response.headers["x-request-id"] == "up-1" and response.headers["x-keel-request-id"] == "rid"
    assert outcomes[0].status == 200 and outcomes[0].bytes_out == 12 and upstream.closed


async def test_relay_ends_a_broken_stream_with_one_error_event() -> None:

    outcomes: list[Outcome] = []
    upstream = FakeUpstream([b'data: {"x":1}\n\n', b'data: {"y"'], "text/event-stream", fail=True)
    response = await relay(upstream, "rid", outcomes.append, expect_end=True)  # type: ignore[arg-type]
    body = await _body(response)
    assert body.startswith(b'data: {"x":1}\n\ndata: {"y"\n\ndata: {"error"') and body.count(b'"error"') == 1
    assert outcomes[0].error == "upstream_reset"


async def test_relay_reports_a_stream_cut_before_its_end_marker() -> None:

    outcomes: list[Outcome] = []
    upstream = FakeUpstream([b'data: {"x":1}\n\n'], "text/event-stream")
    response = await relay(upstream, "rid", outcomes.append, expect_end=True)  # type: ignore[arg-type]
    assert b"upstream_stream_incomplete" in await _body(response)
    complete = FakeUpstream([b'data: {"x":1}\n\n', b"data: [DONE]\n\n"], "text/event-stream")
    again = await relay(complete, "rid", outcomes.append, expect_end=True)  # type: ignore[arg-type]
    assert b"error" not in await _body(again)


# --- hidden exchanges ----------------------------------------------------------------------------


def _record(position: int, answer: dict[str, Any], catalog: str = "cat") -> TurnRecord:
    exchange = HiddenExchange(before=[{"role": "assistant", "tool_calls": [{"id": "s1"}]},
                                      {"role": "tool", "tool_call_id": "s1", "content": "found"}],
                              visible=None, after=[], answer=fingerprint(answer), catalog=catalog)
    return TurnRecord("h", "seg", "conv", position, hidden_exchanges=(exchange,))


def test_splice_puts_an_exchange_back_before_the_answer_it_led_to() -> None:
    answer = {"role": "assistant", "content": "done"}
    messages = [{"role": "user", "content": "hi"}, answer, {"role": "user", "content": "more"}]
    out = splice(messages, [_record(0, answer)], "cat")
    assert [m["role"] for m in out] == ["user", "assistant", "tool", "assistant", "user"]
    assert splice(messages, [_record(0, answer)], "another catalog") == messages, "another catalog: nothing"
    other = {"role": "assistant", "content": "a regenerated answer"}
    assert splice([messages[0], other], [_record(0, answer)], "cat") == [messages[0], other]
    assert splice(messages[:1], [_record(0, answer)], "cat") == messages[:1], "being generated: nothing yet"


# --- meaning and proofs ----------------------------------------------------------------------------


def test_a_message_means_the_same_in_every_transport_form() -> None:
    plain = {"role": "assistant", "content": "hi", "tool_calls": [{"id": "c1", "type": "function",
                                                                   "function": {"name": "f", "arguments": '{"n": 52}'}}]}
    reserialized = {"content": [{"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}}],
                    "role": "assistant", "refusal": None, "annotations": [],
                    "tool_calls": [{"function": {"arguments": '{"n":52.0}', "name": "f"}, "id": "c1", "index": 0}]}
    assert meaning(plain) == meaning(reserialized)
    assert meaning(plain) != meaning({**plain, "content": "hi!"})
    assert Meanings.of([plain]).chain("a").links[0].hash != Meanings.of([plain]).chain("b").links[0].hash


def test_what_a_fragment_proves() -> None:
    long = {"role": "assistant", "content": "x" * MIN_SECRET_CHARS}
    assert [f.strong for f in fragments(long)] == [True]
    assert [f.strong for f in fragments({"role": "assistant", "content": "x" * (MIN_SECRET_CHARS - 1)})] == [False]
    assert [f.strong for f in fragments(long, sampled=False)] == [False]
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
    assert Proofs.proven("me", [a], [SHARED.encode()]) is None


# --- the authenticator ---------------------------------------------------------------------------


def _auth() -> Authenticator:
    import hashlib

    digest = "sha256:" + hashlib.sha256(b"sk-keel-a").hexdigest()
    config = parse_config({"store": {"url": "sqlite:///:memory:"}, "tenants": [
        {"id": "acme", "auth": {"keys": [digest]}, "upstream": {"base_url": "http://up/v1"}},
        {"id": "byo", "auth": {"passthrough": True}, "upstream": {"base_url": "http://up/v1"}}]}, "test")
    return Authenticator(config.tenants)


def test_a_keel_key_authenticates_its_tenant_and_never_goes_upstream() -> None:
    caller = _auth().authenticate({"authorization": "Bearer sk-keel-a"})
    assert caller.tenant.id == "acme" and caller.keyed and "sk-keel-a" not in orjson.dumps(
        dict(caller.upstream_credentials)).decode()
    assert _auth().authenticate({"api-key": "sk-keel-a"}).tenant.id == "acme"


def test_passthrough_callers_are_scoped_by_their_own_credential() -> None:
    one = _auth().authenticate({"authorization": "Bearer sk-provider-1", "x-keel-tenant": "byo"})
    two = _auth().authenticate({"authorization": "Bearer sk-provider-2", "x-keel-tenant": "byo"})
    assert one.tenant.id == "byo" and one.scope != two.scope and not one.keyed


def test_a_wrong_or_missing_key_is_a_401() -> None:
    with pytest.raises(AuthenticationError):
        _auth().authenticate({"authorization": "Bearer sk-keel-wrong"})
    with pytest.raises(AuthenticationError, match="missing"):
        _auth().authenticate({})
