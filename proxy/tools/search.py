"""The `tool_search` tool: its definition (every deferred tool named, compactly) and its answer."""

from __future__ import annotations

import fnmatch
from collections import defaultdict
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from functools import lru_cache

import orjson

from proxy import jsontext
from proxy.jsontext import Json, JsonObject
from proxy.tools.catalog import Catalog, ToolEntry
from proxy.tools.ranking import Ranker

SEARCH_TOOL = "tool_search"
CALL_TOOL = "call_tool"
# `search.listing: auto`: the most characters the name listing takes (about 200 tokens of o200k_base):
# a small catalog is still named in full, a 208-tool one folds its largest families into counts.
# Once a config key (`tools.search.listing_chars`); `config.py` MOVED explains that to a config that sets it.
LISTING_CHARS = 700


@lru_cache(maxsize=1)
def call_tool() -> JsonObject:
    """The generic call tool of `dispatch` stability: reaches any tool not in the frozen block.
    One object, shared like `search_tool`'s (never changed in place), so a frozen block of the same
    listing is the same objects (`Blobs.put_list`)."""
    return {
        "type": "function",
        "function": {
            "name": CALL_TOOL,
            "description": (
                f"Call a tool that is not in your tool list but that {SEARCH_TOOL} loaded for you (or that you "
                "already know by name): give its exact name and its arguments as a JSON object matching the "
                "parameters it showed."
            ),
            "parameters": {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "description": "the tool's exact name"},
                    "arguments": {"type": "object", "description": "the tool's arguments"},
                },
                "required": ["name", "arguments"],
            },
        },
    }


def _families(names: Sequence[str]) -> dict[str, dict[str, list[str]]]:
    """server prefix (`github__`, or "") → first word → the rests of the names sharing it."""
    servers: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for name in names:
        server, sep, bare = name.partition("__")
        server, bare = (server, bare) if sep else ("", name)
        head, sep, rest = bare.partition("_")
        if sep and rest:
            servers[server][head].append(rest)
        else:
            servers[server][bare].append("")
    return servers


def _family(head: str, rests: list[str], folded: bool) -> str:
    """`create_{branch,issue}`, or folded `create_* (2)`; a lone name as itself; a name that is
    the bare head (`fetch` beside `fetch_url`) listed on its own."""
    named = sorted(r for r in rests if r)
    if not named:
        return head
    if len(named) == 1:
        family = f"{head}_{named[0]}"
    elif folded:
        family = f"{head}_* ({len(named)})"
    else:
        family = head + "_{" + ",".join(named) + "}"
    return f"{head}, {family}" if "" in rests else family


def listing(names: Sequence[str], mode: str = "names", max_chars: int = LISTING_CHARS) -> str:
    """Every deferred name, compactly: grouped by server prefix (`github__`) and first word
    (`create_{branch,issue}`). `groups` folds every family to `create_* (2)`; `auto` folds the
    families that save the most characters first, until the listing fits `max_chars`, so a
    small catalog is named in full and a large one costs a bounded number of tokens."""
    servers = _families(names)
    keys = [(server, head) for server in sorted(servers) for head in sorted(servers[server])]
    folded: set[tuple[str, str]] = set()
    if mode == "groups":
        folded = set(keys)
    elif mode == "auto":
        full = {k: _family(k[1], servers[k[0]][k[1]], False) for k in keys}
        saving = {k: len(full[k]) - len(_family(k[1], servers[k[0]][k[1]], True)) for k in keys}
        # the exact rendered length: ", " between families, "; " between servers, "srv__{…}" around them
        length = (sum(len(f) + 2 for f in full.values()) + sum(len(s) + 4 for s in servers if s)
                  - 2 * len(servers) + 2 * (len(servers) - 1))
        for key in sorted(keys, key=lambda k: (-saving[k], k)):
            if length <= max_chars or saving[key] <= 0:
                break
            folded.add(key)
            length -= saving[key]
    parts = []
    for server in sorted(servers):
        listed = ", ".join(_family(h, servers[server][h], (server, h) in folded) for h in sorted(servers[server]))
        parts.append(f"{server}__{{{listed}}}" if server else listed)
    return "; ".join(parts)


