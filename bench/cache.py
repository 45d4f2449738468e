"""Prompt-cache hits and input cost, direct vs through Keel, on three conversations and three API shapes.

    python bench/cache.py [--part current|agent|shapes ...] [--stability per_turn|segment|dispatch|auto ...]

`current`: a 12-turn LibreChat-like conversation whose client system prompt has a clock line with
seconds near the top, a memory section that changes at turn 4, a section toggled on at turn 6,
retrieved context on turns 7-8, a date change at turn 9, and tool calls on turns 2, 5 and 10 (each
tool named by the user); with and without a 200-tool catalog. `agent`: the same turns for an agent
holding the whole 208-tool catalog (big schemas: 290 KB), whose tool turns call one named tool
(turn 2) and two the model has to search for (turns 5 and 10, named nowhere in the conversation).
`shapes`: the current conversation on /v1/responses (OpenAI's rules) and /v1/messages (Anthropic's),
as the SDKs send it. Each run gets a fresh stand-in provider simulating the provider's prefix-cache
rules. The direct client marks Anthropic breakpoints the common way (end of the system prompt, end
of the newest message); through Keel, Keel places them. Every conversation is measured twice:
with no id of any kind ("conversation id: none": no `user`, no conversation id; Keel knows the
conversation by the answers it relayed, README: the isolation rule) and with both sent ("sent").
The stand-in answers each turn as a model would, "You said: …" and some 40 sampled words.

Input cost is in units of one uncached input token: uncached + 0.1 x cache reads + 1.25 x cache
writes. The ceiling is the cached fraction if every token an earlier request already sent as a
prefix were served from cache (measured by the stand-in in whole blocks: a tool, a message part; it
reports it in the x-standin-prefix-ceiling header; a tool_search round Keel answers itself is a call
the client never sees the header of, so the agent rows have no ceiling).
"""

from __future__ import annotations

import argparse
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
AGENT_TURNS = {2: "convert_time", 5: "slack_post_message", 10: "maps_geocode"}  # 5 and 10: found by search
PARTS = ("current", "agent", "shapes")


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


def catalog() -> list[dict[str, Any]]:
    tools: list[dict[str, Any]] = orjson.loads((CATALOGS / "agent_8servers.json").read_bytes())["tools"]
    return tools


def tools_for(with_catalog: bool) -> list[dict[str, Any]]:
    tools = catalog()
    if with_catalog:  # 200 real tools, the three this conversation calls among them
        wanted = [t for t in tools if t["function"]["name"] in TOOL_TURNS.values()]
        return [t for t in tools if t not in wanted][:197] + wanted
    return [t for t in tools if t["function"]["name"] in TOOL_TURNS.values()]


def user_text(turn: int, agent: bool) -> str:
    text = f"Turn {turn}: tell me more about topic {turn}. [[ramble 40]]"
    if agent and turn in AGENT_TURNS and turn != 2:  # a tool the model must search for: named nowhere
        return text + " [[callx " + AGENT_TURNS[turn].encode().hex() + " {}]]"
    tool = (AGENT_TURNS if agent else TOOL_TURNS).get(turn)
    return text + (f" Use {tool}. [[call {tool} {{}}]]" if tool else "")


class Chat:
    """A Chat Completions client's history and body."""

    path = "/v1/chat/completions"

    def __init__(self, tools: list[dict[str, Any]], anthropic_marks: bool) -> None:
        self.tools, self.marks, self.history = tools, anthropic_marks, list[dict[str, Any]]()

    def user(self, text: str) -> None:
        self.history.append({"role": "user", "content": text})

    def body(self, system: str, model: str) -> dict[str, Any]:
        messages = [{"role": "system", "content": system}, *self.history]
        if self.marks:
            messages = [mark(messages[0]), *messages[1:-1], mark(messages[-1])]
        return {"model": model, "tools": self.tools, "messages": messages}

    def answer(self, reply: dict[str, Any]) -> bool:
        """Take the reply into the history (with the tools' results); whether it called tools."""
        message = reply["choices"][0]["message"]
        self.history.append({k: v for k, v in message.items() if v is not None and k != "refusal"})
        for call in message.get("tool_calls") or []:
            self.history.append({"role": "tool", "tool_call_id": call["id"], "content": "12:00 UTC, all fine."})
        return bool(message.get("tool_calls"))

    @staticmethod
    def usage(reply: dict[str, Any]) -> tuple[int, int, int]:
        u = reply["usage"]
        return u["prompt_tokens"], u.get("prompt_tokens_details", {}).get("cached_tokens", 0), \
            u.get("cache_creation_input_tokens", 0)


