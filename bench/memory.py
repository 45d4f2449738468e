"""The memory gate, measured: precision and recall on a labelled multilingual set, and memory-model
runs on a six-turn conversation through Keel and the stand-in.

    python bench/memory.py

`bench/data/memory_gate.jsonl`: 160 messages in 8 languages (en, es, fr, de, pt, it, ja, zh):
explicit remember / update / forget requests (one per language after the assistant's offer),
and messages that are not requests: stated preferences, personal facts, requests for other help
that mention personal facts, thanks, questions. Written by the team; the gate's patterns were
written by the same hands, so read the figures as a check of coverage, not a held-out score.
"""

from __future__ import annotations

import json
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import httpx
from common import KEY, start_keel, start_standin
from overhead import table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from proxy.memory.gate import LexicalMemoryGate

DATA = Path(__file__).parent / "data" / "memory_gate.jsonl"


def gate_table() -> None:
    gate = LexicalMemoryGate()
    rows = [json.loads(line) for line in DATA.read_text().splitlines()]
    by: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0, 0])  # tp, fn, fp, tn
    misses = []
    for row in rows:
        context = [{"role": "assistant", "content": row["context"]}] if row.get("context") else []
        said_yes = gate.judge_now(row["text"], context, (), {}).probability >= 0.5
        for group in ("all", row["lang"], row["kind"]):
            cell = by[group]
            cell[0 if row["label"] and said_yes else 1 if row["label"] else 2 if said_yes else 3] += 1
        if said_yes != row["label"]:
            misses.append(f"{row['lang']} {row['kind']}: {row['text']}")
    out = []
    for group in ["all", *sorted(k for k in by if len(k) == 2), *sorted(k for k in by if len(k) > 3 and k != "all")]:
        tp, fn, fp, tn = by[group]
        recall = f"{tp / (tp + fn):.3f}" if tp + fn else "-"
        precision = f"{tp / (tp + fp):.3f}" if tp + fp else "-"
        fpr = f"{fp / (fp + tn):.3f}" if fp + tn else "-"
        out.append([group, tp + fn + fp + tn, recall, precision, fpr])
    print(f"\n1. Embedded memory gate on {len(rows)} labelled messages (recall on explicit requests; false-positive"
          " rate on the rest)")
    table(["group", "messages", "recall", "precision", "false-positive rate"], out)
    if misses:
        print("   wrong: " + "; ".join(misses))


def conversation() -> None:
    turns = ["open example.com", "find the links on that page", "thanks!", "I prefer dark mode screenshots",
             "please remember that I prefer dark mode screenshots", "take a screenshot of the page"]
    rows = []
    for gated in (False, True):
        standin, standin_url = start_standin(rules="none")
        extra = {"memory": {"enabled": True, "gate": {"enabled": gated}}, "context": {"stable": True}}
        keel, keel_url, _ = start_keel(standin_url, extra)
        try:
            client = httpx.Client(timeout=30, headers={"authorization": f"Bearer {KEY}", "x-keel-user": "bench"})
            history: list[dict[str, Any]] = []
            for text in turns:
                history.append({"role": "user", "content": text})
                reply = client.post(keel_url + "/v1/chat/completions", json={"model": "m", "messages": history}).json()
                history.append({"role": "assistant", "content": reply["choices"][0]["message"]["content"]})
            time.sleep(1.0)
            metrics = client.get(keel_url + "/metrics").text
            runs = sum(float(line.split()[-1]) for line in metrics.splitlines()
                       if line.startswith("keel_memory_model_runs_total{"))
            memory = client.get(keel_url + "/v1/keel/memory").json()["entries"]
        finally:
            keel.stop()
            standin.stop()
        rows.append(["gate on" if gated else "gate off", len(turns), int(runs), json.dumps(memory)])
    print("\n2. Six-turn conversation through Keel (open a page, find links, thanks, a stated preference,"
          " 'please remember' it, a screenshot)")
    table(["memory", "user turns", "memory-model runs", "memory saved"], rows)


if __name__ == "__main__":
    gate_table()
    conversation()
