"""A client's own tool deferral: tools marked `defer_loading: true` and a search tool of the
provider's (Anthropic's `tool_search_tool_*`, Responses' hosted `tool_search`), or of its own.

A client that runs its own search (Claude Code's `ToolSearch` beside its deferred tools and their
`DeferredToolPlaceholder`; Codex's `tool_search` with `"execution": "client"`) already keeps its
catalog lean and answers its searches itself: its tools go as it sent them, with no Keel search
beside its own and nothing of what it loaded deferred (`client_searches`). An upstream that
searches natively also gets the request as sent. For one that cannot, Keel honours the client's
choice: the tools without `defer_loading` stay loaded, the deferred ones are ranked like any
catalog (the few a turn needs ship, loaded; the rest one Keel `tool_search` away), the provider's
search tool is replaced by Keel's, and no `defer_loading` reaches an upstream that would not
understand it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from proxy.codecs import KEEL
from proxy.jsontext import Json, JsonObject

FLAG = "defer_loading"
CLIENT_SEARCH = "ToolSearch"  # Claude Code's own search over the tools it deferred


@dataclass(frozen=True, slots=True)
class ClientDeferral:
    deferred: frozenset[str]  # names of the tools the client marked defer_loading
    loaded: tuple[JsonObject, ...]  # the view's function tools, every one loaded (no defer_loading)
    foreign: tuple[Json, ...]  # the view's other tools, the provider's search tool left out


def is_provider_search(tool: Json) -> bool:
    """Anthropic's tool_search_tool_regex/bm25_* server tools, Responses' hosted tool_search (one with
    `"execution": "client"` is the client's own: Codex runs it)."""
    return (isinstance(tool, dict) and isinstance(tool.get("type"), str) and tool["type"].startswith("tool_search")
            and tool.get("execution") != "client")


def client_searches(body: JsonObject) -> bool:
    """Does the client search its own deferred tools? A tool_search it executes itself (Codex), or
    Claude Code's ToolSearch beside tools it deferred."""
    tools = body.get("tools")
    functions = [t for t in tools if isinstance(t, dict)] if isinstance(tools, list) else []
    foreign: Sequence[Json] = body.get("foreign_tools") or ()
    if any(isinstance(t, dict) and t.get("execution") == "client" and str(t.get("type", "")).startswith("tool_search")
           for t in foreign):
        return True
    named = any((t.get("function") or {}).get("name") == CLIENT_SEARCH for t in functions)
    return named and any(_deferred(t) for t in functions)


def _deferred(tool: JsonObject) -> bool:
    client = tool.get(KEEL)
    return tool.get(FLAG) is True or (isinstance(client, dict) and client.get(FLAG) is True)


def _loaded(tool: JsonObject) -> JsonObject:
    out = {k: v for k, v in tool.items() if k != FLAG}
    client = out.get(KEEL)
    if isinstance(client, dict) and FLAG in client:  # the client's own object, rendered back by the codec
        out[KEEL] = {k: v for k, v in client.items() if k != FLAG}
    return out


def client_deferral(body: JsonObject) -> ClientDeferral | None:
    """What the client deferred in this view body; None when it deferred nothing."""
    tools = body.get("tools")
    foreign: Sequence[Json] = body.get("foreign_tools") or ()
    if not isinstance(tools, list):
        return None
    functions = [t for t in tools if isinstance(t, dict)]
    deferred = frozenset(str((t.get("function") or {}).get("name")) for t in functions if _deferred(t))
    if not deferred and not any(is_provider_search(t) for t in foreign):
        return None
    loaded = tuple(_loaded(t) if _deferred(t) else t for t in tools)
    return ClientDeferral(deferred, loaded, tuple(t for t in foreign if not is_provider_search(t)))