class Responses(Chat):
    """A stateless /v1/responses client (the Agents SDK's way): output items go back as input."""

    path = "/v1/responses"

    def __init__(self, tools: list[dict[str, Any]], anthropic_marks: bool) -> None:
        super().__init__([{"type": "function", **t["function"]} for t in tools], False)

    def user(self, text: str) -> None:
        self.history.append({"role": "user", "content": text})

    def body(self, system: str, model: str) -> dict[str, Any]:
        return {"model": model, "instructions": system, "input": self.history, "tools": self.tools, "store": False}

    def answer(self, reply: dict[str, Any]) -> bool:
        calls = [item for item in reply["output"] if item["type"] == "function_call"]
        self.history += reply["output"]
        self.history += [{"type": "function_call_output", "call_id": c["call_id"], "output": "12:00 UTC, all fine."}
                         for c in calls]
        return bool(calls)

    @staticmethod
    def usage(reply: dict[str, Any]) -> tuple[int, int, int]:
        u = reply["usage"]
        return u["input_tokens"], u.get("input_tokens_details", {}).get("cached_tokens", 0), 0


class Messages(Chat):
    """An Anthropic /v1/messages client; direct, it marks the system prompt and the newest block."""

    path = "/v1/messages"

    def __init__(self, tools: list[dict[str, Any]], anthropic_marks: bool) -> None:
        super().__init__([{"name": t["function"]["name"], "description": t["function"].get("description", ""),
                           "input_schema": t["function"].get("parameters") or {"type": "object"}} for t in tools],
                         anthropic_marks)

    def user(self, text: str) -> None:
        self.history.append({"role": "user", "content": [{"type": "text", "text": text}]})

    def body(self, system: str, model: str) -> dict[str, Any]:
        messages = self.history
        system_blocks: Any = system
        if self.marks:
            system_blocks = [{"type": "text", "text": system, "cache_control": {"type": "ephemeral"}}]
            last = messages[-1]
            messages = [*messages[:-1], {**last, "content": [*last["content"][:-1],
                                                             {**last["content"][-1], "cache_control": {"type": "ephemeral"}}]}]
        return {"model": model, "max_tokens": 1024, "system": system_blocks, "messages": messages, "tools": self.tools}

    def answer(self, reply: dict[str, Any]) -> bool:
        calls = [b for b in reply["content"] if b["type"] == "tool_use"]
        self.history.append({"role": "assistant", "content": reply["content"]})
        if calls:
            self.history.append({"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": c["id"], "content": "12:00 UTC, all fine."} for c in calls]})
        return bool(calls)

    @staticmethod
    def usage(reply: dict[str, Any]) -> tuple[int, int, int]:
        u = reply["usage"]
        reads, writes = u.get("cache_read_input_tokens", 0), u.get("cache_creation_input_tokens", 0)
        return u["input_tokens"] + reads + writes, reads, writes


SHAPES: dict[str, type[Chat]] = {"chat": Chat, "responses": Responses, "messages": Messages}


def mark(message: dict[str, Any]) -> dict[str, Any]:
    text = message["content"] if isinstance(message["content"], str) else None
    if text is None:
        return message
    return {**message, "content": [{"type": "text", "text": text, "cache_control": {"type": "ephemeral"}}]}


def conversation(url: str, rules: str, tools: list[dict[str, Any]], via_keel: bool, agent: bool = False,
                 shape: str = "chat", named: bool = True) -> dict[str, Any]:
    """Usage summed over the upstream calls, the calls, and the stand-in's prefix ceilings summed
    over the calls whose header the client saw (None when Keel answered a search itself)."""
    client = SHAPES[shape](tools, anthropic_marks=rules == "anthropic" and not via_keel)
    prompt = reads = writes = calls = 0
    ceiling: int | None = 0
    headers = {"authorization": f"Bearer {KEY}"}
    if named:  # the client names its user and its conversation (without: proof of continuity, README)
        headers |= {"x-keel-user": "bench-user", "x-keel-conversation": "bench-conversation"}
    http = httpx.Client(timeout=60)
    model = "claude-sonnet" if rules == "anthropic" else "gpt-4o-mini"
    for turn in range(1, 13):
        client.user(user_text(turn, agent))
        if turn == 9:
            headers["x-keel-timezone"] = "Pacific/Kiritimati"  # Keel's own date source rolls over too
        while True:
            response = http.post(url + client.path, json=client.body(system_prompt(turn), model), headers=headers)
            assert response.status_code == 200, response.text
            reply = response.json()
            p, r, w = client.usage(reply)
            prompt, reads, writes = prompt + p, reads + r, writes + w
            rounds = int(response.headers.get("x-keel-tool-search-rounds", "0"))
            calls += 1 + rounds
            if rounds or ceiling is None:
                ceiling = None
            else:
                ceiling += int(response.headers["x-standin-prefix-ceiling"])
            if not client.answer(reply):
                break
    return {"prompt": prompt, "reads": reads, "writes": writes if rules == "anthropic" else 0, "calls": calls,
            "ceiling_tokens": ceiling}


