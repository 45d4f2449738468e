"""`keel demo`: one agent conversation, run twice (straight to a stand-in provider, and through Keel),
with what each cost.

The agent holds a large tool catalog (`demo_catalog`), its system prompt carries a clock that ticks
every call, and over six user messages it chats, files an issue, asks to be remembered, reaches a
tool that Keel deferred (the model searches for it), asks the time and signs off. The direct run's
figures are measured (the usage a second stand-in reports, under the same cache rules); through
Keel, they are what Keel's upstream reported. Both are priced from the same table.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx
import uvicorn

from proxy.config import ServerConfig
from proxy.demo_catalog import demo_catalog
from proxy.jsontext import JsonObject
from proxy.prices import PriceTable
from proxy.shapes.chat import CHAT
from proxy.standin.app import create_standin_app
from proxy.standin.script import hidden_call
from proxy.usage import Usage

MODEL = "gpt-4o"
SYSTEM = ("You are Relay, the engineering team's agent. You file and triage issues, talk to the team in chat, "
          "look things up and keep notes. Be brief; confirm what you did.\n\nCurrent time: {clock}")
TURNS = [
    "Hi! I'm picking up the login bug on the web app today.",
    "Create an issue in acme/web titled 'Login fails on Safari 17' with the QA repro steps. "
    + hidden_call("issue_write", '{"owner": "acme", "repo": "web", "title": "Login fails on Safari 17"}'),
    "Please remember that I prefer short answers and that my team is Platform.",
    "Let everyone following the release know the fix is in review. " + hidden_call("slack_post_message"),
    "What time is it in Tokyo right now? " + hidden_call("get_current_time", '{"timezone": "Asia/Tokyo"}'),
    "Thanks, that's all for today!",
]


@dataclass
class Run:
    usage: Usage = field(default_factory=Usage)
    calls: int = 0
    tools_called: list[str] = field(default_factory=list)


def converse(base_url: str, key: str, tools: list[JsonObject], headers: dict[str, str]) -> Run:
    """The agent: each user message, then tool results until the model answers in text."""
    run = Run()
    messages: list[JsonObject] = [{"role": "system", "content": ""}]
    started = time.time()
    with httpx.Client(base_url=base_url, headers={"authorization": f"Bearer {key}", **headers}, timeout=60) as http:
        for text in TURNS:
            messages.append({"role": "user", "content": text})
            for _ in range(4):
                clock = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(started + run.calls * 37))
                messages[0] = {"role": "system", "content": SYSTEM.format(clock=clock)}
                reply = http.post("/chat/completions", json={"model": MODEL, "messages": messages, "tools": tools,
                                                              "user": "demo-user"})
                reply.raise_for_status()
                data = reply.json()
                run.calls += 1
                run.usage = run.usage + (CHAT.usage(data.get("usage")) or Usage())
                message = data["choices"][0]["message"]
                messages.append({k: v for k, v in message.items() if v is not None})
                calls = message.get("tool_calls") or []
                if not calls:
                    break
                for call in calls:
                    run.tools_called.append(call["function"]["name"])
                    messages.append({"role": "tool", "tool_call_id": call["id"],
                                     "content": f'{{"ok": true, "tool": "{call["function"]["name"]}"}}'})
    return run


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _in_thread(server: uvicorn.Server) -> threading.Thread:
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.time() + 15
    while not server.started and time.time() < deadline:
        time.sleep(0.05)
    return thread


def start_standin() -> tuple[str, uvicorn.Server]:
    """A private stand-in for the direct run (same model, same cache rules as the quickstart's)."""
    from proxy.server import uvicorn_config

    port = _free_port()
    server = uvicorn.Server(uvicorn_config(create_standin_app(), "127.0.0.1", port, ServerConfig(), log_level="error"))
    _in_thread(server)
    return f"http://127.0.0.1:{port}/v1", server


def start_quickstart(port: int, store: str) -> threading.Thread:
    """The quickstart in this process, for a demo run with no Keel listening yet."""
    from proxy.server import serve_quickstart

    thread = threading.Thread(target=lambda: asyncio.run(serve_quickstart("127.0.0.1", port, store)), daemon=True)
    thread.start()
    return thread


def reachable(url: str) -> bool:
    try:
        return httpx.get(url + "/healthz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def keel_estimate(url: str, key: str, conversation: str) -> dict[str, float]:
    """What Keel's page says about this conversation (its direct figures are estimates)."""
    data = httpx.get(f"{url}/keel/api/conversation", params={"id": conversation},
                     headers={"authorization": f"Bearer {key}"}, timeout=10).json()
    turns = data.get("turns") or []
    return {"turns": len(turns), "usd_direct": sum(t["direct_usd"] for t in turns),
            "usd_keel": sum(t["keel_usd"] for t in turns), "input_direct": sum(t["direct"]["input"] for t in turns)}


def run_demo(url: str, key: str, say: Callable[[str], None] = print) -> JsonObject:
    tools, source = demo_catalog()
    conversation = f"demo-{int(time.time())}"
    standin_url, standin = start_standin()
    try:
        say(f"An agent with {source}; {len(TURNS)} user messages, a clock in its system prompt.\n")
        direct = converse(standin_url, "direct", tools, {})
        keel = converse(url + "/v1", key, tools, {"x-keel-conversation": conversation})
    finally:
        standin.should_exit = True
    estimate: dict[str, float] = {}
    for _ in range(40):  # the turns' figures are written just after each answer
        estimate = keel_estimate(url, key, conversation)
        if estimate["turns"] >= keel.calls:
            break
        time.sleep(0.1)
    price = PriceTable().price(MODEL)
    rows = [("model calls", f"{direct.calls:,}", f"{keel.calls:,}"),
            ("input tokens", f"{direct.usage.input:,}", f"{keel.usage.input:,}"),
            ("  of which cached", f"{direct.usage.cached:,}", f"{keel.usage.cached:,}"),
            (f"dollars ({MODEL})", f"${price.cost(direct.usage):.4f}", f"${price.cost(keel.usage):.4f}")]
    say(f"{'':22}{'direct':>14}{'through Keel':>16}")
    for label, a, b in rows:
        say(f"{label:22}{a:>14}{b:>16}")
    cut = 1 - keel.usage.input / direct.usage.input if direct.usage.input else 0.0
    saved = price.cost(direct.usage) - price.cost(keel.usage)
    say(f"\nThrough Keel: {cut:.0%} fewer input tokens, ${saved:.4f} saved on {len(TURNS)} messages "
        f"(direct measured on a second stand-in with the same cache rules).")
    if estimate.get("turns"):
        say(f"Keel's own estimate of direct, from what it saw: ${estimate['usd_direct']:.4f} "
            f"(measured: ${price.cost(direct.usage):.4f}).")
    say(f"Tools the model called: {', '.join(keel.tools_called) or 'none'}.")
    say(f"\nSee it turn by turn: {url}/keel/conversation?id={conversation}  (sign in with the key {key})")
    return {"direct": direct, "keel": keel, "conversation": conversation, "estimate": estimate}


def main(url: str, key: str, port: int, store: str, wait: bool, yes: bool) -> int:
    if os.environ.get("OPENAI_API_KEY") and not yes:
        print("OPENAI_API_KEY is set: the quickstart would send the demo to OpenAI (a few cents). "
              "Run `keel demo --yes` to go ahead, or unset it to use the stand-in.")
        return 2
    started = None
    if not reachable(url):
        print(f"No Keel at {url}: starting the quickstart here (stand-in provider, every feature on).")
        started = start_quickstart(port, store)
        for _ in range(100):
            if reachable(url):
                break
            time.sleep(0.1)
    run_demo(url, key)
    if started is not None and wait:
        print("\nKeel keeps running so you can open the page; Ctrl-C to stop.")
        with contextlib.suppress(KeyboardInterrupt):
            started.join()
    return 0
