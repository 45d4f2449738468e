"""Issue 12's table: first-shot tool recall and the memory gate, each figure labelled.

    .venv/bin/python bench/quality.py [--quick] [--model DIR] [--backends lexical,local]

Labels: `held out` = bench/data/heldout (written by other hands, frozen; only aggregates are
printed, never a row) and the eval halves of public sets (bench/splits.py, frozen before
tuning); `coverage` = sets Keel's patterns and weights were tuned on (bench/data/dev,
bench/data/*.jsonl, the fit halves). `--quick` caps each public set at 150 rows.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import splits
from firstshot import MODEL_DIR, Shipper, catalog_tools, hit, jsonl, make_ranker, tally
from overhead import table
from tools import conversation_before

from proxy.memory.gate import LexicalMemoryGate
from proxy.tokens import TokenCounter
from proxy.tools.catalog import CatalogCache
from proxy.tools.gate import follow_up
from proxy.tools.ranking import LexicalRanker
from proxy.tools.window import Window, _weighted, with_context
from proxy.turn import Turn

DATA = Path(__file__).parent / "data"
HELD = DATA / "heldout"
DEV = DATA / "dev"
Row = list[Any]


def frac(pair: tuple[int, int]) -> str:
    got, n = pair
    return f"{got / n:.2f} ({got}/{n})" if n else "-"


def share(flags: Sequence[bool]) -> tuple[int, int]:
    return sum(flags), len(flags)


def tune_rows(shipper: Shipper) -> dict[str, str]:
    """Only what tuning may look at: Keel's development sets and the public fit halves (coverage)."""
    out: dict[str, str] = {}
    agent, everything, metatool = catalog_tools("agent_8servers.json"), catalog_tools("all_tools.json"), metatool_tools()
    for name, tools in (("208", agent), ("782", everything)):
        dev = tally(shipper, tools, jsonl(DEV / f"tools_{name}.jsonl"))
        for cls in ("act", "paraphrase", "multi_step", "non_english"):
            out[f"C {name} dev {cls}"] = frac(dev.recall(cls))
        out[f"C {name} dev withheld / lean / shipped"] = (f"{frac(share(dev.withheld))}; {frac(share(dev.lean))}; "
                                                          f"{statistics.mean(dev.shipped):.1f}")
    agent_q = [{"query": r["query"], "steps": [[r["tool"]]] if r["tool"] else [], "class": r["kind"]}
               for r in jsonl(DATA / "agent_queries.jsonl")]
    old = tally(shipper, agent, agent_q)
    out["C 208 agent_queries recall / lean / shipped"] = (f"{frac(old.recall())}; {frac(share(old.lean))}; "
                                                          f"{statistics.mean(old.shipped):.1f}")
    single = [{"query": q, "steps": [[t]], "class": "act"} for q, t in splits.metatool_single("fit")][:200]
    fit = tally(shipper, metatool, single)
    out["C MetaTool single (fit half) / shipped"] = f"{frac(fit.recall())}; {statistics.mean(fit.shipped):.1f}"
    multi = [{"query": q, "steps": [[t] for t in ts], "class": "multi"} for q, ts in splits.metatool_multi("fit")][:150]
    out["C MetaTool multi (fit half)"] = frac(tally(shipper, metatool, multi).recall())
    aware = splits.metatool_awareness("fit")[:300]
    gate = tally(shipper, metatool, [{"query": q, "steps": [["?"]] if y else [], "class": "a"} for q, y in aware])
    out["C MetaTool awareness (fit): withheld / lean"] = f"{frac(share(gate.withheld))}; {frac(share(gate.lean))}"
    oos = [t for t, i in splits.clinc("fit") if i == "oos"][:100]
    out["C CLINC150 oos_train lean (208)"] = frac(share(
        tally(shipper, agent, [{"query": t, "steps": [], "class": "c"} for t in oos]).lean))
    out.update(window_rows(shipper, DEV / "window.jsonl", "C"))
    return out


