"""A tool catalog as Keel sees it: parsed once per distinct tools array, then cached.

A catalog is keyed by its tools array's hash, so a 200-tool request costs one hash and a
dictionary lookup. Everything derived from one tool (canonical bytes, index terms, token
count) is kept by the tool's own bytes, so a catalog that gains or changes a tool re-derives
that tool only, never re-tokenizes the rest.
"""

from __future__ import annotations

import asyncio
import fnmatch
import re
import threading
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from blake3 import blake3

from proxy import jsontext
from proxy.jsontext import Json, JsonObject
from proxy.tokens import TokenCounter
from proxy.tools.lexical import LexicalIndex, term_frequencies
from proxy.tools.text import split_identifier, stem


@dataclass(frozen=True)
class ToolEntry:
    name: str
    tool: JsonObject  # as the client sent it (key order kept: property order is meaningful)
    description: str
    server: str | None  # "github" for "github__create_branch"
    digest: bytes = field(repr=False)  # of the schema's bytes as written: its cache key
    chars: int  # the schema's length as JSON
    terms: dict[str, float] = field(repr=False, compare=False)  # BM25 term frequencies

    def schema(self) -> JsonObject:
        """Name, description and parameters: how a tools update, or a search answer that expects the
        model to call the tool, shows it."""
        return {"name": self.name, "description": self.description,
                "parameters": self.tool.get("function", {}).get("parameters", {})}

    def brief(self) -> JsonObject:
        """Name, description and the names of its required parameters: how a search answer shows a
        tool the model may want, without the parameters' schema (a search by its name shows it)."""
        params = self.tool.get("function", {}).get("parameters")
        required = params.get("required") if isinstance(params, dict) else None
        names = [r for r in required if isinstance(r, str)] if isinstance(required, list) else []
        return {"name": self.name, "description": self.description, "required": names}


@dataclass
class Catalog:
    key: str
    entries: tuple[ToolEntry, ...]
    by_name: dict[str, int]
    index: LexicalIndex
    _name_pattern: re.Pattern[str] | None = None
    tokens: dict[str, int] = field(default_factory=dict)  # filled in the background
    _memo: dict[tuple[Json, ...], frozenset[str]] = field(default_factory=dict, repr=False)
    _by_words: dict[str, list[tuple[tuple[str, ...], str]]] | None = field(default=None, repr=False)
    _companions: dict[str, tuple[str, ...]] | None = field(default=None, repr=False)

    def companions(self) -> dict[str, tuple[str, ...]]:
        """Per tool, the tools of its own server its description or parameters name ("get the
        transition id with jira_get_transitions", "use apply_migration for DDL"): the steps its
        authors say go with it (built once per catalog; names of six characters or more, whole)."""
        if self._companions is None:
            bare: dict[str, list[str]] = {}
            for name in self.by_name:
                short = name.partition("__")[2] or name
                if len(short) >= 6:
                    bare.setdefault(short, []).append(name)
            pattern = re.compile(r"(?<![\w\-])(" + "|".join(re.escape(b) for b in sorted(bare, key=len, reverse=True))
                                 + r")(?![\w\-])") if bare else None
            found: dict[str, tuple[str, ...]] = {}
            for entry in self.entries:
                if pattern is None:
                    break
                fn = entry.tool.get("function") or {}
                text = f"{entry.description} {jsontext.dumps(fn.get('parameters') or {}).decode()}"
                named = [full for short in dict.fromkeys(pattern.findall(text)) for full in bare[short]
                         if full != entry.name and self.entries[self.by_name[full]].server == entry.server]
                if named:
                    found[entry.name] = tuple(dict.fromkeys(named))
            self._companions = found
        return self._companions

    def matching(self, globs: tuple[str, ...]) -> frozenset[str]:
        """Names matching any of these globs (`defer.always`), computed once per catalog."""
        key = ("globs", globs)
        if key not in self._memo:
            self._memo[key] = frozenset(n for n in self.by_name if any(fnmatch.fnmatchcase(n, g) for g in globs))
        return self._memo[key]

    def smaller_than(self, chars: int) -> frozenset[str]:
        """Tools whose schema is shorter than `chars` (`defer.schema_chars`), computed once per catalog."""
        key = ("chars", chars)
        if key not in self._memo:
            self._memo[key] = frozenset(e.name for e in self.entries if e.chars < chars)
        return self._memo[key]

    def names_in(self, text: str, cap: int) -> list[str]:
        """Tools named in `text` as whole words (never inside a longer word), at most `cap`."""
        if self._name_pattern is None or not text or cap <= 0:
            return []
        found: list[str] = []
        for match in self._name_pattern.finditer(text):
            name = match.group(1)
            if name in self.by_name and name not in found:
                found.append(name)
                if len(found) >= cap:
                    break
        return found

    def named_by_words(self, text: str, cap: int) -> list[str]:
        """Tools whose name the text says in words ("backlinks summary", "BacklinksSummary" name
        `backlinks_summary`): every word of the name (less a `server__` prefix; two or more words),
        in order, whole, stemmed ("summaries" too); where one name's words lie inside another's
        ("create branch" in "create branch protection rule") the longer wins. In text order, at
        most `cap`."""
        words = [stem(w) for w in split_identifier(text)]
        index = self._word_index()
        spans = [(start, start + len(named), name) for start, word in enumerate(words)
                 for named, name in index.get(word, ()) if tuple(words[start:start + len(named)]) == named]
        taken: list[tuple[int, int, str]] = []
        for start, end, name in sorted(spans, key=lambda s: (s[0] - s[1], s[0])):  # longest first
            if not any(start >= a and end <= b and (a, b) != (start, end) for a, b, _ in taken):
                taken.append((start, end, name))
        found: list[str] = []
        for _, _, name in sorted(taken):
            if name not in found:
                found.append(name)
        return found[:cap]

    def _word_index(self) -> dict[str, list[tuple[tuple[str, ...], str]]]:
        """First word → (the name's words, the name), for names of two or more words (built once)."""
        if self._by_words is None:
            index: dict[str, list[tuple[tuple[str, ...], str]]] = {}
            for name in self.by_name:
                bare = name.partition("__")[2] or name
                named = tuple(stem(w) for w in split_identifier(bare))
                if len(named) >= 2:
                    index.setdefault(named[0], []).append((named, name))
            self._by_words = index
        return self._by_words

    def entries_for(self, names: Iterable[str]) -> list[ToolEntry]:
        return [self.entries[self.by_name[n]] for n in names if n in self.by_name]


