"""Prompt-cache hits for a LibreChat-like conversation, direct vs through Keel.

    python bench/cache.py

A 12-turn conversation whose client system prompt has a clock line with seconds near the
top, a memory section that changes at turn 4, a section toggled on at turn 6, retrieved
context on turns 7-8, a date change at turn 9, and tool calls on turns 2, 5 and 10; with and
without a 200-tool catalog. Each run gets a fresh stand-in provider simulating OpenAI's or
Anthropic's prefix-cache rules. The direct client marks Anthropic breakpoints the common way
(end of the system prompt, end of the newest message); through Keel, Keel places them.

Input cost is in units of one uncached input token: uncached + 0.1 x cache reads +
1.25 x cache writes. The ceiling is the cached fraction if every token an earlier request
already sent as a prefix were served from cache (measured by the stand-in in whole blocks:
a tool, a message part; it reports it in the x-standin-prefix-ceiling header).
"""

from __future__ import annotations

from typing import Any

import httpx
import orjson
from common import CATALOGS, KEY, start_keel, start_standin
from overhead import table

INSTRUCTIONS = "\n".join(
    f"- Rule {i}: when the user asks about topic {i}, answer precisely, cite the relevant policy section, "
    "and keep the tone friendly but professional." for i in range(40)
)
TOOL_TURNS = {2: "convert_time", 5: "fetch", 10: "read_file"}


def system_prompt(turn: int) -> str:
    day = 30 if turn < 9 else 31  # the date changes at turn 9
    parts = [f"Current date and time: 2026-11-{day} 10:{turn:02d}:{(turn * 7) % 60:02d}",  # ticks every turn
             "You are Acme's assistant.\n\n" + INSTRUCTIONS,
             "<memory>\n" + ("The user likes tea." if turn < 4 else "The user prefers coffee now.") + "\n</memory>"]
    if turn >= 6:
        parts.append("## Web search\nYou may cite web results the user provides.")
    if turn in (7, 8):
        parts.append(f"<retrieved_context>\nDocument {turn}: notes about the quarterly plan, part {turn}.\n"
                     "</retrieved_context>")
    return "\n\n".join(parts)


def tools_for(with_catalog: bool) -> list[dict[str, Any]]:
    catalog: list[dict[str, Any]] = orjson.loads((CATALOGS / "agent_8servers.json").read_bytes())["tools"]
    if with_catalog:  # 200 real tools, the three this conversation calls among them
        wanted = [t for t in catalog if t["function"]["name"] in TOOL_TURNS.values()]
        return [t for t in catalog if t not in wanted][:197] + wanted
    return [t for t in catalog if t["function"]["name"] in TOOL_TURNS.values()]


def mark(message: dict[str, Any]) -> dict[str, Any]:
    text = message["content"] if isinstance(message["content"], str) else None
    if text is None:
        return message
    return {**message, "content": [{"type": "text", "text": text, "cache_control": {"type": "ephemeral"}}]}


def conversation(url: str, rules: str, with_catalog: bool, via_keel: bool) -> tuple[list[dict[str, Any]], int]:
    """Each call's usage, and the stand-in's prefix ceilings summed over the calls."""
    tools = tools_for(with_catalog)
    history: list[dict[str, Any]] = []
    usages = []
    ceiling = 0
    headers = {"authorization": f"Bearer {KEY}", "x-keel-user": "bench-user"}
    client = httpx.Client(timeout=60)
    for turn in range(1, 13):
        text = f"Turn {turn}: tell me more about topic {turn}."
        if turn in TOOL_TURNS:
            text += f" Use {TOOL_TURNS[turn]}. [[call {TOOL_TURNS[turn]} {{}}]]"
        history.append({"role": "user", "content": text})
        if turn == 9:
            headers["x-keel-timezone"] = "Pacific/Kiritimati"  # Keel's own date source rolls over too
        while True:
            messages = [{"role": "system", "content": system_prompt(turn)}, *history]
            if rules == "anthropic" and not via_keel:
                messages = [mark(messages[0]), *messages[1:-1], mark(messages[-1])]
            body = {"model": "claude-sonnet" if rules == "anthropic" else "gpt-4o-mini", "tools": tools,
                    "messages": messages}
            response = client.post(url + "/v1/chat/completions", json=body, headers=headers)
            reply = response.json()
            usages.append(reply["usage"])
            # one upstream call per client call here (each tool is named in its turn): a tool_search
            # round Keel answered itself would add a call whose ceiling header the client never sees
            assert response.headers.get("x-keel-tool-search-rounds", "0") == "0"
            ceiling += int(response.headers["x-standin-prefix-ceiling"])
            message = reply["choices"][0]["message"]
            history.append({k: v for k, v in message.items() if v is not None and k != "refusal"})
            if not message.get("tool_calls"):
                break
            for call in message["tool_calls"]:
                history.append({"role": "tool", "tool_call_id": call["id"], "content": "12:00 UTC, all fine."})
    return usages, ceiling


def summarize(usages: list[dict[str, Any]], ceiling_tokens: int, rules: str) -> dict[str, float]:
    prompt = sum(u["prompt_tokens"] for u in usages)
    reads = sum(u.get("prompt_tokens_details", {}).get("cached_tokens", 0) for u in usages)
    writes = sum(u.get("cache_creation_input_tokens", 0) for u in usages) if rules == "anthropic" else 0
    cost = (prompt - reads - writes) + 0.1 * reads + 1.25 * writes
    ceiling = ceiling_tokens / prompt
    return {"prompt": prompt, "reads": reads, "writes": writes, "cost": cost, "fraction": reads / prompt,
            "ceiling": ceiling, "calls": len(usages)}


def run(rules: str, with_catalog: bool, via_keel: bool, stability: str = "dispatch") -> dict[str, float]:
    standin, standin_url = start_standin(rules=rules)
    keel = None
    try:
        url = standin_url
        if via_keel:
            kind = "anthropic-compatible" if rules == "anthropic" else "openai"
            extra = {"tools": {"enabled": True, "stability": stability}, "context": {"stable": True},
                     "cache": {"breakpoints": "auto", "prompt_cache_key": "auto"}}
            keel, url, _ = start_keel(standin_url, extra, kind=kind)
        return summarize(*conversation(url, rules, with_catalog, via_keel), rules)
    finally:
        if keel:
            keel.stop()
        standin.stop()


def main() -> None:
    rows = []
    for rules in ("openai", "anthropic"):
        for with_catalog in (False, True):
            direct = run(rules, with_catalog, via_keel=False)
            paths = [("direct", direct)]
            for stability in ("segment", "dispatch"):
                paths.append((f"keel ({stability})", run(rules, with_catalog, via_keel=True, stability=stability)))
            for label, r in paths:
                rows.append([rules, "200 tools" if with_catalog else "3 tools", label, r["calls"],
                             f"{r['prompt']:,}", f"{r['reads']:,}", f"{r['writes']:,}", f"{r['fraction']:.3f}",
                             f"{r['ceiling']:.3f}", f"{r['cost']:,.0f}",
                             f"{r['cost'] / direct['cost']:.3f}"])
    print(__doc__.split("\n\n")[1])
    table(["rules", "catalog", "path", "calls", "prompt tokens", "cached (read)", "cache writes", "cached fraction",
           "ceiling", "input cost", "cost vs direct"], rows)


if __name__ == "__main__":
    main()
