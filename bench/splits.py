"""Which public rows Keel may be fitted on and which it is only measured on: frozen before tuning.

A row's half is decided by its text alone (BLAKE2b, first byte, low bit), so the split never
moves when a set grows or is re-ordered, and nothing about a row's outcome can move it. Sets
marked `eval only` are never fitted on, whole. `bench/data/splits.json` records each set's
counts and a digest of its rows per half; `python bench/splits.py --check` fails when a
loader's rows drift from it (the freeze is what makes a figure "held out").

    fit   MetaTool awareness/single/multi (fit half), CLINC150 train + oos_train,
          BFCL memory prerequisite turns, Keel's own bench/data/dev and bench/data/*.jsonl
    eval  MetaTool (eval half), CLINC150 test + oos_test, ToolBench (all), API-Bank level 1 (all: `api_bank`),
          and the frozen bench/data/heldout (written by other hands; never read by the tuning code)
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
EVAL = ROOT.parent / "shared" / "data" / "eval"
MANIFEST = Path(__file__).parent / "data" / "splits.json"


def half(text: str) -> str:
    """'fit' or 'eval', from the text alone."""
    return "fit" if hashlib.blake2b(text.encode()).digest()[0] & 1 == 0 else "eval"


def _jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def metatool_single(part: str) -> list[tuple[str, str]]:
    """(query, tool) over MetaTool's 199 tools (the reliability rows: one gold tool each)."""
    rows = _jsonl(EVAL / "metatool" / "task2_subtask3_reliability.jsonl")
    return [(r["query"], r["tool"]) for r in rows if half(r["query"]) == part]


def metatool_awareness(part: str) -> list[tuple[str, bool]]:
    """(query, needs a tool) from MetaTool's awareness set."""
    rows = _jsonl(EVAL / "metatool" / "task1_awareness.jsonl")
    return [(r["query"], r["label"] == "positive") for r in rows if half(r["query"]) == part]


def metatool_multi(part: str) -> list[tuple[str, list[str]]]:
    """(query, [two gold tools]): MetaTool's multi-tool asks, every tool must ship."""
    rows = json.loads((EVAL / "metatool" / "multi_tool_query_golden.json").read_text())
    return [(r["query"], list(r["tool"])) for r in rows if half(r["query"]) == part]


def toolbench() -> tuple[list[dict[str, Any]], list[tuple[str, list[str]]]]:
    """Eval only. The pool of every (tool, api) the test queries name, as OpenAI tools named
    `<tool>__<api>`, and (query, [gold names]) per query."""
    tools: dict[str, dict[str, Any]] = {}
    asks = []
    for group in ("G1_instruction", "G1_category", "G1_tool", "G2_instruction", "G2_category", "G3_instruction"):
        for row in json.loads((EVAL / "toolbench_stable" / f"{group}.json").read_text()):
            for api in row["api_list"]:
                name = _safe(f"{api['tool_name']}__{api['api_name']}")
                params = {p["name"]: {"type": "string", "description": str(p.get("description") or "")[:200]}
                          for p in api.get("required_parameters", []) + api.get("optional_parameters", [])}
                tools.setdefault(name, {"type": "function", "function": {
                    "name": name, "description": f"{api['tool_name']}: {api.get('api_description') or ''}",
                    "parameters": {"type": "object", "properties": params}}})
            gold = [_safe(f"{t}__{a}") for t, a in row["relevant APIs"]]
            asks.append((row["query"], [g for g in gold if g in tools]))
    return list(tools.values()), [(q, g) for q, g in asks if g]


