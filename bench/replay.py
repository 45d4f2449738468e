"""Learning from traffic, measured by replay: does a second wording of a request ship, first-shot,
the tool a first wording had to find by search?

    .venv/bin/python bench/replay.py [--backend lexical|local] [--pairs N]

Two held-out sources, neither fitted on:
- bench/data/replay_pairs.jsonl: 100 pairs of wordings of one request over the 208- and 782-tool
  catalogs, written by a helper from the catalogs alone and frozen before this was measured;
- MetaTool's single-tool queries (eval half), two different queries per tool (not paraphrases).
Pass 1 sends the first wording through the tool planner; when its tool is not shipped
first-shot, the tool is "found by search" and the turn's words are learned, as the responder
does. Pass 2 sends the second wording, with learning on and, in the same run, off. Reported:
pass-2 first-shot recall for the tools pass 1 had to search for, and for every pair.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT))
import splits  # noqa: E402
from firstshot import Shipper, catalog_tools, jsonl, make_ranker  # noqa: E402
from quality import metatool_tools  # noqa: E402

from proxy.stores.sqlite import SqliteStore  # noqa: E402
from proxy.tools.learned import LearnedPhrases, scope_of  # noqa: E402
from proxy.turn import Turn  # noqa: E402

PAIRS = ROOT / "bench" / "data" / "replay_pairs.jsonl"
CATALOG_FILES = {"208": "agent_8servers.json", "782": "all_tools.json"}


def metatool_pairs(limit: int) -> list[tuple[str, str, str]]:
    """(tool, first query, second query): two eval-half queries per tool, in file order."""
    by_tool: dict[str, list[str]] = defaultdict(list)
    with (splits.EVAL / "metatool" / "all_clean_data.csv").open() as f:
        for row in csv.DictReader(f):
            query, tool = row["Query"], row["Tool"]
            if splits.half(query) == "eval" and len(by_tool[tool]) < 2:
                by_tool[tool].append(query)
    out = [(tool, qs[0], qs[1]) for tool, qs in by_tool.items() if len(qs) == 2]
    return out[:limit]


async def replay(title: str, tools: list[dict[str, Any]], rows: list[tuple[str, str, str]], backend: str) -> None:
    store = SqliteStore(":memory:")
    learned = LearnedPhrases(store)
    learning = Shipper(make_ranker(backend))
    learning.planner.learned = learned
    plain = Shipper(make_ranker(backend))
    searched = []
    for tool, first, _ in rows:
        shipped = await learning.ship_async(tools, first)
        if tool not in shipped.names:  # the model would have searched, found it and called it: learned
            await learned.learn(scope_of(learning.tenant.id, Turn(learning.tenant, b"", {}, {}, "bench").owner), tool,
                                first)
            searched.append(tool)
    found = set(searched)
    on = [await learning.ship_async(tools, second) for _, _, second in rows]
    off = [await plain.ship_async(tools, second) for _, _, second in rows]
    with_learning = [(tool, tool in shipped.names) for (tool, _, _), shipped in zip(rows, on, strict=True)]
    without = [(tool, tool in shipped.names) for (tool, _, _), shipped in zip(rows, off, strict=True)]
    await store.close()

    def recall(results: list[tuple[str, bool]], only: set[str] | None = None) -> str:
        picked = [hit for tool, hit in results if only is None or tool in only]
        return f"{sum(picked) / max(1, len(picked)):.3f} ({sum(picked)}/{len(picked)})"

    print(f"{title} [{backend}] (held out)")
    print(f"  pass 1: {len(rows) - len(found)} shipped first-shot, {len(found)} found by search (learned)")
    print(f"  pass 2, tools pass 1 searched for: learning on {recall(with_learning, found)}, "
          f"off {recall(without, found)}")
    print(f"  pass 2, every pair:                learning on {recall(with_learning)}, off {recall(without)}")
    print(f"  pass 2, tools shipped per request: learning on {sum(len(s.names) for s in on) / len(on):.1f}, "
          f"off {sum(len(s.names) for s in off) / len(off):.1f}")


async def run(backend: str, limit: int) -> None:
    written = jsonl(PAIRS)
    for name, file in CATALOG_FILES.items():
        rows = [(r["tool"], r["first"], r["second"]) for r in written if r["catalog"] == name][:limit]
        await replay(f"replay_pairs.jsonl, {name}-tool catalog, {len(rows)} pairs", catalog_tools(file), rows, backend)
    rows = metatool_pairs(limit)
    await replay(f"MetaTool eval half, {len(rows)} tools, two different queries each", metatool_tools(), rows, backend)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pairs", type=int, default=199, help="at most this many pairs per source")
    parser.add_argument("--backend", choices=("lexical", "local"), default="lexical")
    args = parser.parse_args()
    asyncio.run(run(args.backend, args.pairs))


if __name__ == "__main__":
    main()
