"""A turn reads a bounded number of turn records however long its history: the newest record names
the earlier ones later turns render from; a record of another format version reads as absent."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson

from proxy.chain import Meanings, caller_seed, context_digest
from proxy.conversations import Conversations, Location, TurnKind
from proxy.proofs import history_fragments
from proxy.records import FORMAT, RecordPatch, StoredState
from proxy.stores.sqlite import SqliteStore

SYSTEM = {"role": "system", "content": "You are helpful."}


class CountingStore(SqliteStore):
    """Counts the turn records each get_many asks for."""

    read: list[int]

    async def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        self.read.append(sum(":turn:" in k for k in keys))
        return await super().get_many(keys)


async def converse(convs: Conversations, store: CountingStore, turns: int,
                   update_every: int = 10) -> tuple[Location, list[dict[str, Any]]]:
    """`turns` user turns; every `update_every`th record carries a context update (something
    later turns re-render)."""
    messages: list[dict[str, Any]] = [SYSTEM]
    caller = caller_seed("acme", "alice", None)
    location: Location | None = None
    for n in range(turns):
        messages.append({"role": "user", "content": f"question {n}"})
        store.read = []
        location = await convs.locate(Meanings.of(messages), caller, context_digest(SYSTEM["content"]),
                                      history_fragments(messages))
        update = f"<context_update>{n}</context_update>" if n % update_every == 0 else None
        record = convs.new_record(location, RecordPatch(context_update=update, context_state=StoredState(str(n))))
        await convs.write_turn(location.chain, record)
        messages.append({"role": "assistant", "content": f"answer {n}"})
    assert location is not None
    return location, messages


async def test_the_hundredth_turn_reads_what_it_renders_not_the_whole_history(tmp_path: Path) -> None:
    store = CountingStore(str(tmp_path / "c.db"))
    convs = Conversations(store, 3600)
    location, _ = await converse(convs, store, 100)
    assert location.kind is TurnKind.CONTINUED
    updates = [r.position for r in location.records if r.context_update]
    assert len(updates) == 10, "every record a later turn re-renders is there"
    assert location.records[-1].context_state == StoredState("98"), "the newest state is there"
    assert sum(store.read) <= 2 + 10 + 1, store.read  # the tail, the ten updates, the one before
    await store.close()


async def test_a_record_of_another_format_version_reads_as_absent(tmp_path: Path) -> None:
    """A conversation stored by a Keel of another format version (here: before versions were
    written) is not read in an old shape: its records are absent, and the next turn opens a new
    segment (a cache miss, never a failed turn)."""
    store = CountingStore(str(tmp_path / "c.db"))
    convs = Conversations(store, 3600)
    _, messages = await converse(convs, store, 3)
    messages.append({"role": "user", "content": "question 3"})
    caller, context = caller_seed("acme", "alice", None), context_digest(SYSTEM["content"])
    located = await convs.locate(Meanings.of(messages), caller, context, history_fragments(messages))
    assert located.kind is TurnKind.CONTINUED, "read in its own format, the conversation continues"
    for link in located.chain.user_links[:-1]:
        turn_key = convs._turn_key(located.chain, link.hash)
        stored = orjson.loads(await store.get(turn_key) or b"{}")
        assert stored.pop("v") == FORMAT
        await store.set(turn_key, orjson.dumps(stored))  # as written before versions
    after = await convs.locate(Meanings.of(messages), caller, context, history_fragments(messages))
    assert after.kind is TurnKind.NEW and after.records == ()
    await store.close()