def summarize(r: dict[str, Any]) -> dict[str, Any]:
    prompt, reads, writes = r["prompt"], r["reads"], r["writes"]
    cost = (prompt - reads - writes) + 0.1 * reads + 1.25 * writes
    ceiling = r["ceiling_tokens"] / prompt if r["ceiling_tokens"] is not None else None
    return {**r, "cost": cost, "fraction": reads / prompt, "ceiling": ceiling}


def run(rules: str, tools: list[dict[str, Any]], via_keel: bool, stability: str = "dispatch", agent: bool = False,
        shape: str = "chat", named: bool = True) -> dict[str, Any]:
    standin, standin_url = start_standin(rules=rules)
    keel = None
    try:
        url = standin_url
        if via_keel:
            kind = "anthropic-compatible" if rules == "anthropic" else "openai"
            extra = {"tools": {"enabled": True, "stability": stability}, "context": {"stable": True},
                     "cache": {"breakpoints": "auto", "prompt_cache_key": "auto"}}
            keel, url, _ = start_keel(standin_url, extra, kind=kind)
        return summarize(conversation(url, rules, tools, via_keel, agent, shape, named))
    finally:
        if keel:
            keel.stop()
        standin.stop()


def rows_for(label: str, rules: str, catalog_label: str, tools: list[dict[str, Any]], agent: bool = False,
             shape: str = "chat", stabilities: tuple[str, ...] = ("segment", "dispatch"),
             named: bool = True) -> list[list[Any]]:
    direct = run(rules, tools, via_keel=False, agent=agent, shape=shape, named=named)
    paths = [("direct", direct)]
    for stability in stabilities:
        paths.append((f"keel ({stability})", run(rules, tools, True, stability, agent, shape, named)))
    return [[label, "sent" if named else "none", rules, catalog_label, path, r["calls"], f"{r['prompt']:,}", f"{r['reads']:,}",
             f"{r['writes']:,}", f"{r['fraction']:.3f}", "-" if r["ceiling"] is None else f"{r['ceiling']:.3f}",
             f"{r['cost']:,.0f}", f"{r['cost'] / direct['cost']:.3f}"] for path, r in paths]


def main(parts: list[str], stabilities: tuple[str, ...] = ("auto",)) -> None:
    rows: list[list[Any]] = []
    for rules in ("openai", "anthropic"):
        if "current" in parts:
            for with_catalog in (False, True):
                for named in (False, True):
                    rows += rows_for("current", rules, "200 tools" if with_catalog else "3 tools",
                                     tools_for(with_catalog), named=named, stabilities=stabilities)
        if "agent" in parts:
            for named in (False, True):
                rows += rows_for("agent", rules, "208 tools", catalog(), agent=True, named=named,
                                 stabilities=stabilities)
    if "shapes" in parts:
        for shape, rules in (("responses", "openai"), ("messages", "anthropic")):
            for with_catalog in (False, True):
                for named in (False, True):
                    rows += rows_for(f"current /v1/{shape}", rules, "200 tools" if with_catalog else "3 tools",
                                     tools_for(with_catalog), shape=shape, stabilities=stabilities, named=named)
    print(__doc__.split("\n\n")[-1])
    table(["conversation", "conversation id", "rules", "catalog", "path", "calls", "prompt tokens", "cached (read)", "cache writes",
           "cached fraction", "ceiling", "input cost", "cost vs direct"], rows)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--part", action="append", choices=PARTS, help="what to measure (default: all)")
    parser.add_argument("--stability", action="append", choices=("per_turn", "segment", "dispatch", "auto"),
                        help="tools.stability of the Keel rows (default: auto, Keel's default)")
    args = parser.parse_args()
    main(args.part or list(PARTS), tuple(args.stability or ("auto",)))
