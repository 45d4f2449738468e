"""Content stored once by its hash: what many conversations share (a system prompt, its sections).

A segment anchor or a turn record refers to shared content by `ref` (a BLAKE2b digest of the
bytes) instead of holding a copy, so a thousand conversations under one 17 KB system prompt
store it once. Content over `CHUNK_MAX` is stored in pieces cut where its lines say (content-
defined: around a line with a time of day, and after a line whose CRC ends in three zero bits), each
a blob of its own, so two prompts that differ in a clock line share every piece but that line. Blobs are
scoped (a tenant, and a passthrough caller's credential): only a request that carried the same
bytes under the same scope can name a blob, so sharing one leaks nothing.

Content never changes under its ref, so what was read is kept in memory (bounded by bytes) and a
blob is written with `blob_ttl` (`store.blob_ttl_seconds`, longer than the records' `ttl`), again
by each process that uses it once `blob_ttl - ttl` has passed since it last did: a blob outlives
every record that refers to it (a record lives `ttl` past its last write; the blob at least that
long past its last use). A blob gone anyway (the store was emptied) is a miss: the
caller re-anchors, a cache miss, never a wrong prompt.
"""

from __future__ import annotations

import hashlib
import re
import time
import zlib
from collections import OrderedDict
from collections.abc import Callable
from typing import TypeVar

from proxy.jsontext import Json
from proxy.stores import KeyValue, key

T = TypeVar("T")
CHUNK_MIN, CHUNK_MAX = 256, 2048
_CLOCK = re.compile(rb"\d:\d\d")
PIECE = 16  # bytes of a piece's digest in a list of pieces
_WHOLE, _PIECES = b"=", b"#"  # what a stored blob is: the content, or its pieces' digests


def blob_ref(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=32, person=b"keel-blob").hexdigest()


def _piece_ref(data: bytes) -> bytes:
    return hashlib.blake2b(data, digest_size=PIECE, person=b"keel-piece").digest()


def pieces(data: bytes) -> list[bytes]:
    """`data` cut where its content says: around a line with a time of day in it (what differs
    between two conversations' copies of one prompt), and after a line (JSON's escaped newline, or
    a raw one) whose CRC-32 ends in three zero bits; pieces of `CHUNK_MIN` to `CHUNK_MAX` bytes but
    for those lines. An edit changes the piece it falls in, no other."""
    out: list[bytes] = []
    clocks = [m.start() for m in _CLOCK.finditer(data)]
    start = at = 0
    size = len(data)
    escaped = raw = -1  # the next newline of each kind at or after `at` (-1: not looked for yet)
    while at < size:
        if escaped < at:
            escaped = data.find(b"\\n", at) % (size + 1)  # not found: size
        if raw < at:
            raw = data.find(b"\n", at) % (size + 1)
        end = min(escaped + 2, raw + 1, size)
        while clocks and clocks[0] < at:
            clocks.pop(0)
        clock = bool(clocks) and clocks[0] < end
        if (clock or end - start > CHUNK_MAX) and at > start:  # cut before this line
            out.append(data[start:at])
            start = at
        while end - start > CHUNK_MAX:  # one line longer than a piece
            out.append(data[start : start + CHUNK_MAX])
            start += CHUNK_MAX
        if clock or end == size or (end - start >= CHUNK_MIN and zlib.crc32(data[at:end]) & 0x7 == 0):
            out.append(data[start:end])
            start = end
        at = end
    return out