def tool_rows(backend: str, shipper: Shipper, quick: bool) -> dict[str, str]:
    """Every tool figure for one backend, keyed by row name."""
    out: dict[str, str] = {}
    agent, everything = catalog_tools("agent_8servers.json"), catalog_tools("all_tools.json")
    conversational = jsonl(HELD / "conversational.jsonl")
    for name, tools in (("208", agent), ("782", everything)):
        held = tally(shipper, tools, jsonl(HELD / f"tools_{name}.jsonl"), tokens=True)
        lean = tally(shipper, tools, [{**r, "steps": []} for r in conversational])
        out[f"H {name} first-shot recall"] = frac(held.recall())
        for cls in ("act", "paraphrase", "multi_step", "non_english"):
            out[f"H {name} {cls}"] = frac(held.recall(cls))
        out[f"H {name} conversational lean"] = frac(share(lean.lean))
        out[f"H {name} gate withholds (acts)"] = frac(share(held.withheld))
        out[f"H {name} tool-token cut (mean / min)"] = f"{statistics.mean(held.cut):.1%} / {min(held.cut):.1%}"
        out[f"H {name} tools shipped (median)"] = f"{statistics.median(held.shipped):.0f}"
        dev = tally(shipper, tools, jsonl(DEV / f"tools_{name}.jsonl"))
        out[f"C {name} dev recall"] = frac(dev.recall())
        out[f"C {name} dev non_english / multi_step"] = f"{frac(dev.recall('non_english'))}; {frac(dev.recall('multi_step'))}"
        out[f"C {name} dev conversational lean"] = frac(share(dev.lean))
    agent_q = [{"query": r["query"], "steps": [[r["tool"]]] if r["tool"] else [], "class": r["kind"]}
               for r in jsonl(DATA / "agent_queries.jsonl")]
    old = tally(shipper, agent, agent_q)
    out["C 208 agent_queries recall / lean"] = f"{frac(old.recall())}; {frac(share(old.lean))}"
    cap = 150 if quick else None
    metatool = metatool_tools()
    single = [{"query": q, "steps": [[t]], "class": "act"} for q, t in splits.metatool_single("eval")][:cap]
    out["P MetaTool single (199 tools)"] = frac(tally(shipper, metatool, single).recall())
    multi = [{"query": q, "steps": [[t] for t in ts], "class": "multi"} for q, ts in splits.metatool_multi("eval")][:cap]
    out["P MetaTool multi, every tool"] = frac(tally(shipper, metatool, multi).recall())
    aware = splits.metatool_awareness("eval")[:cap]
    gate = tally(shipper, metatool, [{"query": q, "steps": [["?"]] if y else [], "class": "a"} for q, y in aware])
    out["P MetaTool awareness: acts withheld / no-tool lean"] = f"{frac(share(gate.withheld))}; {frac(share(gate.lean))}"
    pool, asks = splits.toolbench()
    asks = asks[: cap or len(asks)]
    every = any_ = 0
    for query, gold in asks:
        names = shipper.ship(pool, query).names
        every += hit(names, [[g] for g in gold])
        any_ += hit(names, [gold])
    out[f"P ToolBench ({len(pool)} tools): every / any gold"] = f"{frac((every, len(asks)))}; {frac((any_, len(asks)))}"
    oos = [t for t, i in splits.clinc("eval") if i == "oos"][: cap or None]
    out["P CLINC150 OOS as chat turns, lean (208)"] = frac(share(
        tally(shipper, agent, [{"query": t, "steps": [], "class": "c"} for t in oos]).lean))
    out.update(window_rows(shipper, HELD / "issue23.jsonl", "H"))
    out.update(api_bank_rows(shipper, quick))
    out.update(window_rows(shipper, DEV / "window.jsonl", "C"))
    return out


WINDOW_CLASSES = ("follow_up", "prerequisite", "scripts", "shared_word")
LEAN_CLASSES = ("explanation", "follow_up_chat")