def valid_tools(tools: Json) -> bool:
    """A list of function tools, each with a string name: what Keel can defer."""
    return isinstance(tools, list) and all(
        isinstance(t, dict) and t.get("type") == "function" and isinstance((t.get("function") or {}).get("name"), str)
        for t in tools
    )


def _server(name: str) -> str | None:
    if "__" in name:
        return name.split("__", 1)[0]
    return None


def tool_entry(tool: JsonObject, written: bytes) -> ToolEntry:
    """Everything derived from one tool schema (computed once per distinct schema)."""
    fn = tool.get("function") or {}
    name = str(fn.get("name", ""))
    description = str(fn.get("description") or "")
    params = fn.get("parameters") or {}
    props = params.get("properties") if isinstance(params, dict) else None
    param_text = []
    if isinstance(props, dict):
        for pname, spec in props.items():
            param_text.append(pname)
            if isinstance(spec, dict) and isinstance(spec.get("description"), str):
                param_text.append(spec["description"][:200])
    return ToolEntry(name, tool, description, _server(name), _digest(written), len(written),
                     term_frequencies(name, description, " ".join(param_text)))


def _digest(written: bytes) -> bytes:
    return blake3(written).digest()[:16]


def build_catalog(key: str, tools: Sequence[JsonObject],
                  known: dict[bytes, ToolEntry] | None = None) -> Catalog:
    """A catalog from a tools array; `known` holds entries of schemas seen before (by their bytes
    in the client's own key order, so a schema is rendered the way its client wrote it)."""
    known = {} if known is None else known
    entries = []
    for tool in tools:
        written = jsontext.dumps(tool)
        digest = _digest(written)
        entry = known.get(digest)
        if entry is None:
            entry = known[digest] = tool_entry(tool, written)
        entries.append(entry)
    by_name = {e.name: i for i, e in enumerate(entries)}
    names = sorted((n for n in by_name if n), key=len, reverse=True)
    pattern = None
    if names:
        # Whole words only: a name is never matched inside a longer identifier.
        alternatives = "|".join(re.escape(n) for n in names)
        pattern = re.compile(rf"(?<![A-Za-z0-9_\-])({alternatives})(?![A-Za-z0-9_\-])")
    return Catalog(key, tuple(entries), by_name, LexicalIndex([e.terms for e in entries]), pattern)