class Blobs:
    def __init__(self, store: KeyValue, ttl_seconds: float, cache_bytes: int = 32 * 1024 * 1024,
                 blob_ttl: float | None = None) -> None:
        self.store = store
        self.blob_ttl = blob_ttl if blob_ttl is not None else 2 * ttl_seconds
        assert self.blob_ttl > ttl_seconds, "a blob must outlive the records that refer to it"
        self.rewrite_after = self.blob_ttl - ttl_seconds
        self._cache_bytes = cache_bytes
        self._bytes = 0
        self._values: OrderedDict[tuple[str, str], tuple[Json, int]] = OrderedDict()  # read or written, parsed
        self._written: OrderedDict[tuple[str, str], float] = OrderedDict()  # when this process last wrote it
        # lists put by `put_list`, by their items' identities: (the items, held so ids stay theirs; text; ref)
        self._lists: OrderedDict[tuple[int, ...], tuple[tuple[Json, ...], bytes, str]] = OrderedDict()

    @staticmethod
    def _key(scope: str, ref: str) -> str:
        # one tag per scope: a blob's pieces are read with one get_many, on one Redis Cluster slot
        return key(hashlib.blake2b(scope.encode(), digest_size=12).hexdigest(), "blob", ref)

    def _fresh(self, at: tuple[str, str]) -> bool:
        """Did this process write it recently enough that it outlives any record written now?"""
        written = self._written.get(at)
        return written is not None and time.monotonic() - written < self.rewrite_after

    async def _write(self, scope: str, ref: str, stored: bytes) -> None:
        at = (scope, ref)
        if self._fresh(at):
            return
        await self.store.set(self._key(scope, ref), stored, self.blob_ttl)
        self._written[at] = time.monotonic()
        self._written.move_to_end(at)
        while len(self._written) > 65536:
            self._written.popitem(last=False)

    async def put_list(self, scope: str, items: list[Json], dump: Callable[[Json], bytes]) -> str:
        """`put(scope, dump(items), items)`, a list of the very objects put before (Keel's own tools,
        made once per listing and never changed) neither dumped nor hashed again."""
        ids = tuple(id(i) for i in items)
        found = self._lists.get(ids)
        if found is None or any(a is not b for a, b in zip(found[0], items, strict=True)):
            data = dump(items)
            found = self._lists[ids] = (tuple(items), data, blob_ref(data))
            while len(self._lists) > 64:
                self._lists.popitem(last=False)
        else:
            self._lists.move_to_end(ids)
        return await self.put(scope, found[1], items, found[2])

    async def put(self, scope: str, data: bytes, value: Json = None, ref: str | None = None) -> str:
        """Store `data` (what this process stored within one TTL is not written again); its ref.
        `value`: what `load` would parse it to, kept so this process never parses it; `ref`: the
        data's ref when the caller knows it."""
        ref = ref or blob_ref(data)
        if not self._fresh((scope, ref)):
            if len(data) <= CHUNK_MAX:
                await self._write(scope, ref, _WHOLE + data)
            else:
                parts = pieces(data)
                refs = [_piece_ref(p) for p in parts]
                for part, piece in zip(parts, refs, strict=True):
                    await self._write(scope, piece.hex(), _WHOLE + part)
                await self._write(scope, ref, _PIECES + b"".join(refs))
        if value is not None:
            self._keep((scope, ref), value, len(data))
        return ref

    async def load(self, scope: str, ref: str, parse: Callable[[bytes], T]) -> T | None:
        """The content behind `ref`, parsed (once per process: the same object each time, which
        callers never change), or None when it is gone."""
        at = (scope, ref)
        found = self._values.get(at)
        if found is not None:
            self._values.move_to_end(at)
            value: T = found[0]
            return value
        data = await self._read(scope, ref)
        if data is None:
            return None
        parsed = parse(data)
        self._keep(at, parsed, len(data))
        return parsed

    async def _read(self, scope: str, ref: str) -> bytes | None:
        stored = await self.store.get(self._key(scope, ref))
        data = None
        if stored is not None and stored[:1] == _WHOLE:
            data = stored[1:]
        elif stored is not None and stored[:1] == _PIECES:
            refs = [stored[i : i + PIECE].hex() for i in range(1, len(stored), PIECE)]
            parts = await self.store.get_many([self._key(scope, r) for r in refs])
            if all(p is not None and p[:1] == _WHOLE for p in parts):
                data = b"".join(p[1:] for p in parts if p is not None)
        if data is None or blob_ref(data) != ref:
            self._forget(scope, ref, stored)
            return None
        return data

    def _forget(self, scope: str, ref: str, stored: bytes | None) -> None:
        """Written once, gone since (an emptied store): write it, and its pieces, again."""
        self._written.pop((scope, ref), None)
        if stored is not None and stored[:1] == _PIECES:
            for i in range(1, len(stored), PIECE):
                self._written.pop((scope, stored[i : i + PIECE].hex()), None)

    def _keep(self, at: tuple[str, str], value: Json, size: int) -> None:
        if at in self._values:
            self._values.move_to_end(at)
            return
        self._values[at] = (value, size)
        self._bytes += size
        while self._bytes > self._cache_bytes and len(self._values) > 1:
            _, (_, dropped) = self._values.popitem(last=False)
            self._bytes -= dropped