def window_rows(shipper: Shipper, path: Path, mark: str) -> dict[str, str]:
    """Issue 23's classes (conversations; `mark` H: held out, C: coverage), per class only."""
    out: dict[str, str] = {}
    rows = jsonl(path)
    catalogs = {"208": catalog_tools("agent_8servers.json"), "782": catalog_tools("all_tools.json")}
    for cat, tools in catalogs.items():
        mine = [r for r in rows if r["catalog"] == cat]
        got = tally(shipper, tools, mine)
        for cls in WINDOW_CLASSES:
            if got.recall(cls)[1]:
                out[f"{mark} {cat} {cls}"] = frac(got.recall(cls))
        for cls in LEAN_CLASSES:
            lean = tally(shipper, tools, [r for r in mine if r["class"] == cls]).lean
            if lean:
                out[f"{mark} {cat} {cls} lean"] = frac(share(lean))
    non_latin = [r for r in rows if r["class"] == "scripts"]
    for group, langs in (("CJK", ("zh", "ja", "ko")), ("Arabic script, Hebrew", ("ar", "fa", "he")),
                         ("Indic, Thai", ("hi", "bn", "th"))):
        flags = [hit(shipper.ship_messages(catalogs[r["catalog"]], r["messages"]).names, r["steps"])
                 for r in non_latin if r["lang"] in langs]
        out[f"{mark} scripts: {group}"] = frac(share(flags))
    return out


def after_traffic(backend: str, model: Path) -> dict[str, str]:
    """Held-out prerequisite rows once traffic has shown sequences: a scope taught, through the path
    the responder learns by (`learn_sequence`), each consecutive pair of steps of the dev
    prerequisite rows (coverage sets; other asks than the held-out ones) SEQUENCE_SEEN times."""
    import asyncio

    from proxy.stores.sqlite import SqliteStore
    from proxy.tools.learned import SEQUENCE_SEEN, LearnedPhrases, scope_of

    learned = LearnedPhrases(SqliteStore(":memory:"))
    shipper = Shipper(make_ranker(backend, model), learned=learned)
    scope = scope_of(shipper.tenant.id, Turn(shipper.tenant, b"", {"messages": []}, {}, "bench").owner)

    async def teach() -> None:
        for row in jsonl(DEV / "window.jsonl"):
            if row["class"] == "prerequisite":
                for before, after in zip(row["steps"], row["steps"][1:], strict=False):
                    for _ in range(SEQUENCE_SEEN):
                        await learned.learn_sequence(scope, before[0], after[0])

    asyncio.run(teach())
    out = {}
    rows = jsonl(HELD / "issue23.jsonl")
    for cat, name in (("208", "agent_8servers.json"), ("782", "all_tools.json")):
        mine = [r for r in rows if r["catalog"] == cat and r["class"] == "prerequisite"]
        out[f"H {cat} prerequisite, after traffic of dev sequences"] = frac(tally(shipper, catalog_tools(name), mine).recall())
    return out


def api_bank_rows(shipper: Shipper, quick: bool) -> dict[str, str]:
    """API-Bank level 1 (eval only): the dialogue so far, the gold API shipped first shot?"""
    tools, asks = splits.api_bank()
    asks = asks[: 150 if quick else None]
    got = [hit(shipper.ship_messages(tools, messages).names, [[gold]]) for messages, gold in asks]
    return {f"P API-Bank level 1 dialogues ({len(tools)} APIs), gold shipped": frac(share(got))}


def metatool_tools() -> list[dict[str, Any]]:
    import json

    descriptions = json.loads((splits.EVAL / "metatool" / "plugin_des.json").read_text())
    return [{"type": "function", "function": {"name": n, "description": d,
                                              "parameters": {"type": "object", "properties": {}}}}
            for n, d in descriptions.items()]