def api_bank() -> tuple[list[dict[str, Any]], list[tuple[list[dict[str, Any]], str]]]:
    """Eval only. API-Bank level 1: the APIs its dialogues offer (49, as OpenAI tools) and
    (chat messages, gold API) per row: the dialogue so far as user and assistant messages, each
    earlier `API-Request: [Name(...)]->result` as an assistant tool call and its result; the
    newest user message is the turn ranked (the API it needs often rests on the turns before)."""
    rows = json.loads((EVAL / "api_bank" / "level-1-api.json").read_text())
    apis: dict[str, dict[str, Any]] = {}
    for row in rows:
        listed = row["instruction"].split("API descriptions:", 1)[1]
        for line in listed.strip().splitlines():
            if line.strip().startswith("{"):
                api = json.loads(line)
                params = {k: {"type": "string", "description": str(v.get("description", ""))}
                          for k, v in (api.get("input_parameters") or {}).items()}
                apis.setdefault(api["name"], {"type": "function", "function": {
                    "name": api["name"], "description": api.get("description", ""),
                    "parameters": {"type": "object", "properties": params}}})
    asks = []
    for row in rows:
        gold = row["expected_output"].split("[", 1)[1].split("(", 1)[0].strip()
        asks.append((_dialogue(row["input"]), gold))
    return list(apis.values()), asks


def _dialogue(text: str) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    for line in text.splitlines():
        who, _, said = line.partition(":")
        said = said.strip()
        if who == "User":
            messages.append({"role": "user", "content": said})
        elif who == "AI":
            messages.append({"role": "assistant", "content": said})
        elif who == "API-Request" and "(" in said:
            call, _, result = said.strip("[").partition("->")
            name, _, args = call.partition("(")
            cid = f"call_{len(messages)}"
            messages.append({"role": "assistant", "content": None, "tool_calls": [{
                "id": cid, "type": "function", "function": {"name": name.strip(), "arguments": args.rstrip(")]")}}]})
            messages.append({"role": "tool", "tool_call_id": cid, "content": result})
        elif messages and who not in ("Generate API Request", "API-Request"):
            messages[-1]["content"] = f"{messages[-1]['content']}\n{line}"
    while messages and messages[-1]["role"] != "user":  # the request ends at the newest user message
        messages.pop()
    return messages


def _safe(name: str) -> str:
    out = "".join(c if c.isalnum() or c in "_-" else "_" for c in name)
    return out[:64]


def clinc(part: str) -> list[tuple[str, str]]:
    """(text, intent); fit = train + oos_train, eval = test + oos_test."""
    data = json.loads((EVAL / "clinc150" / "data_full.json").read_text())
    keys = ("train", "oos_train") if part == "fit" else ("test", "oos_test")
    return [(t, i) for k in keys for t, i in data[k]]


def bfcl_memory_turns() -> list[str]:
    """Fit only: the users' turns of BFCL's memory prerequisite conversations (they state facts and
    ask for help; none asks the assistant to keep anything)."""
    out = []
    for path in sorted((EVAL / "bfcl" / "memory_prereq_conversation").glob("*.json")):
        for row in _jsonl(path):
            out += [m["content"] for turn in row["question"] for m in turn if m["role"] == "user"]
    return out


SETS: dict[str, Callable[[], Any]] = {
    "metatool_single/fit": lambda: metatool_single("fit"),
    "metatool_single/eval": lambda: metatool_single("eval"),
    "metatool_awareness/fit": lambda: metatool_awareness("fit"),
    "metatool_awareness/eval": lambda: metatool_awareness("eval"),
    "metatool_multi/fit": lambda: metatool_multi("fit"),
    "metatool_multi/eval": lambda: metatool_multi("eval"),
    "toolbench/eval": lambda: toolbench()[1],
    "api_bank/eval": lambda: api_bank()[1],
    "clinc/fit": lambda: clinc("fit"),
    "clinc/eval": lambda: clinc("eval"),
    "bfcl_memory_turns/fit": bfcl_memory_turns,
}


def manifest() -> dict[str, dict[str, Any]]:
    out = {}
    for name, load in SETS.items():
        rows = load()
        out[name] = {"rows": len(rows), "blake2b": hashlib.blake2b(json.dumps(rows).encode(), digest_size=8).hexdigest()}
    return out


if __name__ == "__main__":
    current = manifest()
    if "--check" in sys.argv:
        frozen = json.loads(MANIFEST.read_text())
        drift = [k for k in frozen if frozen[k] != current.get(k)]
        print("splits: frozen" if not drift else f"splits drifted: {drift}")
        sys.exit(1 if drift else 0)
    MANIFEST.write_text(json.dumps(current, indent=1) + "\n")
    print(json.dumps(current, indent=1))
