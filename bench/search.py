"""What a tool_search answer costs against what it hides: whole schemas vs the found tool's schema and briefs.

    python bench/search.py

Every labelled request of Keel's development sets (bench/data/dev: tools_208 over the 208-tool
agent catalog, tools_782 over all_tools.json; coverage sets, tuned on) is searched for as a model
would, with the user's words (`{"query": ...}`), every tool deferred, 5 results, under dispatch
(the answer is where the model reads a schema) and segment stability (found tools are loaded into
the tool list). Before: every match's whole schema in the answer (and, under segment, loaded).
Now: the best match's (or the tools asked for by name) whole, the rest as briefs (name,
description, required parameter names). A needed tool that comes only as a brief costs a round
trip (a search by its name); one not in the answer at all costs one either way.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import orjson
from common import CATALOGS
from overhead import table

from proxy import jsontext
from proxy.tokens import TokenCounter
from proxy.tools.catalog import Catalog, CatalogCache
from proxy.tools.ranking import LexicalRanker
from proxy.tools.search import answer_search

DEV = Path(__file__).parent / "data" / "dev"
SETS = (("tools_208", "agent_8servers.json"), ("tools_782", "all_tools.json"))


async def measure(rows: list[dict[str, Any]], catalog: Catalog, tokens: TokenCounter) -> dict[str, float]:
    deferred = [e.name for e in catalog.entries]
    ranker = LexicalRanker()
    steps = first = listed = 0
    before = now_dispatch = now_segment = before_segment = 0
    for row in rows:
        arguments = orjson.dumps({"query": row["query"]}).decode()
        answer = await answer_search(arguments, catalog, deferred, 5, ranker, dispatch=True)
        loaded = await answer_search(arguments, catalog, deferred, 5, ranker, dispatch=False)
        entries = catalog.entries_for(answer.listed)
        whole = jsontext.dumps({"tools": [e.schema() for e in entries], "note": ""}).decode()
        before += tokens.count(whole)
        now_dispatch += tokens.count(answer.content)
        # segment: the answer plus the schemas loaded into the tool list for the next call
        before_segment += tokens.count(whole) + sum(catalog.tokens.get(e.name, e.chars // 4) for e in entries)
        now_segment += tokens.count(loaded.content) + sum(catalog.tokens.get(n, 0) for n in loaded.found)
        for alternatives in row["steps"]:
            steps += 1
            first += any(n in answer.found for n in alternatives)
            listed += any(n in answer.listed for n in alternatives)
    n = len(rows)
    return {"requests": n, "steps": steps, "first": first / steps, "listed": listed / steps,
            "round trips": (listed - first) / steps, "before": before / n, "dispatch": now_dispatch / n,
            "before segment": before_segment / n, "segment": now_segment / n}


async def main() -> None:
    tokens = TokenCounter()
    out = []
    for name, catalog_file in SETS:
        rows = [r for r in map(orjson.loads, (DEV / f"{name}.jsonl").read_bytes().splitlines()) if r["steps"]]
        tools = orjson.loads((CATALOGS / catalog_file).read_bytes())["tools"]
        cache = CatalogCache(tokens)
        catalog = cache.get(tools)
        assert catalog is not None
        cache._count_tokens(catalog)  # exact token counts now, not the background estimate
        r = await measure(rows, catalog, tokens)
        out.append([f"{name} (coverage)", r["requests"], r["steps"], f"{r['listed']:.2f}", f"{r['first']:.2f}",
                    f"{r['round trips']:.2f}", f"{r['before']:.0f}", f"{r['dispatch']:.0f}",
                    f"{r['before segment']:.0f}", f"{r['segment']:.0f}"])
    print(__doc__.split("\n\n")[2])
    table(["set", "requests", "steps", "needed tool in answer", "found whole (no extra trip)",
           "extra round trips per step", "tokens before (dispatch)", "tokens now (dispatch)",
           "tokens before (segment, + loaded)", "tokens now (segment, + loaded)"], out)


if __name__ == "__main__":
    asyncio.run(main())