def memory_rows(quick: bool) -> tuple[dict[str, str], list[Row]]:
    gate = LexicalMemoryGate()

    def says_yes(text: str, context: Sequence[dict[str, Any]] = ()) -> bool:
        return gate.judge_now(text, context, (), {}).probability >= 0.5

    def scored(rows: Sequence[dict[str, Any]]) -> dict[str, list[tuple[bool, bool, str]]]:
        by: dict[str, list[tuple[bool, bool, str]]] = defaultdict(list)
        for r in rows:
            said = says_yes(r["text"], r.get("context") or [])
            for group in ("all", r["lang"]):
                by[group].append((r["label"], said, r["class"]))
        return by

    def recall_fp(cells: Sequence[tuple[bool, bool, str]], negatives: str | None = None) -> str:
        pos = [s for y, s, _ in cells if y]
        neg = [s for y, s, c in cells if not y and (negatives is None or c == negatives)]
        return f"{frac(share(pos))} / {frac(share(neg))}"

    out: dict[str, str] = {}
    held = scored(jsonl(HELD / "memory_gate.jsonl"))
    out["H memory recall / FP (all negatives)"] = recall_fp(held["all"])
    out["H memory recall / FP (hard negatives)"] = recall_fp(held["all"], "hard_negative")
    per_lang = [["held out", lang, recall_fp(cells), recall_fp(cells, "hard_negative")]
                for lang, cells in sorted(held.items()) if lang != "all"]
    worst = min(sum(y and s for y, s, _ in c) / max(1, sum(y for y, _, _ in c)) for k, c in held.items() if k != "all")
    out["H memory recall, worst language"] = f"{worst:.2f}"
    mix = jsonl(HELD / "chat_mix.jsonl")
    said = [says_yes(r["text"]) for r in mix]
    out["H chat mix: memory-model runs avoided"] = frac((len(mix) - sum(said), len(mix)))
    out["H chat mix: recall / FP"] = (f"{frac(share([s for s, r in zip(said, mix, strict=True) if r['label']]))} / "
                                      f"{frac(share([s for s, r in zip(said, mix, strict=True) if not r['label']]))}")
    dev = scored(jsonl(DEV / "memory_gate.jsonl"))
    out["C dev memory recall / FP (hard)"] = recall_fp(dev["all"], "hard_negative")
    old = [{**r, "context": [{"role": "assistant", "content": r["context"]}] if r.get("context") else [],
            "class": r["kind"]} for r in jsonl(DATA / "memory_gate.jsonl")]
    out["C bench/data/memory_gate.jsonl recall / FP"] = recall_fp(scored(old)["all"])
    clinc = splits.clinc("eval")
    names = [t for t, i in clinc if i == "change_user_name"]
    others = [t for t, i in clinc if i not in ("change_user_name", "change_ai_name")][: 1000 if quick else None]
    out["P CLINC150 change_user_name recall"] = frac(share([says_yes(t) for t in names]))
    out["P CLINC150 other intents + OOS: FP"] = frac(share([says_yes(t) for t in others]))
    out["C BFCL memory turns (fit): FP"] = frac(share([says_yes(t) for t in splits.bfcl_memory_turns()]))
    return out, per_lang


def latency() -> dict[str, str]:
    everything = catalog_tools("all_tools.json")
    extra = [{**t, "function": {**t["function"], "name": t["function"]["name"] + "_v2"}} for t in everything]
    queries = [r["query"] for r in jsonl(DEV / "tools_782.jsonl")] + [r["query"] for r in jsonl(DATA / "agent_queries.jsonl")]
    out = {}
    for size in (200, 1000):
        catalog = CatalogCache(TokenCounter()).get((everything + extra)[:size])
        assert catalog is not None
        ranker, candidates, times = LexicalRanker(), list(range(size)), []
        for _ in range(5):
            for q in queries:
                t0 = time.perf_counter()
                ranker.rank_now(q, catalog, candidates, 5)
                times.append((time.perf_counter() - t0) * 1000)
        out[f"C lexical ranking p50 ms, {size} tools"] = f"{statistics.median(times):.3f}"
        added = []
        for q in queries:
            conversation = conversation_before(q)
            t0 = time.perf_counter()
            window = Window.of(conversation)
            with_context(ranker.rank_now(q, catalog, candidates, 5), window, catalog, candidates, 5,
                         follow_up(q, window.acted), True)
            added.append((time.perf_counter() - t0) * 1000)
            _weighted.cache_clear()
        out[f"C window added p50 ms, {size} tools"] = f"{statistics.median(added) - statistics.median(times):.3f}"
    return out


