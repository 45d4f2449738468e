"""One client turn across upstream calls: Keel answers the model's searches and continues."""

from __future__ import annotations

from dataclasses import dataclass, field

import orjson

from proxy.config import ToolsConfig
from proxy.jsontext import JsonObject
from proxy.messages import Message
from proxy.rounds import is_generic
from proxy.tools.catalog import Catalog
from proxy.tools.plan import ToolPlan
from proxy.tools.ranking import Ranker
from proxy.tools.search import answer_search


@dataclass
class Loop:
    """The state of one client turn across upstream calls (the view body the next call renders)."""

    plan: ToolPlan
    config: ToolsConfig
    body: JsonObject
    surfaced: list[str]
    deferred: list[str]
    before: list[Message] = field(default_factory=list)
    found: list[str] = field(default_factory=list)
    queries: dict[str, str] = field(default_factory=dict)  # found tool -> the words the model searched with
    rounds: int = 0

    async def answer(self, searches: list[Message], ranker: Ranker) -> list[Message]:
        """Tool results for these search calls; their tools are surfaced for the next call."""
        results = []
        for call in searches:
            result = await answer_search(call["function"].get("arguments", ""), self.plan.catalog, self.deferred,
                                         self.config.search.max_results, ranker, self.plan.dispatch,
                                         {*self.plan.shown, *self.found})
            for name in result.found:
                if name in self.deferred:
                    self.deferred.remove(name)
                    self.surfaced.append(name)
                    self.found.append(name)
                    self.queries[name] = search_words(call["function"].get("arguments", ""))
            results.append({"role": "tool", "tool_call_id": call["id"], "content": result.content})
        self.rounds += 1
        if self.plan.dispatch:
            return results  # the block never changes: found tools are called through call_tool
        # Found tools go at the end: the block before them stays as it was (its cache too).
        catalog = self.plan.catalog
        shipped = {t["function"]["name"] for t in self.body.get("tools") or []}
        new = [catalog.entries[catalog.by_name[n]].tool for n in self.found if n not in shipped]
        self.body["tools"] = [*(self.body.get("tools") or []), *new]
        return results

    def continue_with(self, assistant: list[Message], results: list[Message]) -> None:
        self.before += [*assistant, *results]
        self.body["messages"] = [*self.body["messages"], *assistant, *results]

    def can_continue(self) -> bool:
        return self.rounds < self.config.search.max_rounds


def search_words(arguments: str) -> str:
    """The `query` a tool_search call was made with ("" when there is none)."""
    try:
        args = orjson.loads(arguments or "{}")
    except orjson.JSONDecodeError:
        return ""
    query = args.get("query") if isinstance(args, dict) else None
    return query if isinstance(query, str) else ""


def real_call(call: Message, catalog: Catalog) -> Message | None:
    """The client's own call behind a generic `call_tool` call (None if it names no known tool)."""
    try:
        args = orjson.loads(call["function"].get("arguments") or "{}")
    except orjson.JSONDecodeError:
        return None
    if not isinstance(args, dict) or args.get("name") not in catalog.by_name:
        return None
    arguments = args.get("arguments")
    text = arguments if isinstance(arguments, str) else orjson.dumps(arguments or {}).decode()
    return {"id": call.get("id"), "type": "function", "function": {"name": args["name"], "arguments": text}}


def to_real_calls(message: Message, catalog: Catalog) -> tuple[Message, JsonObject]:
    """The message with generic calls rewritten to real ones, and the generic form of each by id."""
    calls = message.get("tool_calls") or []
    if not any(is_generic(c) for c in calls):
        return message, {}
    out, dispatched = [], {}
    for call in calls:
        real = real_call(call, catalog) if is_generic(call) else None
        if real is not None:
            dispatched[str(call.get("id"))] = call["function"]
            out.append(real)
        else:
            out.append(call)
    return {**message, "tool_calls": out}, dispatched
