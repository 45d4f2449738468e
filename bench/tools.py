"""Lean tools, measured: the seed's cut table, ranker quality, end to end, ranking latency.

    python bench/tools.py [--quick]

1. Everything loaded vs what Keel ships, on the real 8-server / 208-tool catalog, counted
   by the stand-in provider (tiktoken o200k_base) for a targeted and a conversational prompt.
2. Ranker quality: MetaTool (199 tools, 995 query→tool rows, 1,040 awareness rows) and
   `bench/data/agent_queries.jsonl` (queries over the 208-tool catalog, a third of them
   paraphrases sharing no word with the tool's name, plus turns that need no tool).
3. End to end through Keel and the stand-in: does the client end up calling the right
   tool, and how many tool_search round trips did it take?
4. Ranking latency on a warm index, 200 and 1,000 tools.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import orjson
from common import CATALOGS, KEY, SHARED, start_keel, start_standin
from overhead import table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from proxy.config import parse_config  # noqa: E402
from proxy.ingress import ChatRequest  # noqa: E402
from proxy.metrics import Metrics  # noqa: E402
from proxy.standin.script import hidden_call  # noqa: E402
from proxy.tokens import TokenCounter  # noqa: E402
from proxy.tools.catalog import CatalogCache, build_catalog  # noqa: E402
from proxy.tools.planner import ToolPlan, ToolPlanner  # noqa: E402
from proxy.tools.ranking import LexicalRanker  # noqa: E402

METATOOL = SHARED / "data" / "eval" / "metatool"
AGENT_QUERIES = Path(__file__).parent / "data" / "agent_queries.jsonl"
TARGETED = "Create a new branch called feature-login in the acme/web repo and open a pull request for it"
CONVERSATIONAL = "thanks, that was really helpful"


def agent_tools() -> list[dict[str, Any]]:
    tools: list[dict[str, Any]] = orjson.loads((CATALOGS / "agent_8servers.json").read_bytes())["tools"]
    return tools


def metatool_tools() -> list[dict[str, Any]]:
    descriptions = json.loads((METATOOL / "plugin_des.json").read_text())
    return [{"type": "function", "function": {"name": n, "description": d,
                                              "parameters": {"type": "object", "properties": {}}}}
            for n, d in descriptions.items()]


def parse_report(header: str) -> dict[str, int]:
    return {k: int(v) for k, v in (part.split("=") for part in header.split("; "))}


def seed_table() -> None:
    standin, standin_url = start_standin(rules="openai")
    keel, keel_url, _ = start_keel(standin_url, {"tools": {"enabled": True}})
    rows = []
    try:
        tools = agent_tools()
        for label, prompt in (("targeted", TARGETED), ("conversational", CONVERSATIONAL)):
            body = {"model": "gpt-4o-mini", "tools": tools, "messages": [{"role": "user", "content": prompt}]}
            headers = {"authorization": f"Bearer {KEY}"}
            direct = parse_report(httpx.post(standin_url + "/v1/chat/completions", json=body, timeout=60)
                                  .headers["x-standin-tools"])
            via = httpx.post(keel_url + "/v1/chat/completions", json=body, headers=headers, timeout=60)
            shipped = parse_report(via.headers["x-standin-tools"])
            rows.append([label, direct["count"], f"{direct['tokens']:,}", shipped["count"], f"{shipped['tokens']:,}",
                         f"-{100 * (1 - shipped['tokens'] / direct['tokens']):.1f}%", via.headers["x-keel-tools"]])
    finally:
        keel.stop()
        standin.stop()
    print(f"\n1. Tool block, everything loaded vs through Keel ({len(tools)} tools, 8 servers; shortlist 5;"
          " tokens by the stand-in, o200k_base; shipped count includes tool_search)")
    table(["prompt", "loaded tools", "loaded tokens", "shipped tools", "shipped tokens", "cut", "x-keel-tools"], rows)


def planner_for(select: dict[str, Any] | None = None, defer: dict[str, Any] | None = None) -> tuple[ToolPlanner, Any]:
    config = parse_config({"store": {"url": "sqlite:///:memory:"}, "tenants": [{
        "id": "bench", "auth": {"passthrough": True}, "upstream": {"base_url": "http://x"},
        "tools": {"enabled": True, "select": select or {}, "defer": {"min_tools": 0, **(defer or {})}}}]})
    ranker = LexicalRanker()
    planner = ToolPlanner(CatalogCache(TokenCounter()), lambda c: ranker, Metrics(), lambda plan: plan)
    return planner, config.tenants[0]


async def surfaced(planner: ToolPlanner, tenant: Any, tools: list[dict[str, Any]], query: str) -> ToolPlan | None:
    request = ChatRequest(tenant, b"", {"model": "m", "tools": tools, "messages": [{"role": "user", "content": query}]},
                          {}, "bench")
    planned = await planner.plan(request)
    return planned.responder if isinstance(planned.responder, ToolPlan) else None


async def quality(name: str, tools: list[dict[str, Any]], targeted: list[tuple[str, str]],
                  needs: list[tuple[str, bool]]) -> list[Any]:
    catalog = build_catalog(name, tools)
    ranker = LexicalRanker()
    everything = list(range(len(tools)))
    planner, tenant = planner_for(defer={"schema_chars": 0})
    r1 = r5 = mrr = in_surfaced = 0.0
    shown = []
    for query, gold in targeted:
        order = [catalog.entries[i].name for i in ranker.rank_now(query, catalog, everything, 5).order]
        if gold in order:
            rank = order.index(gold)
            r1 += rank == 0
            r5 += rank < 5
            mrr += 1 / (rank + 1)
        plan = await surfaced(planner, tenant, tools, query)
        names = plan.surfaced if plan else ()
        in_surfaced += gold in names
        shown.append(len(names))
    correct = 0
    for query, needs_tool in needs:
        plan = await surfaced(planner, tenant, tools, query)
        ranked = plan is not None and plan.outcome == "ranked"
        correct += ranked == needs_tool
    n = len(targeted)
    return [name, len(tools), n, f"{r1 / n:.3f}", f"{r5 / n:.3f}", f"{mrr / n:.3f}", f"{in_surfaced / n:.3f}",
            f"{statistics.mean(shown):.1f}", len(needs), f"{correct / len(needs):.3f}"]


async def quality_tables() -> None:
    mt_rows = [json.loads(line) for line in (METATOOL / "task2_subtask3_reliability.jsonl").read_text().splitlines()]
    awareness = [json.loads(line) for line in (METATOOL / "task1_awareness.jsonl").read_text().splitlines()]
    agent = [json.loads(line) for line in AGENT_QUERIES.read_text().splitlines()]
    rows = [
        await quality("MetaTool", metatool_tools(), [(r["query"], r["tool"]) for r in mt_rows],
                      [(r["query"], r["label"] == "positive") for r in awareness]),
        await quality("agent (all targeted)", agent_tools(), [(r["query"], r["tool"]) for r in agent if r["tool"]],
                      [(r["query"], r["tool"] is not None) for r in agent]),
        await quality("agent (paraphrases)", agent_tools(),
                      [(r["query"], r["tool"]) for r in agent if r["kind"] == "paraphrase"],
                      [(r["query"], r["tool"] is not None) for r in agent]),
    ]
    print("\n2. Ranker quality, lexical backend (recall@k of the ranking; 'surfaced' = the gold tool is among the"
          " tools Keel ships, after naming, gate and widening; gate = needs-tool accuracy)")
    table(["set", "tools", "queries", "R@1", "R@5", "MRR", "surfaced", "avg shipped", "gate rows", "gate acc"], rows)


def end_to_end(quick: bool) -> None:
    standin, standin_url = start_standin(rules="none")
    keel, keel_url, _ = start_keel(standin_url, {"tools": {"enabled": True}})
    agent = [json.loads(line) for line in AGENT_QUERIES.read_text().splitlines()]
    targeted = [r for r in agent if r["tool"]]
    tools = agent_tools()
    outcomes = {"direct": 0, "one search": 0, "more": 0, "wrong or none": 0}
    try:
        client = httpx.Client(timeout=60, headers={"authorization": f"Bearer {KEY}"})
        for row in targeted:
            body = {"model": "m", "tools": tools,
                    "messages": [{"role": "user", "content": row["query"] + " " + hidden_call(row["tool"], search_by_words=True)}]}
            response = client.post(keel_url + "/v1/chat/completions", json=body)
            calls = response.json()["choices"][0]["message"].get("tool_calls") or []
            ok = [c["function"]["name"] for c in calls] == [row["tool"]]
            searches = int(response.headers.get("x-keel-tool-search-rounds", "0"))
            key = "wrong or none" if not ok else "direct" if searches == 0 else "one search" if searches == 1 else "more"
            outcomes[key] += 1
    finally:
        keel.stop()
        standin.stop()
    n = len(targeted)
    good = outcomes["direct"] + outcomes["one search"]
    print(f"\n3. End to end through Keel and the stand-in ({n} targeted queries over {len(tools)} tools;"
          " the stand-in searches with the user's words, never the tool's name)")
    table(["right tool, no search", "right tool, one search", "more searches", "wrong or none", "success (≤1 search)"],
          [[outcomes["direct"], outcomes["one search"], outcomes["more"], outcomes["wrong or none"], f"{good / n:.3f}"]])


def latency(quick: bool) -> None:
    all_tools: list[dict[str, Any]] = orjson.loads((CATALOGS / "all_tools.json").read_bytes())["tools"]
    extra = [{**t, "function": {**t["function"], "name": t["function"]["name"] + "_v2"}} for t in all_tools]
    agent = [json.loads(line)["query"] for line in AGENT_QUERIES.read_text().splitlines()]
    rows = []
    for size in (200, 1000):
        tools = (all_tools + extra)[:size]
        cache = CatalogCache(TokenCounter())
        started = time.perf_counter()
        catalog = cache.get(tools)
        build_ms = (time.perf_counter() - started) * 1000
        ranker = LexicalRanker()
        everything = list(range(len(tools)))
        times, hits = [], []
        for _ in range(3 if quick else 10):
            for query in agent:
                t0 = time.perf_counter()
                cache.get(tools)  # the per-request lookup (hash of the tools array)
                ranker.rank_now(query, catalog, everything, 5)
                times.append((time.perf_counter() - t0) * 1000)
                t1 = time.perf_counter()
                catalog.names_in(query, 5)
                hits.append((time.perf_counter() - t1) * 1000)
        times.sort()
        rows.append([size, f"{build_ms:.1f}", f"{statistics.median(times):.3f}", f"{times[int(0.99 * len(times))]:.3f}",
                     f"{statistics.median(hits):.3f}"])
    print("\n4. Ranking latency, lexical backend, warm index (ms; one index build per catalog, then lookups)")
    table(["tools", "index build (once)", "lookup+rank p50", "lookup+rank p99", "name matching p50"], rows)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    seed_table()
    asyncio.run(quality_tables())
    end_to_end(args.quick)
    latency(args.quick)
