"""A turn reads a bounded number of turn records however long its history: the newest record names
the earlier ones later turns render from; a record written before `needs` existed is still read."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from proxy.chain import Meanings, caller_seed, context_digest
from proxy.conversations import Conversations, Location, TurnKind
from proxy.proofs import history_fragments
from proxy.stores.sqlite import SqliteStore

SYSTEM = {"role": "system", "content": "You are helpful."}


class CountingStore(SqliteStore):
    """Counts the turn records each get_many asks for."""

    read: list[int]

    async def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        self.read.append(sum(":turn:" in k for k in keys))
        return await super().get_many(keys)


async def converse(convs: Conversations, store: CountingStore, turns: int, update_every: int = 10,
                   legacy: bool = False) -> tuple[Location, list[dict[str, Any]]]:
    """`turns` user turns; every `update_every`th record carries a context update (something
    later turns re-render). `legacy`: records written the way Keel wrote them before `needs`."""
    messages: list[dict[str, Any]] = [SYSTEM]
    caller = caller_seed("acme", "alice", None)
    location: Location | None = None
    for n in range(turns):
        messages.append({"role": "user", "content": f"question {n}"})
        store.read = []
        location = await convs.locate(Meanings.of(messages), caller, context_digest(SYSTEM["content"]),
                                      history_fragments(messages))
        fields = {"context_update": f"<context_update>{n}</context_update>"} if n % update_every == 0 else {}
        record = convs.new_record(location, context_state={"n": n}, **fields)
        await convs.write_turn(location.chain, replace(record, needs=None) if legacy else record)
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
    assert location.records[-1].context_state == {"n": 98}, "the newest state is there"
    assert sum(store.read) <= 2 + 10 + 1, store.read  # the tail, the ten updates, the one before
    await store.close()


async def test_records_written_before_needs_are_read_whole_once(tmp_path: Path) -> None:
    """A conversation stored by an older Keel: its next turn reads every record (as before), and
    the record it writes names what the turns after it need, so they read few again."""
    store = CountingStore(str(tmp_path / "c.db"))
    convs = Conversations(store, 3600)
    location, messages = await converse(convs, store, 40, legacy=True)
    assert sum(store.read) >= 39 and len([r for r in location.records if r.context_update]) == 4
    record = convs.new_record(location, context_state={"n": 40})
    await convs.write_turn(location.chain, record)
    messages.append({"role": "user", "content": "question 40"})
    store.read = []
    after = await convs.locate(Meanings.of(messages), caller_seed("acme", "alice", None),
                               context_digest(SYSTEM["content"]), history_fragments(messages))
    assert len([r for r in after.records if r.context_update]) == 4
    assert sum(store.read) <= 2 + 4 + 1, store.read
    await store.close()
