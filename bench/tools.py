"""Lean tools, measured: the seed's cut table, ranker quality, end to end, ranking latency.

    python bench/tools.py [--quick] [--model DIR]

1. Everything loaded vs what Keel ships, on the real 8-server / 208-tool catalog, counted
   by the stand-in provider (tiktoken o200k_base) for a targeted and a conversational prompt,
   per `search.listing` (names, the default, names every deferred tool: DESIGN's invariant 3;
   auto and groups fold name families into counts for fewer tokens); then prompt tokens per call
   of a 4-call loop of a 25-tool browser agent (Playwright MCP's default tools).
2. Ranker quality: MetaTool (199 tools, 995 query→tool rows, 1,040 awareness rows) and
   `bench/data/agent_queries.jsonl` (queries over the 208-tool catalog, a third of them
   paraphrases sharing no word with the tool's name, plus turns that need no tool); under each
   backend, the issue's recipe (rank_bm25's BM25 over name and description, fused with the same
   vectors for `local`) measured in the same run as the baseline.
3. End to end through Keel and the stand-in: does the client end up calling the right
   tool, and how many tool_search round trips did it take?
4. Ranking latency on a warm index, 200 and 1,000 tools, against parsing the request (same run).
5. The local backend's costs: embedding a catalog, and a turn against the lexical backend.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import orjson
from common import CATALOGS, KEY, SHARED, start_keel, start_standin
from firstshot import Synchronous, make_ranker
from overhead import table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from proxy.config import parse_config
from proxy.metrics import Metrics
from proxy.standin.script import hidden_call
from proxy.tokens import TokenCounter
from proxy.tools.catalog import CatalogCache
from proxy.tools.gate import follow_up
from proxy.tools.planner import ToolPlan, ToolPlanner
from proxy.tools.ranking import LexicalRanker
from proxy.tools.window import Window, _weighted, with_context
from proxy.turn import Turn

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
    rows = []
    tools = agent_tools()
    try:
        for mode in ("auto", "names", "groups"):
            keel, keel_url, _ = start_keel(standin_url, {"tools": {"enabled": True, "search": {"listing": mode}}})
            try:
                for label, prompt in (("targeted", TARGETED), ("conversational", CONVERSATIONAL)):
                    body = {"model": "gpt-4o-mini", "tools": tools, "messages": [{"role": "user", "content": prompt}]}
                    direct = parse_report(httpx.post(standin_url + "/v1/chat/completions", json=body, timeout=60)
                                          .headers["x-standin-tools"])
                    via = httpx.post(keel_url + "/v1/chat/completions", json=body, timeout=60,
                                     headers={"authorization": f"Bearer {KEY}"})
                    shipped = parse_report(via.headers["x-standin-tools"])
                    cut = 100 * (1 - shipped["tokens"] / direct["tokens"])
                    rows.append([label, mode, direct["count"], f"{direct['tokens']:,}", shipped["count"],
                                 f"{shipped['tokens']:,}", f"-{cut:.2f}%", via.headers["x-keel-tools"]])
            finally:
                keel.stop()
    finally:
        standin.stop()
    print(f"\n1. Tool block, everything loaded vs through Keel ({len(tools)} tools, 8 servers; shortlist 5, cut at a"
          " 20% score drop; tokens by the stand-in, o200k_base; shipped count includes tool_search; listing 'names'"
          " is the default and names every deferred tool)")
    print(f"   targeted: {TARGETED!r}; conversational: {CONVERSATIONAL!r}")
    table(["prompt", "search.listing", "loaded tools", "loaded tokens", "shipped tools", "shipped tokens", "cut",
           "x-keel-tools"], rows)


BROWSER_TASK = "Open https://example.com, follow the 'More information' link and take a screenshot of the page"


def browser_session() -> list[list[dict[str, Any]]]:
    """The messages of each call of a 4-call browser-agent loop (the history grows with calls and results)."""
    steps = [("browser_navigate", {"url": "https://example.com"}, "Navigated to https://example.com (Example Domain)"),
             ("browser_snapshot", {}, "- heading 'Example Domain'\n- link 'More information...' [ref=e6]"),
             ("browser_click", {"element": "More information link", "ref": "e6"}, "Clicked; now at iana.org"),
             ("browser_take_screenshot", {}, "Saved page-1.png")]
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a careful browser agent."},
                                      {"role": "user", "content": BROWSER_TASK}]
    calls = []
    for i, (name, args, result) in enumerate(steps):
        calls.append(list(messages))
        messages += [{"role": "assistant", "content": None, "tool_calls": [
                         {"id": f"c{i}", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}]},
                     {"role": "tool", "tool_call_id": f"c{i}", "content": result}]
    return calls


def browser_table() -> None:
    """Prompt tokens per call of a 25-tool browser agent, direct vs through Keel (LibreChat: -69%)."""
    tools: list[dict[str, Any]] = orjson.loads((CATALOGS / "playwright_default.json").read_bytes())["tools"]
    standin, standin_url = start_standin(rules="openai")
    keel, keel_url, _ = start_keel(standin_url, {"tools": {"enabled": True}})
    direct_tokens, keel_tokens, shipped = [], [], []
    try:
        for messages in browser_session():
            body = {"model": "gpt-4o-mini", "tools": tools, "messages": messages}
            direct = httpx.post(standin_url + "/v1/chat/completions", json=body, timeout=60)
            via = httpx.post(keel_url + "/v1/chat/completions", json=body, timeout=60,
                             headers={"authorization": f"Bearer {KEY}"})
            direct_tokens.append(direct.json()["usage"]["prompt_tokens"])
            keel_tokens.append(via.json()["usage"]["prompt_tokens"])
            shipped.append(via.headers["x-keel-tools"])
    finally:
        keel.stop()
        standin.stop()
    rows = [[i + 1, f"{d:,}", f"{k:,}", f"-{100 * (1 - k / d):.1f}%", s]
            for i, (d, k, s) in enumerate(zip(direct_tokens, keel_tokens, shipped, strict=True))]
    total = 100 * (1 - sum(keel_tokens) / sum(direct_tokens))
    rows.append(["all", f"{sum(direct_tokens):,}", f"{sum(keel_tokens):,}", f"-{total:.1f}%", ""])
    print(f"\n1b. A {len(tools)}-tool browser agent (Playwright MCP's default tools), prompt tokens per call of a"
          f" 4-call loop, direct vs through Keel (defaults; LibreChat measured -69%); task: {BROWSER_TASK!r}")
    table(["call", "direct prompt tokens", "keel prompt tokens", "cut", "x-keel-tools"], rows)


MODEL_DIR = SHARED / "data" / "models" / "all-MiniLM-L6-v2-int8"


def backends() -> list[str]:
    try:
        import onnxruntime  # noqa: F401
    except ImportError:
        print("(onnxruntime not installed: the local backend is skipped)")
        return ["lexical"]
    return ["lexical", "local"]


def select_for(backend: str, model: Path = MODEL_DIR) -> dict[str, Any]:
    return {"backend": backend, **({"model_dir": str(model)} if backend == "local" else {})}


def planner_for(ranker: Any, defer: dict[str, Any] | None = None) -> tuple[ToolPlanner, Any]:
    config = parse_config({"store": {"url": "sqlite:///:memory:"}, "tenants": [{
        "id": "bench", "auth": {"passthrough": True}, "upstream": {"base_url": "http://x"},
        "tools": {"enabled": True, "defer": {"min_tools": 0, **(defer or {})}}}]})
    planner = ToolPlanner(CatalogCache(TokenCounter()), lambda c: ranker, Metrics(), lambda plan, ranker: plan)
    return planner, config.tenants[0]


async def surfaced(planner: ToolPlanner, tenant: Any, tools: list[dict[str, Any]], query: str) -> ToolPlan | None:
    request = Turn(tenant, b"", {"model": "m", "tools": tools, "messages": [{"role": "user", "content": query}]},
                          {}, "bench")
    planned = await planner.plan(request)
    return planned.responder if isinstance(planned.responder, ToolPlan) else None


def recall(order: Any, targeted: list[tuple[str, str]]) -> list[str]:
    """R@1, R@5 and MRR of a ranking function (query → names, best first) over (query, gold) pairs."""
    r1 = r5 = mrr = 0.0
    for query, gold in targeted:
        names = order(query)
        if gold in names:
            rank = names.index(gold)
            r1 += rank == 0
            r5 += rank < 5
            mrr += 1 / (rank + 1)
    n = len(targeted)
    return [f"{r1 / n:.3f}", f"{r5 / n:.3f}", f"{mrr / n:.3f}"]


class Recipe:
    """The issue's recipe outside Keel, a baseline measured in the same run: rank_bm25's BM25Okapi
    over the lowercased words of name and description (tools scoring 0 unranked, as in Keel);
    with `local` (a LocalRanker), fused 0.2 x BM25/max + 0.8 x min-max cosine over that ranker's
    own vectors, so the two differ only in their BM25."""

    def __init__(self, catalog: Any, local: Any = None) -> None:
        from rank_bm25 import BM25Okapi

        self.catalog = catalog
        self.bm25 = BM25Okapi([self.words(f"{e.name} {e.description}") for e in catalog.entries])
        self.local = local

    @staticmethod
    def words(text: str) -> list[str]:
        return re.findall(r"\w+", text.lower())

    def order(self, query: str) -> list[str]:
        import numpy as np

        bm25 = self.bm25.get_scores(self.words(query))
        if self.local is None:
            ranked = [i for i in np.argsort(-bm25, kind="stable") if bm25[i] > 0]
        else:
            cosine = self.local.matrix(self.catalog) @ self.local.encoder.encode([query])[0]
            scaled = (cosine - cosine.min()) / max(float(cosine.max() - cosine.min()), 1e-9)
            top = float(bm25.max())
            ranked = list(np.argsort(-(0.8 * scaled + (0.2 * bm25 / top if top > 0 else 0.0)), kind="stable"))
        return [self.catalog.entries[i].name for i in ranked]


async def quality(backend: str, ranker: Any, name: str, tools: list[dict[str, Any]],
                  targeted: list[tuple[str, str]], needs: list[tuple[str, bool]]) -> list[Any]:
    catalog = CatalogCache(TokenCounter()).get(tools)
    assert catalog is not None
    everything = list(range(len(tools)))
    planner, tenant = planner_for(Synchronous(ranker), defer={"schema_chars": 0})
    scores = recall(lambda q: [catalog.entries[i].name for i in ranker.rank_now(q, catalog, everything, 5).order],
                    targeted)
    in_surfaced = 0.0
    shown = []
    for query, gold in targeted:
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
    return [backend, name, len(tools), n, *scores, f"{in_surfaced / n:.3f}",
            f"{statistics.mean(shown):.1f}", len(needs), f"{correct / len(needs):.3f}"]


def baseline(label: str, recipe: Recipe, name: str, targeted: list[tuple[str, str]]) -> list[Any]:
    return [label, name, len(recipe.catalog.entries), len(targeted), *recall(recipe.order, targeted), "-", "-", "-", "-"]


async def quality_tables(model: Path = MODEL_DIR) -> None:
    mt_rows = [json.loads(line) for line in (METATOOL / "task2_subtask3_reliability.jsonl").read_text().splitlines()]
    awareness = [json.loads(line) for line in (METATOOL / "task1_awareness.jsonl").read_text().splitlines()]
    agent = [json.loads(line) for line in AGENT_QUERIES.read_text().splitlines()]
    sets = [
        ("MetaTool", metatool_tools(), [(r["query"], r["tool"]) for r in mt_rows],
         [(r["query"], r["label"] == "positive") for r in awareness]),
        ("agent (all targeted)", agent_tools(), [(r["query"], r["tool"]) for r in agent if r["tool"]],
         [(r["query"], r["tool"] is not None) for r in agent]),
        ("agent (paraphrases)", agent_tools(), [(r["query"], r["tool"]) for r in agent if r["kind"] == "paraphrase"],
         [(r["query"], r["tool"] is not None) for r in agent]),
    ]
    rows = []
    for backend in backends():
        ranker = make_ranker(backend, model)
        for name, tools, targeted, needs in sets:
            rows.append(await quality(backend, ranker, name, tools, targeted, needs))
            catalog = CatalogCache(TokenCounter()).get(tools)
            rows.append(baseline(f"  recipe {'BM25' if backend == 'lexical' else 'fused'}",
                                 Recipe(catalog, ranker if backend == "local" else None), name, targeted))
    print("\n2. Ranker quality per backend (recall@k of the ranking; 'surfaced' = the gold tool is among the"
          " tools Keel ships, after naming, gate and widening; gate = needs-tool accuracy). Under each backend,"
          " the issue's recipe measured in the same run: rank_bm25 over name + description words, and its fusion"
          " with the same vectors")
    table(["backend", "set", "tools", "queries", "R@1", "R@5", "MRR", "surfaced", "avg shipped", "gate rows", "gate acc"],
          rows)
    ratios = [f"{keel[0]} {keel[5]}/{recipe[5]} = {float(keel[5]) / float(recipe[5]):.2f}x"
              for keel, recipe in zip(rows[::2], rows[1::2], strict=True) if keel[1] == "MetaTool"]
    print("   MetaTool R@5, Keel / recipe: " + "; ".join(ratios))


def end_to_end(backend: str, search: dict[str, Any] | None = None, model: Path = MODEL_DIR) -> tuple[list[Any], str]:
    """Does the client end up calling the right tool, and after how many tool_search rounds?
    Returns the table row and a line naming the misses."""
    standin, standin_url = start_standin(rules="none")
    keel, keel_url, _ = start_keel(standin_url, {"tools": {"enabled": True, "select": select_for(backend, model),
                                                           "search": search or {}}})
    agent = [json.loads(line) for line in AGENT_QUERIES.read_text().splitlines()]
    targeted = [r for r in agent if r["tool"]]
    tools = agent_tools()
    outcomes = {"direct": 0, "one search": 0, "more": 0, "wrong or none": 0}
    missed: list[str] = []
    try:
        client = httpx.Client(timeout=60, headers={"authorization": f"Bearer {KEY}"})
        if backend == "local":  # the first sight of a catalog starts its embedding in the background
            client.post(keel_url + "/v1/chat/completions", json={"model": "m", "tools": tools, "messages": [
                {"role": "user", "content": "warm up"}]})
            time.sleep(20)
        for row in targeted:
            body = {"model": "m", "tools": tools,
                    "messages": [{"role": "user", "content": row["query"] + " " + hidden_call(row["tool"], search_by_words=True)}]}
            response = client.post(keel_url + "/v1/chat/completions", json=body)
            calls = response.json()["choices"][0]["message"].get("tool_calls") or []
            ok = [c["function"]["name"] for c in calls] == [row["tool"]]
            searches = int(response.headers.get("x-keel-tool-search-rounds", "0"))
            key = "wrong or none" if not ok else "direct" if searches == 0 else "one search" if searches == 1 else "more"
            outcomes[key] += 1
            if not ok:
                missed.append(f"{row['query']!r} → {row['tool']}")
    finally:
        keel.stop()
        standin.stop()
    n = len(targeted)
    good = outcomes["direct"] + outcomes["one search"]
    results = (search or {}).get("max_results", 5)
    misses = (f"   {backend}, {results} results: missed {len(missed)}: " + "; ".join(missed[:8])
              + (" …" if len(missed) > 8 else "")) if missed else ""
    return [backend, results, n, outcomes["direct"], outcomes["one search"],
            outcomes["more"], outcomes["wrong or none"], f"{outcomes['one search'] / n:.3f}", f"{good / n:.3f}"], misses


def local_latency(model: Path) -> None:
    """The local backend's costs: embedding a new catalog (once, in the background) and a turn."""
    from proxy.tools.local import LocalEncoder, LocalRanker

    tools = agent_tools()
    catalog = CatalogCache(TokenCounter()).get(tools)
    assert catalog is not None
    ranker = LocalRanker(LocalEncoder(model))
    started = time.perf_counter()
    ranker.matrix(catalog)
    build_s = time.perf_counter() - started
    queries = [json.loads(line)["query"] for line in AGENT_QUERIES.read_text().splitlines()]
    lexical, everything = LexicalRanker(), list(range(len(tools)))
    times: list[float] = []
    lexical_times: list[float] = []
    for query in queries:
        t0 = time.perf_counter()
        ranker.rank_now(query, catalog, everything, 5)
        times.append((time.perf_counter() - t0) * 1000)
        t0 = time.perf_counter()
        lexical.rank_now(query, catalog, everything, 5)
        lexical_times.append((time.perf_counter() - t0) * 1000)
    local_ms, lexical_ms = statistics.median(times), statistics.median(lexical_times)
    print(f"\n5. Local backend ({model.name}), {len(tools)} tools: embedding the catalog {build_s:.1f} s (once, in the"
          f" background); a turn (encode + fuse) p50 {local_ms:.1f} ms = {local_ms / lexical_ms:.0f}x the lexical"
          f" backend's {lexical_ms:.2f} ms in the same run")


