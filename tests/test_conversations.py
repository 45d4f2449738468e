"""Conversation identity: chains located by content across new, continued, edited and shared histories."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from conftest import REDIS_URL, redis_or_skip

from proxy.chain import Meanings, build_chain, caller_seed, chain_seed, context_digest
from proxy.conversations import Conversations, SegmentAnchor, TurnKind
from proxy.proofs import fragments, history_fragments
from proxy.stores import Store
from proxy.stores.redis import RedisStore
from proxy.stores.sqlite import SqliteStore

Msg = dict[str, Any]


def u(text: str) -> Msg:
    return {"role": "user", "content": text}


def a(text: str) -> Msg:
    return {"role": "assistant", "content": text}


SYSTEM = {"role": "system", "content": "You are helpful. Now: 12:00:01"}


LONG = ("Here is a long answer that no one could guess, drawn at random by the model: " * 3).strip()


class Client:
    """Plays a chat client and Keel around it: sends the history (Keel locates it and records the
    newest user message), and takes an answer (Keel records it as relayed to this caller)."""

    def __init__(self, convs: Conversations, tenant: str = "acme", user: str | None = "alice") -> None:
        self.convs, self.tenant, self.user = convs, tenant, user

    async def send(self, messages: list[Msg], conversation: str | None = None) -> Any:
        caller = caller_seed(self.tenant, self.user, conversation)
        system = "\n\n".join(m["content"] for m in messages if m["role"] == "system")
        location = await self.convs.locate(Meanings.of(messages), caller, context_digest(system),
                                           history_fragments(messages), conversation, self.tenant)
        if location.kind in (TurnKind.NEW, TurnKind.CONTINUED):
            await self.convs.write_turn(location.chain, self.convs.new_record(location))
        return location

    async def answer(self, location: Any, text: str) -> Msg:
        """The answer Keel relayed for a located turn."""
        message = a(text)
        await self.convs.proofs.record(self.tenant, location.caller, location.chain.seed, fragments(message))
        return message


@pytest.fixture
def convs(tmp_path: Path) -> Conversations:
    return Conversations(SqliteStore(str(tmp_path / "c.db")), ttl_seconds=3600)


async def test_new_then_continued(convs: Conversations) -> None:
    """A new chat opens a segment; its next turn continues it and sees the first record."""
    c = Client(convs)
    first = await c.send([SYSTEM, u("hi")])
    assert first.kind is TurnKind.NEW and first.records == ()
    second = await c.send([SYSTEM, u("hi"), a("hello"), u("weather?")])
    assert second.kind is TurnKind.CONTINUED
    assert second.segment == first.segment and second.conversation == first.conversation
    assert [r.position for r in second.records] == [1]


async def test_a_changed_system_prompt_continues_only_with_proof(convs: Conversations) -> None:
    """A changed system prompt (a clock line) continues the conversation when the history holds a
    long answer Keel relayed in it; with only a short, guessable answer it is a new conversation."""
    c = Client(convs)
    first = await c.send([SYSTEM, u("hi")])
    answer = await c.answer(first, LONG)
    later = await c.send([{"role": "system", "content": "Now: 12:05:09"}, u("hi"), answer, u("more")])
    assert later.kind is TurnKind.CONTINUED and later.segment == first.segment and later.proven
    short = await c.send([{"role": "system", "content": "Now: 12:05:09"}, u("hi"), a("hello"), u("more")])
    assert short.kind is TurnKind.NEW and short.chain.seed != first.chain.seed


async def test_key_order_does_not_matter(convs: Conversations) -> None:
    c = Client(convs)
    await c.send([u("hi")])
    reordered = await c.send([{"content": "hi", "role": "user"}, a("x"), u("y")])
    assert reordered.kind is TurnKind.CONTINUED


async def test_regeneration_writes_nothing_new(convs: Conversations) -> None:
    """The same history again is a regeneration: it finds the newest message's record."""
    c = Client(convs)
    await c.send([u("hi"), a("hello"), u("tell me a joke")])
    again = await c.send([u("hi"), a("hello"), u("tell me a joke")])
    assert again.kind is TurnKind.REGENERATED
    assert again.newest_record is not None and again.newest_record.position == 2