class CatalogCache:
    """Catalogs by content hash (LRU, bounded by count and by estimated bytes), and per-schema
    derived data (entries, index terms, token counts) by the schema's digest, shared by the
    cached catalogs that hold it, so a catalog that changes by one tool re-derives one tool and
    an evicted catalog frees what only it held. A large new catalog is built on a worker thread
    (`get_async`), so the event loop keeps serving other requests meanwhile."""

    # Measured with tracemalloc on the 208-tool agent catalog: entries, index terms, postings,
    # the name pattern and the client's own tool objects come to about 16 bytes per schema byte.
    BYTES_PER_SCHEMA_BYTE = 16
    OFF_LOOP_TOOLS = 300  # catalogs with more tools are hashed and built off the event loop

    def __init__(self, tokens: TokenCounter, size: int = 64, max_bytes: int = 96 * 1024 * 1024) -> None:
        self.tokens = tokens
        self._size = size
        self._max_bytes = max_bytes
        self._bytes = 0
        self._catalogs: OrderedDict[str, tuple[Catalog, int]] = OrderedDict()
        self._entries: dict[bytes, ToolEntry] = {}  # every entry a cached catalog holds, by digest
        self._holders: dict[bytes, int] = {}  # how many cached catalogs hold each entry
        self._token_counts: dict[bytes, int] = {}
        self._lock = threading.Lock()  # token counting
        self._catalogs_lock = threading.Lock()
        # the tools arrays last seen, by identity: a resent array parsed once (`jsontext.Resent`) is
        # the same list object, so its key costs no re-serializing (the list is held: ids stay its)
        self._seen: OrderedDict[int, tuple[Sequence[JsonObject], str]] = OrderedDict()

    async def get_async(self, tools: Sequence[JsonObject]) -> Catalog | None:
        if len(tools) > self.OFF_LOOP_TOOLS:
            return await asyncio.to_thread(self.get, tools)
        return self.get(tools)

    def get(self, tools: Sequence[JsonObject]) -> Catalog | None:
        """The catalog of this tools array; None when it is not a list of function tools (checked
        once per distinct array: a cached catalog was valid when it was built)."""
        key = self._key(tools)
        with self._catalogs_lock:
            found = self._catalogs.get(key)
            if found is not None:
                self._catalogs.move_to_end(key)
                return found[0]
            known = dict(self._entries)
        if not valid_tools(tools):
            return None
        catalog = build_catalog(key, tools, known)
        size = sum(e.chars for e in catalog.entries) * self.BYTES_PER_SCHEMA_BYTE
        with self._catalogs_lock:
            if key in self._catalogs:  # built twice at once: keep the first
                return self._catalogs[key][0]
            self._catalogs[key] = (catalog, size)
            self._bytes += size
            self._hold(catalog, +1)
            while len(self._catalogs) > 1 and (len(self._catalogs) > self._size or self._bytes > self._max_bytes):
                _, (dropped, dropped_size) = self._catalogs.popitem(last=False)
                self._bytes -= dropped_size
                self._hold(dropped, -1)
        threading.Thread(target=self._count_tokens, args=(catalog,), daemon=True).start()
        return catalog

    def _key(self, tools: Sequence[JsonObject]) -> str:
        with self._catalogs_lock:
            seen = self._seen.get(id(tools))
            if seen is not None and seen[0] is tools:
                self._seen.move_to_end(id(tools))
                return seen[1]
        # BLAKE3: collision-resistant, which matters because the cache is shared by tenants, and
        # several times faster than sha256 (re-serializing the array costs more than hashing it).
        key = blake3(jsontext.dumps(tools)).hexdigest()
        with self._catalogs_lock:
            self._seen[id(tools)] = (tools, key)
            while len(self._seen) > self._size:
                self._seen.popitem(last=False)
        return key

    def _hold(self, catalog: Catalog, change: int) -> None:
        for entry in {e.digest: e for e in catalog.entries}.values():
            holders = self._holders.get(entry.digest, 0) + change
            if holders > 0:
                self._holders[entry.digest] = holders
                self._entries[entry.digest] = entry
            else:
                self._holders.pop(entry.digest, None)
                self._entries.pop(entry.digest, None)
                self._token_counts.pop(entry.digest, None)

    def _count_tokens(self, catalog: Catalog) -> None:
        with self._lock:
            for entry in catalog.entries:
                count = self._token_counts.get(entry.digest)
                if count is None:
                    count = self.tokens.count(jsontext.dumps(entry.tool).decode())
                    if entry.digest in self._holders:
                        self._token_counts[entry.digest] = count
                catalog.tokens[entry.name] = count

    def tool_tokens(self, catalog: Catalog, entries: Iterable[ToolEntry]) -> int:
        """Token count of these tools (an estimate until the background count is done)."""
        return sum(catalog.tokens.get(e.name, e.chars // 4) for e in entries)
