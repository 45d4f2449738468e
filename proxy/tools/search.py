"""The `tool_search` tool: its definition (every deferred tool named, compactly) and its answer."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from proxy.tools.catalog import Catalog, ToolEntry
from proxy.tools.ranking import Ranker

SEARCH_TOOL = "tool_search"
CALL_TOOL = "call_tool"


def call_tool() -> dict[str, Any]:
    """The generic call tool of `dispatch` stability: reaches any tool not in the frozen block."""
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


def _words(names: Sequence[str]) -> list[str]:
    """`create_branch, create_issue, get_me` → `create_{branch,issue}, get_me`."""
    groups: dict[str, list[str]] = defaultdict(list)
    for name in names:
        head, sep, rest = name.partition("_")
        groups[head if sep and rest else name].append(rest if sep and rest else "")
    out = []
    for head in sorted(groups):
        rests = sorted(groups[head])
        if len(rests) == 1:
            out.append(f"{head}_{rests[0]}" if rests[0] else head)
        else:
            out.append(head + "_{" + ",".join(rests) + "}")
    return out


def _groups(names: Sequence[str]) -> list[str]:
    """`create_{...}` → `create_* (6)`: the families only, each with its size."""
    out = []
    for item in _words(names):
        head, brace, rest = item.partition("_{")
        out.append(f"{head}_* ({rest.count(',') + 1})" if brace else item)
    return out


def listing(names: Sequence[str], mode: str = "names") -> str:
    """Every name, compactly: grouped by server prefix (`github__`) and by first word;
    in `groups` mode only the families and their sizes (far shorter, one search further)."""
    words = _groups if mode == "groups" else _words
    servers: dict[str, list[str]] = defaultdict(list)
    for name in names:
        server, sep, rest = name.partition("__")
        servers[server if sep else ""].append(rest if sep else name)
    parts = []
    for server in sorted(servers):
        listed = ", ".join(words(servers[server]))
        parts.append(f"{server}__{{{listed}}}" if server else listed)
    return "; ".join(parts)


def search_tool(deferred: Sequence[str], mode: str = "names") -> dict[str, Any]:
    """The tool definition; its description lists every deferred tool so each is one search away."""
    legend = "a_{b,c} stands for a_b, a_c" if mode == "names" else "a_* (n) stands for n tools named a_…"
    description = (
        "Load more tools. These tools exist but their definitions are not loaded yet "
        f"({legend}): {listing(deferred, mode)}. Call {SEARCH_TOOL} with a short description "
        "of what you need, or with the exact names, and the matching tools become callable in your next step."
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
                    "names": {"type": "array", "items": {"type": "string"}, "description": "exact tool names to load"},
                },
                "required": ["query"],
            },
        },
    }


@dataclass(frozen=True)
class SearchResult:
    found: tuple[str, ...]
    content: str  # the tool message's content


async def answer_search(arguments: str, catalog: Catalog, deferred: Sequence[str], max_results: int,
                        ranker: Ranker, dispatch: bool = False) -> SearchResult:
    """Exact names first, then names in the query, then the ranker's best matches, from the deferred tools."""
    try:
        args = orjson.loads(arguments or "{}")
    except orjson.JSONDecodeError:
        args = {}
    if not isinstance(args, dict):
        args = {}
    query = str(args.get("query") or "")
    given = args.get("names")
    names: list[Any] = given if isinstance(given, list) else []
    allowed = set(deferred)
    chosen: list[str] = [n for n in names if isinstance(n, str) and n in allowed][:max_results]
    if len(chosen) < max_results and query:
        candidates = [catalog.by_name[n] for n in deferred if n in catalog.by_name]
        named = [n for n in catalog.names_in(query, max_results) if n in allowed and n not in chosen]
        chosen += named[: max_results - len(chosen)]
        ranking = await ranker.rank(query, catalog, candidates, max_results)
        for index in ranking.order:
            name = catalog.entries[index].name
            if len(chosen) >= max_results:
                break
            if name not in chosen:
                chosen.append(name)
    entries: list[ToolEntry] = catalog.entries_for(chosen)
    note = (f"Call these tools through {CALL_TOOL} with their name and arguments." if dispatch
            else "These tools are now loaded; call them directly.")
    payload = {
        "tools": [
            {"name": e.name, "description": e.description, "parameters": e.tool.get("function", {}).get("parameters", {})}
            for e in entries
        ],
        "note": note if entries else "No matching tools.",
    }
    return SearchResult(tuple(e.name for e in entries), orjson.dumps(payload, option=orjson.OPT_SORT_KEYS).decode())