async def test_edit_branches_from_shared_prefix(convs: Conversations) -> None:
    """An edited second message keeps the first turn's record and plans its own."""
    c = Client(convs)
    first = await c.send([u("hi")])
    await c.send([u("hi"), a("hello"), u("weather in Oslo?")])
    edited = await c.send([u("hi"), a("hello"), u("weather in Bergen?")])
    assert edited.kind is TurnKind.CONTINUED and edited.segment == first.segment
    assert [r.position for r in edited.records] == [0]


async def test_fork_shares_prefix(convs: Conversations) -> None:
    """Two branches after the same prefix both see the shared records and keep their own."""
    c = Client(convs)
    await c.send([u("hi")])
    await c.send([u("hi"), a("hello"), u("branch A")])
    await c.send([u("hi"), a("hello"), u("branch B")])
    a_next = await c.send([u("hi"), a("hello"), u("branch A"), a("ok A"), u("more A")])
    b_next = await c.send([u("hi"), a("hello"), u("branch B"), a("ok B"), u("more B")])
    assert [r.position for r in a_next.records] == [0, 2] == [r.position for r in b_next.records]
    assert a_next.records[1].chain_hash != b_next.records[1].chain_hash


async def test_compaction_opens_new_segment(convs: Conversations) -> None:
    """A history whose prefix Keel never saw (a summary replacing old turns) opens a new segment."""
    c = Client(convs)
    first = await c.send([u("hi"), a("hello"), u("long chat")])
    compacted = await c.send([u("Summary of earlier: we said hi."), a("ok"), u("go on")])
    assert compacted.kind is TurnKind.NEW and compacted.segment != first.segment


async def test_users_never_share(convs: Conversations) -> None:
    """Two users who both start with "hi" never see each other's records or segments."""
    alice, bob = Client(convs, user="alice"), Client(convs, user="bob")
    a1 = await alice.send([u("hi")])
    b1 = await bob.send([u("hi")])
    assert b1.kind is TurnKind.NEW and a1.segment != b1.segment
    other_tenant = Client(convs, tenant="globex", user="alice")
    assert (await other_tenant.send([u("hi")])).kind is TurnKind.NEW


async def test_client_conversation_id_separates_identical_chats(convs: Conversations) -> None:
    c = Client(convs)
    one = await c.send([u("hi")], conversation="conv-1")
    two = await c.send([u("hi")], conversation="conv-2")
    assert two.kind is TurnKind.NEW and one.conversation == "conv-1" and two.conversation == "conv-2"


async def test_anchor_first_writer_wins(convs: Conversations) -> None:
    chain = build_chain(chain_seed("acme", "alice", None), [u("hi")])
    assert await convs.write_anchor(chain, SegmentAnchor("seg", "conv", date="v1"))
    assert not await convs.write_anchor(chain, SegmentAnchor("seg", "conv", date="v2"))
    anchor = await convs.read_anchor(chain, "seg")
    assert anchor is not None and anchor.date == "v1"


async def _two_processes(a_store: Store, b_store: Store) -> None:
    ka, kb = Client(Conversations(a_store, 3600)), Client(Conversations(b_store, 3600))
    first = await ka.send([u("hello from replica A")])
    second = await kb.send([u("hello from replica A"), a("hi"), u("and B continues")])
    assert second.kind is TurnKind.CONTINUED and second.segment == first.segment
    again = await ka.send([u("hello from replica A"), a("hi"), u("and B continues")])
    assert again.kind is TurnKind.REGENERATED


async def test_two_keel_processes_share_sqlite(tmp_path: Path) -> None:
    """Two Keel processes on one SQLite file see one conversation."""
    path = str(tmp_path / "shared.db")
    a_store, b_store = SqliteStore(path), SqliteStore(path)
    await _two_processes(a_store, b_store)
    await a_store.close()
    await b_store.close()


async def test_two_keel_processes_share_redis() -> None:
    """Two Keel processes on one Redis see one conversation."""
    a_store = await redis_or_skip()
    b_store = RedisStore(REDIS_URL)
    await _two_processes(a_store, b_store)
    await a_store.close()
    await b_store.close()
