"""First shot: what Keel ships before the model runs, through the real planner with its defaults.

A request is a hit when, for every step of the ask, one of that step's acceptable tools is
among the tools Keel ships (named, pinned or ranked); a conversational turn is lean when Keel
ships nothing beyond what it ships on every turn (schemas under `defer.schema_chars`). Shared by bench/quality.py and
tests; nothing here reads a row's outcome back into Keel.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from proxy import jsontext  # noqa: E402
from proxy.config import parse_config  # noqa: E402
from proxy.metrics import Metrics  # noqa: E402
from proxy.tokens import TokenCounter  # noqa: E402
from proxy.tools.catalog import CatalogCache  # noqa: E402
from proxy.tools.planner import ToolPlan, ToolPlanner  # noqa: E402
from proxy.tools.ranking import LexicalRanker  # noqa: E402
from proxy.turn import Turn  # noqa: E402

CATALOGS = ROOT.parent / "shared" / "data" / "catalogs"
MODEL_DIR = ROOT.parent / "shared" / "data" / "models" / "all-MiniLM-L6-v2-int8"


def catalog_tools(name: str) -> list[dict[str, Any]]:
    tools: list[dict[str, Any]] = orjson.loads((CATALOGS / name).read_bytes())["tools"]
    return tools


def jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


class Synchronous:
    """A ranker whose vectors are computed before the first turn (quality, not warm-up)."""

    def __init__(self, ranker: Any) -> None:
        self.ranker = ranker

    async def rank(self, query: str, catalog: Any, candidates: Any, shortlist: int) -> Any:
        return self.ranker.rank_now(query, catalog, candidates, shortlist)


def make_ranker(backend: str, model: Path = MODEL_DIR) -> Any:
    if backend == "local":
        from proxy.tools.local import LocalEncoder, LocalRanker

        return LocalRanker(LocalEncoder(model))
    return LexicalRanker()


@dataclass(frozen=True)
class Shipped:
    names: frozenset[str]
    outcome: str  # the plan's: ranked, no_tool_needed (the gate said no), ...
    extra: int  # tools shipped beyond those every turn ships (schemas under defer.schema_chars)
    tokens: int  # the tool block Keel sends (o200k_base)
    full_tokens: int  # the client's whole catalog


class Shipper:
    """The tool planner with default settings (`defer.min_tools` 0) over one ranker."""

    def __init__(self, ranker: Any, counter: TokenCounter | None = None, learned: Any = None) -> None:
        config = parse_config({"store": {"url": "sqlite:///:memory:"}, "tenants": [{
            "id": "bench", "auth": {"passthrough": True}, "upstream": {"base_url": "http://x"},
            "tools": {"enabled": True, "defer": {"min_tools": 0}}}]})
        self.tenant = config.tenants[0]
        self.counter = counter or TokenCounter()
        self.planner = ToolPlanner(CatalogCache(self.counter), lambda c: Synchronous(ranker), Metrics(),
                                   lambda plan, r: plan, learned=learned)
        self._full: dict[int, int] = {}

    def ship(self, tools: list[dict[str, Any]], query: str, tokens: bool = False) -> Shipped:
        return asyncio.run(self.ship_async(tools, query, tokens))

    async def ship_async(self, tools: list[dict[str, Any]], query: str, tokens: bool = False) -> Shipped:
        return await self.ship_messages_async(tools, [{"role": "user", "content": query}], tokens)

    def ship_messages(self, tools: list[dict[str, Any]], messages: list[dict[str, Any]]) -> Shipped:
        """What Keel ships for a conversation whose newest user message is the turn."""
        return asyncio.run(self.ship_messages_async(tools, messages))

    async def ship_messages_async(self, tools: list[dict[str, Any]], messages: list[dict[str, Any]],
                                  tokens: bool = False) -> Shipped:
        body = {"model": "m", "tools": tools, "messages": messages}
        planned = await self.planner.plan(Turn(self.tenant, b"", body, {}, "bench"))
        plan = planned.responder
        if not isinstance(plan, ToolPlan):
            return Shipped(frozenset(t["function"]["name"] for t in tools), "not_planned", len(tools), 0, 0)
        full = self._full.get(id(tools))
        if tokens and full is None:
            full = self._full[id(tools)] = self.counter.count(jsontext.dumps(tools).decode())
        sent = self.counter.count(jsontext.dumps(planned.body["tools"]).decode()) if tokens else 0
        called = {c["function"]["name"] for m in messages for c in m.get("tool_calls") or []}
        extra = len(set(plan.surfaced) - pinned_everywhere(self, tools) - called)
        return Shipped(frozenset(plan.surfaced), plan.outcome, extra, sent, full or 0)


def pinned_everywhere(shipper: Shipper, tools: list[dict[str, Any]]) -> frozenset[str]:
    """Tools every turn ships whatever it says (schemas under `defer.schema_chars`)."""
    catalog = shipper.planner.catalogs.get(tools)
    return catalog.smaller_than(shipper.tenant.tools.defer.schema_chars) if catalog else frozenset()


def hit(shipped: frozenset[str], steps: Sequence[Sequence[str]]) -> bool:
    return all(any(t in shipped for t in step) for step in steps)


@dataclass
class Tally:
    """Hits per class over tool-request rows, leanness over conversational ones."""

    hits: dict[str, list[bool]]
    withheld: list[bool]  # requests to act where the gate said no tool is needed
    lean: list[bool]  # conversational turns shipping nothing beyond what every turn ships
    cut: list[float]
    shipped: list[int]

    def recall(self, cls: str | None = None) -> tuple[int, int]:
        rows = [h for c, hs in self.hits.items() if cls is None or c == cls for h in hs]
        return sum(rows), len(rows)


def tally(shipper: Shipper, tools: list[dict[str, Any]], rows: Sequence[dict[str, Any]],
          tokens: bool = False) -> Tally:
    """Rows carry a `query` (one user message) or `messages` (a conversation, the newest user
    message last; lean then means nothing beyond what every turn ships and what the history called)."""
    result = Tally({}, [], [], [], [])
    for row in rows:
        if "messages" in row:
            out = asyncio.run(shipper.ship_messages_async(tools, row["messages"], tokens))
        else:
            out = shipper.ship(tools, row["query"], tokens)
        if row["steps"]:
            result.hits.setdefault(row["class"], []).append(hit(out.names, row["steps"]))
            result.withheld.append(out.outcome == "no_tool_needed")
            result.shipped.append(len(out.names))
            if tokens and out.full_tokens:
                result.cut.append(1 - out.tokens / out.full_tokens)
        else:
            result.lean.append(out.extra == 0)
    return result


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")