def conversation_before(query: str) -> list[dict[str, Any]]:
    """Two exchanges with tool calls and replies before `query`: the window a follow-up is read in."""
    messages: list[dict[str, Any]] = []
    for i, (ask, name) in enumerate((("list the open pull requests in acme/web", "list_pull_requests"),
                                     ("show me the failing checks of the first one", "get_job_logs"))):
        messages += [{"role": "user", "content": ask},
                     {"role": "assistant", "content": None, "tool_calls": [{"id": f"c{i}", "type": "function",
                      "function": {"name": name, "arguments": json.dumps({"owner": "acme", "repo": "web"})}}]},
                     {"role": "tool", "tool_call_id": f"c{i}", "content": "#412 Add dark mode\n#409 Bump axios"},
                     {"role": "assistant", "content": "Two are open: #412 and #409; #409 failed its tests."}]
    return [*messages, {"role": "user", "content": query}]


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
        assert catalog is not None
        build_ms = (time.perf_counter() - started) * 1000
        while len(catalog.tokens) < len(catalog.entries):  # token counting runs once, in the background
            time.sleep(0.05)
        last = tools[-1]["function"]
        changed = [*tools[:-1], {**tools[-1], "function": {**last, "description": last.get("description", "") + "!"}}]
        started = time.perf_counter()
        cache.get(changed)  # one tool changed: only it is re-derived
        rebuild_ms = (time.perf_counter() - started) * 1000
        ranker = LexicalRanker()
        everything = list(range(len(tools)))
        times, hits, parses, windowed = [], [], [], []
        for _ in range(3 if quick else 10):
            for query in agent:
                body = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": query}], "tools": tools})
                t0 = time.perf_counter()
                orjson.loads(body)  # the baseline: parsing the request, which every request costs anyway
                parses.append((time.perf_counter() - t0) * 1000)
                t0 = time.perf_counter()
                cache.get(tools)  # the per-request lookup (hash of the tools array)
                ranker.rank_now(query, catalog, everything, 5)
                times.append((time.perf_counter() - t0) * 1000)
                t1 = time.perf_counter()
                catalog.names_in(query, 5)
                hits.append((time.perf_counter() - t1) * 1000)
                conversation = conversation_before(query)
                t1 = time.perf_counter()  # the window: the turns before read as context (fresh: no cache)
                window = Window.of(conversation)
                ranking = ranker.rank_now(query, catalog, everything, 5)
                with_context(ranking, window, catalog, everything, 5, follow_up(query, window.acted), True)
                windowed.append((time.perf_counter() - t1) * 1000 - times[-1])
                _weighted.cache_clear()
        times.sort()
        parse = statistics.median(parses)
        rows.append([size, f"{build_ms:.1f}", f"{rebuild_ms:.1f} ({rebuild_ms / build_ms:.2f}x)",
                     f"{statistics.median(times):.3f}", f"{times[int(0.99 * len(times))]:.3f}",
                     f"{statistics.median(windowed):+.3f}",
                     f"{statistics.median(hits):.3f}", f"{parse:.3f}", f"{statistics.median(times) / parse:.2f}x"])
    print("\n4. Ranking latency, lexical backend, warm index (ms; one index build per catalog, then lookups)")
    table(["tools", "index build (once)", "one tool changed (vs build)", "lookup+rank p50", "lookup+rank p99",
           "window added p50 (3 exchanges)",
           "name matching p50", "request parse p50 (baseline)", "lookup+rank / parse"], rows)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--model", type=Path, default=MODEL_DIR,
                        help="the local backend's model directory (a mean-pooled sentence-embedding model as ONNX:"
                             " model.onnx + tokenizer.json); default: the shared all-MiniLM-L6-v2 int8")
    args = parser.parse_args()
    seed_table()
    browser_table()
    asyncio.run(quality_tables(args.model))
    runs = [end_to_end(backend, {"max_results": results}, args.model) for backend in backends() for results in (5, 8)]
    print(f"\n3. End to end through Keel and the stand-in (targeted queries over {len(agent_tools())} tools; the"
          " stand-in searches with the user's words, never the tool's name; search.max_results 5 is the default)")
    table(["backend", "search results", "queries", "right, no search", "right, one search", "more searches",
           "wrong or none", "share with a round trip", "success (<=1 search)"], [row for row, _ in runs])
    print("\n".join(misses for _, misses in runs if misses))
    latency(args.quick)
    if "local" in backends():
        local_latency(args.model)