TARGETS = {"H 208 first-shot recall": ">=0.80 / >=0.90", "H 782 first-shot recall": ">=0.70 / >=0.80",
           "H 782 non_english": ">=0.60", "H 782 multi_step": ">=0.50", "H 208 non_english": ">=0.60",
           "H 208 multi_step": ">=0.50", "H 208 conversational lean": ">=0.90", "H 782 conversational lean": ">=0.90",
           "H 208 gate withholds (acts)": "<=0.02", "H 782 gate withholds (acts)": "<=0.02",
           "H 208 tool-token cut (mean / min)": ">=95%", "H 782 tool-token cut (mean / min)": ">=95%",
           "H memory recall / FP (hard negatives)": ">=0.95 / <=0.15", "H memory recall, worst language": ">=0.95",
           "H chat mix: memory-model runs avoided": ">=0.80", "C lexical ranking p50 ms, 200 tools": "<=1",
           "H 208 follow_up": ">=0.75", "H 782 follow_up": ">=0.75", "H 208 explanation lean": ">=0.85",
           "H 782 explanation lean": ">=0.85", "H scripts: CJK": ">=0.75", "H scripts: Arabic script, Hebrew": ">=0.75",
           "H scripts: Indic, Thai": ">=0.75", "H 208 prerequisite": ">=0.60", "H 782 prerequisite": ">=0.60",
           "C lexical ranking p50 ms, 1000 tools": "<=5",
           "C window added p50 ms, 200 tools": "<=1", "C window added p50 ms, 1000 tools": "<=1"}
LABELS = {"H": "held out", "C": "coverage", "P": "held out (public eval half / eval-only set)"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--model", type=Path, default=MODEL_DIR)
    parser.add_argument("--backends", default="lexical,local")
    parser.add_argument("--tune", action="store_true", help="only the sets tuning may look at (coverage)")
    args = parser.parse_args()
    backends = args.backends.split(",")
    counter = TokenCounter()
    if args.tune:
        tuned = {b: tune_rows(Shipper(make_ranker(b, args.model), counter)) for b in backends}
        table(["figure", *backends], [[k[2:], *(tuned[b][k] for b in backends)] for k in tuned[backends[0]]])
        return
    per_backend = {b: {**tool_rows(b, Shipper(make_ranker(b, args.model), counter), args.quick),
                       **after_traffic(b, args.model)} for b in backends}
    rows: list[Row] = []
    for key in per_backend[backends[0]]:
        rows.append([LABELS[key[0]], key[2:], *(per_backend[b][key] for b in backends), TARGETS.get(key, "")])
    print("\nTools, first shot (defaults; 'lexical' / 'local' backends; targets lexical / local)")
    table(["label", "figure", *backends, "target"], rows)
    memory, per_lang = memory_rows(args.quick)
    print("\nMemory gate (embedded default)")
    table(["label", "figure", "value", "target"], [[LABELS[k[0]], k[2:], v, TARGETS.get(k, "")]
                                                   for k, v in {**memory, **latency()}.items()])
    print("\nMemory gate per language, held out: recall / FP (all negatives), recall / FP (hard negatives)")
    table(["label", "lang", "recall / FP", "recall / FP hard"], per_lang)


if __name__ == "__main__":
    main()
