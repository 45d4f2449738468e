"""Content stored once by hash: pieces cut by content, shared between near-identical texts, scoped."""

from __future__ import annotations

from pathlib import Path

import orjson

from proxy.blobs import CHUNK_MAX, Blobs, pieces
from proxy.stores.sqlite import SqliteStore

PROMPT = "Current time: 10:00:{second:02d}\n\n" + "\n\n".join(
    f"Policy {i}: refunds for plan {i} follow section {i} of the terms.\nEscalate disputes to a human." for i in range(80))


def front(second: int) -> bytes:
    return orjson.dumps([{"role": "system", "content": PROMPT.format(second=second)}])


def test_pieces_are_the_content_cut_by_what_it_says() -> None:
    """Pieces join back to the content, none over the maximum, and an edit changes only its own piece."""
    one, two = pieces(front(1)), pieces(front(2))
    assert b"".join(one) == front(1) and max(map(len, one)) <= CHUNK_MAX
    assert len(one) == len(two) and sum(a != b for a, b in zip(one, two, strict=True)) == 1
    assert pieces(b"x" * (3 * CHUNK_MAX)) == [b"x" * CHUNK_MAX] * 3


async def test_near_identical_content_is_stored_once(tmp_path: Path) -> None:
    """A second prompt differing in one line adds its pieces' list and that line's piece, not a copy."""
    store = SqliteStore(str(tmp_path / "b.db"))
    blobs = Blobs(store, 3600)
    first = await blobs.put("acme", front(1))

    def size() -> int:
        conn = store._connect()
        return int(conn.execute("SELECT SUM(LENGTH(value)) FROM kv").fetchone()[0])

    before = size()
    second = await blobs.put("acme", front(2))
    assert size() - before < 600 < len(front(2))
    fresh = Blobs(store, 3600)  # another process: reads from the store
    assert await fresh.load("acme", first, bytes) == front(1)
    assert await fresh.load("acme", second, bytes) == front(2)
    assert await fresh.load("globex", first, bytes) is None  # another scope never names it
    await store.close()


async def test_a_lost_piece_is_a_miss_and_is_written_again(tmp_path: Path) -> None:
    """A piece gone from the store makes the content unreadable (None), and the next put restores it."""
    store = SqliteStore(str(tmp_path / "b.db"))
    blobs = Blobs(store, 3600)
    ref = await blobs.put("acme", front(1))
    conn = store._connect()
    conn.execute("DELETE FROM kv WHERE rowid = (SELECT MIN(rowid) FROM kv)")
    assert await Blobs(store, 3600).load("acme", ref, bytes) is None
    assert await blobs.put("acme", front(1)) == ref  # this process still thinks it is stored ...
    reader = Blobs(store, 3600)
    assert await reader.load("acme", ref, bytes) is None
    writer = Blobs(store, 3600)  # ... a process that saw it missing writes it again
    assert await writer.load("acme", ref, bytes) is None
    await writer.put("acme", front(1))
    assert await Blobs(store, 3600).load("acme", ref, bytes) == front(1)
    await store.close()


async def test_a_list_of_the_same_objects_is_put_without_dumping_it_again(tmp_path: Path) -> None:
    """put_list stores what put stores (the same ref, readable by another process); the same
    objects again are neither dumped nor hashed, other objects with equal content are."""
    store = SqliteStore(str(tmp_path / "b.db"))
    blobs = Blobs(store, 3600)
    items = [{"type": "function", "function": {"name": "tool_search", "description": PROMPT}}, {"a": 1}]
    dumped: list[int] = []

    def dump(value: object) -> bytes:
        dumped.append(1)
        return orjson.dumps(value)

    ref = await blobs.put_list("t", items, dump)
    assert ref == await Blobs(store, 3600).put("t", orjson.dumps(items))
    assert await Blobs(store, 3600).load("t", ref, orjson.loads) == items
    assert await blobs.put_list("t", list(items), dump) == ref and len(dumped) == 1  # the same objects
    assert await blobs.put_list("t", orjson.loads(orjson.dumps(items)), dump) == ref and len(dumped) == 2
    await store.close()