@lru_cache(maxsize=512)
def search_tool(deferred: tuple[str, ...], mode: str = "names", max_chars: int = LISTING_CHARS) -> JsonObject:
    """The tool definition; its description lists every deferred tool so each is one search away.
    Cached: a conversation's turns usually defer the same tools."""
    listed = listing(deferred, mode, max_chars)
    legend = "; ".join(text for marker, text in (("_{", "a_{b,c} = a_b, a_c"), ("_* (", "a_* (n) = n tools named a_…"))
                       if marker in listed)
    description = (
        "Loads tools that exist but are not loaded yet" + (f" ({legend})" if legend else "") + f": {listed}. "
        "Call it with what you need, with exact names or with a_* patterns; the matches become callable in your "
        "next step."
    )
    return {
        "type": "function",
        "function": {
            "name": SEARCH_TOOL,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": {
                    "query": {"type": "string", "description": "what the tool should do"},
                    "names": {"type": "array", "items": {"type": "string"},
                              "description": "exact tool names (or a_* patterns) to load"},
                },
                "required": ["query"],
            },
        },
    }


@dataclass(frozen=True)
class SearchResult:
    found: tuple[str, ...]  # the tools the model asked for (by name, else the best match): loaded or shown whole
    content: str  # the tool message's content
    listed: tuple[str, ...] = ()  # every tool the answer names (the rest as briefs)


async def answer_search(arguments: str, catalog: Catalog, deferred: Sequence[str], max_results: int,
                        ranker: Ranker, dispatch: bool = False, shown: Collection[str] = ()) -> SearchResult:
    """Exact names first, then tools the query names (by name, or by their words in order:
    "backlinks summary" names `backlinks_summary`), then the ranker's best matches, from the
    deferred tools.

    An answer weighs what the model needs against what it costs: the tools it asked for by name
    (in `names`, or in the query), else the tools the query says in words with the best match
    beside them (words can name a shorter tool than the one meant: "git diff of my staged
    changes" says `git_diff`, means `git_diff_staged`), else the best match, are found (loaded
    into the tool list for the next call; under dispatch, called through `call_tool`, their
    schemas shown in the answer, once per segment: `shown` are those the model has seen); the
    other matches are briefs (name, description, required parameter names), one search by name
    away (a round trip when the model wanted one of them)."""
    try:
        args = orjson.loads(arguments or "{}")
    except orjson.JSONDecodeError:
        args = {}
    if not isinstance(args, dict):
        args = {}
    query = str(args.get("query") or "")
    given = args.get("names")
    names: list[Json] = given if isinstance(given, list) else []
    allowed = set(deferred)
    chosen: list[str] = []
    for name in (n for n in names if isinstance(n, str)):  # exact names, or a folded family's pattern
        matches = sorted(fnmatch.filter(deferred, name)) if "*" in name else [name] if name in allowed else []
        chosen += [m for m in matches if m not in chosen]
    asked = chosen[:max_results]
    chosen = list(asked)
    worded: list[str] = []  # tools the query names in words: loaded beside the best match, never instead
    if len(chosen) < max_results and query:
        candidates = [catalog.by_name[n] for n in deferred if n in catalog.by_name]
        exact = catalog.names_in(query, max_results)
        for name in (*exact, *catalog.named_by_words(query, max_results)):
            if name in allowed and name not in chosen and len(chosen) < max_results:
                (asked if name in exact else worded).append(name)
                chosen.append(name)
        ranking = await ranker.rank(query, catalog, candidates, max_results)
        for index in ranking.order:
            name = catalog.entries[index].name
            if len(chosen) >= max_results:
                break
            if name not in chosen:
                chosen.append(name)
    entries: list[ToolEntry] = catalog.entries_for(chosen)
    best = [e.name for e in entries if e.name not in worded][:1]
    found = [e.name for e in entries if e.name in asked] or [e.name for e in entries if e.name in worded or
                                                             e.name in best]
    rest = [e.name for e in entries if e.name not in found]
    if dispatch:
        note = f"Call {', '.join(found)} through {CALL_TOOL} with its name and arguments." if found else ""
        tools = [e.schema() if e.name in found and e.name not in shown else e.brief() for e in entries]
    else:
        note = f"Loaded into your tool list: {', '.join(found)}; call it directly." if found else ""
        tools = [e.brief() for e in entries]
    if rest:
        note += f" The others are listed briefly: search for one by name to {'see' if dispatch else 'load'} it."
    payload = {"tools": tools, "note": note.strip() if entries else "No matching tools."}
    return SearchResult(tuple(found), jsontext.dumps(payload).decode(), tuple(e.name for e in entries))
