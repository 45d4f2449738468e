"""Client matrix: real client libraries on their default APIs, direct vs through Keel's quickstart.

    python3 -m venv /work/clis/venv        # any venv outside the repository
    /work/clis/venv/bin/pip install -e . openai anthropic langchain-openai langchain-anthropic litellm \\
        'pydantic-ai-slim[openai,anthropic]' openai-agents
    /work/clis/venv/bin/python bench/clients.py [--client NAME ...] [--list]

The client libraries are not Keel's dependencies, so they live in their own venv (with Keel installed
editable into it); a client whose library is missing is skipped, saying so. Each setup holds the
208-tool catalog of 8 real MCP servers (../shared/data/catalogs/agent_8servers.json, read through
bench/common.py) and a 2,200-token system prompt, and has a 5-turn conversation: a greeting, a
question the model answers with a tool it finds by name in the catalog (the client runs the tool and
sends its result back), a follow-up, a request to remember something and a sign-off; the stand-in
answers each turn with a model's sampled words. Every setup runs twice, each time against a fresh
stand-in provider (Chat Completions and Responses under OpenAI's cache rules, Messages under
Anthropic's): directly, and through a fresh Keel with the quickstart's configuration
(proxy/server.py QUICKSTART_FEATURES: every feature at its default; Keel's own model calls go to a
second stand-in, so they are counted apart and added to Keel's bill).

Printed per setup and path: turns completed, the calls the provider answered, tool tokens per call,
input tokens, the cached fraction of them, and dollars (input, cache reads and writes, output, at
proxy/prices.py's prices for gpt-4o and claude-sonnet-4-5; Keel's own calls at theirs). Targets
(issue 21): through Keel, input tokens and dollars below direct for every client, cached fraction
>= direct - 0.05.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import logging
import os
import socket
import sys
import threading
import time
import traceback
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # LiteLLM: no price list from the network
os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")

import uvicorn  # noqa: E402
from common import catalog_tools  # noqa: E402

from proxy.app import create_app  # noqa: E402
from proxy.config import ServerConfig, parse_config  # noqa: E402
from proxy.prices import PriceTable  # noqa: E402
from proxy.server import QUICKSTART_FEATURES, uvicorn_config  # noqa: E402
from proxy.standin.app import StandIn, create_standin_app  # noqa: E402
from proxy.usage import Usage  # noqa: E402

KEY = "sk-keel-bench"
OPENAI_MODEL = "gpt-4o"
ANTHROPIC_MODEL = "claude-sonnet-4-5"
RESULT = "Tokyo: 2026-11-30 19:04 JST (UTC+9)."
INSTRUCTIONS = "\n".join(
    f"- Rule {i}: when the user asks about area {i} of their work, answer precisely, say which tool you used "
    "and why, and keep the tone friendly but professional." for i in range(60))
SYSTEM = "You are Acme's operations assistant. You help one user with their work.\n\n" + INSTRUCTIONS
TURNS = [
    "Hi! I have a busy week with a trip to Japan coming up. [[ramble 40]]",
    "What time is it in Tokyo right now? [[callx " + b"get_current_time".hex() + ' {"timezone": "Asia/Tokyo"}]]',
    "Good to know, so I should plan calls for the morning there? [[ramble 40]]",
    "Please remember that I prefer metric units. [[ramble 40]]",
    "Thanks, that's all for today! [[ramble 40]]",
]


def catalog() -> list[dict[str, Any]]:
    return catalog_tools("agent_8servers.json")


def anthropic_tools() -> list[dict[str, Any]]:
    return [{"name": t["function"]["name"], "description": t["function"].get("description", ""),
             "input_schema": t["function"].get("parameters") or {"type": "object", "properties": {}}} for t in catalog()]


# ---- the setups: each has the 5-turn conversation at `url` with `key` and returns the turns answered ----

def chat_loop(complete: Callable[[list[Any]], Any]) -> int:
    """The conversation through a Chat-Completions-shaped client: `complete(messages)` is its
    answer's message (tool calls answered with RESULT until it answers in words)."""
    messages: list[Any] = [{"role": "system", "content": SYSTEM}]
    answered = 0
    for text in TURNS:
        messages.append({"role": "user", "content": text})
        while True:
            message = complete(messages)
            messages.append(message.model_dump(exclude_none=True))
            if not message.tool_calls:
                break
            messages += [{"role": "tool", "tool_call_id": c.id, "content": RESULT} for c in message.tool_calls]
        answered += bool(message.content)
    return answered


def openai_chat(url: str, key: str) -> int:
    from openai import OpenAI

    client, tools = OpenAI(base_url=url + "/v1", api_key=key), catalog()
    return chat_loop(lambda messages: client.chat.completions.create(
        model=OPENAI_MODEL, messages=messages, tools=tools).choices[0].message)


def openai_responses(url: str, key: str) -> int:
    from openai import OpenAI

    client = OpenAI(base_url=url + "/v1", api_key=key)
    tools: Any = [{"type": "function", **t["function"]} for t in catalog()]
    items: list[Any] = []
    answered = 0
    for text in TURNS:
        items.append({"role": "user", "content": text})
        while True:
            response = client.responses.create(model=OPENAI_MODEL, instructions=SYSTEM, input=items, tools=tools)
            items += [o.model_dump(exclude_none=True) for o in response.output]
            calls = [o for o in response.output if o.type == "function_call"]
            if not calls:
                break
            items += [{"type": "function_call_output", "call_id": c.call_id, "output": RESULT} for c in calls]
        answered += bool(response.output_text)
    return answered


def anthropic_messages(url: str, key: str) -> int:
    from anthropic import Anthropic

    client, tools = Anthropic(base_url=url, api_key=key), anthropic_tools()
    messages: list[Any] = []
    answered = 0
    for text in TURNS:
        messages.append({"role": "user", "content": text})
        while True:
            reply = client.messages.create(model=ANTHROPIC_MODEL, max_tokens=1024, system=SYSTEM, messages=messages,
                                           tools=cast_any(tools))
            messages.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in reply.content]})
            uses = [b for b in reply.content if b.type == "tool_use"]
            if not uses:
                break
            messages.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": u.id, "content": RESULT}
                                                         for u in uses]})
        answered += any(b.type == "text" for b in reply.content)
    return answered


def langchain_loop(llm: Any) -> int:
    from langchain_core.messages import HumanMessage, SystemMessage, ToolMessage

    bound = llm.bind_tools(catalog())
    messages: list[Any] = [SystemMessage(SYSTEM)]
    answered = 0
    for text in TURNS:
        messages.append(HumanMessage(text))
        while True:
            reply = bound.invoke(messages)
            messages.append(reply)
            if not reply.tool_calls:
                break
            messages += [ToolMessage(RESULT, tool_call_id=c["id"]) for c in reply.tool_calls]
        answered += bool(reply.content)
    return answered


def langchain_openai(url: str, key: str) -> int:
    from langchain_openai import ChatOpenAI

    return langchain_loop(ChatOpenAI(model=OPENAI_MODEL, base_url=url + "/v1", api_key=cast_any(key)))


def langchain_openai_responses(url: str, key: str) -> int:
    from langchain_openai import ChatOpenAI

    return langchain_loop(ChatOpenAI(model=OPENAI_MODEL, base_url=url + "/v1", api_key=cast_any(key),
                                     use_responses_api=True))


def langchain_anthropic(url: str, key: str) -> int:
    from langchain_anthropic import ChatAnthropic

    return langchain_loop(ChatAnthropic(model_name=ANTHROPIC_MODEL, base_url=url, api_key=cast_any(key),
                                        timeout=None, stop=None))


def litellm_loop(model: str, base: str, key: str, tools: list[dict[str, Any]]) -> int:
    import litellm

    return chat_loop(lambda messages: litellm.completion(model=model, api_base=base, api_key=key, messages=messages,
                                                         tools=tools).choices[0].message)


def litellm_openai(url: str, key: str) -> int:
    return litellm_loop("openai/" + OPENAI_MODEL, url + "/v1", key, catalog())


def litellm_anthropic(url: str, key: str) -> int:
    return litellm_loop("anthropic/" + ANTHROPIC_MODEL, url, key, catalog())


def pydantic_ai_run(model: Any) -> int:
    from pydantic_ai import Agent, Tool

    def run_tool(**_: Any) -> str:
        return RESULT

    tools = [Tool.from_schema(run_tool, t["function"]["name"], t["function"].get("description"),
                              t["function"].get("parameters") or {"type": "object", "properties": {}})
             for t in catalog()]
    agent = Agent(model, system_prompt=SYSTEM, tools=tools)
    history = None
    answered = 0
    for text in TURNS:
        result = agent.run_sync(text, message_history=history)
        history = result.all_messages()
        answered += bool(result.output)
    return answered


def pydantic_ai_openai(url: str, key: str) -> int:
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    return pydantic_ai_run(OpenAIChatModel(OPENAI_MODEL, provider=OpenAIProvider(base_url=url + "/v1", api_key=key)))


def pydantic_ai_responses(url: str, key: str) -> int:
    from pydantic_ai.models.openai import OpenAIResponsesModel
    from pydantic_ai.providers.openai import OpenAIProvider

    return pydantic_ai_run(OpenAIResponsesModel(OPENAI_MODEL, provider=OpenAIProvider(base_url=url + "/v1", api_key=key)))


def pydantic_ai_anthropic(url: str, key: str) -> int:
    from pydantic_ai.models.anthropic import AnthropicModel
    from pydantic_ai.providers.anthropic import AnthropicProvider

    return pydantic_ai_run(AnthropicModel(ANTHROPIC_MODEL, provider=AnthropicProvider(base_url=url, api_key=key)))


def agents_run(url: str, key: str, chat: bool) -> int:
    from agents import Agent, FunctionTool, OpenAIChatCompletionsModel, OpenAIResponsesModel, Runner
    from openai import AsyncOpenAI

    async def run_tool(_context: Any, _arguments: str) -> str:
        return RESULT

    client = AsyncOpenAI(base_url=url + "/v1", api_key=key)
    model: Any = (OpenAIChatCompletionsModel(OPENAI_MODEL, openai_client=client) if chat
                  else OpenAIResponsesModel(OPENAI_MODEL, openai_client=client))
    tools: list[Any] = [FunctionTool(name=t["function"]["name"], description=t["function"].get("description", ""),
                                     params_json_schema=t["function"].get("parameters") or {"type": "object", "properties": {}},
                                     on_invoke_tool=run_tool, strict_json_schema=False) for t in catalog()]
    agent = Agent(name="assistant", instructions=SYSTEM, model=model, tools=tools)
    items: list[Any] = []
    answered = 0
    for text in TURNS:
        result = Runner.run_sync(agent, [*items, {"role": "user", "content": text}])
        items = result.to_input_list()
        answered += bool(result.final_output)
    return answered


def agents_responses(url: str, key: str) -> int:
    return agents_run(url, key, chat=False)


def agents_chat(url: str, key: str) -> int:
    return agents_run(url, key, chat=True)


def cast_any(value: Any) -> Any:
    return value


@dataclass(frozen=True)
class Setup:
    name: str
    run: Callable[[str, str], int]
    shape: str  # chat, responses or messages: the route it calls and the upstream kind Keel needs
    module: str  # the library it needs
    model: str = OPENAI_MODEL


SETUPS = [
    Setup("openai chat", openai_chat, "chat", "openai"),
    Setup("openai responses", openai_responses, "responses", "openai"),
    Setup("anthropic messages", anthropic_messages, "messages", "anthropic", ANTHROPIC_MODEL),
    Setup("langchain ChatOpenAI", langchain_openai, "chat", "langchain_openai"),
    Setup("langchain ChatOpenAI responses", langchain_openai_responses, "responses", "langchain_openai"),
    Setup("langchain ChatAnthropic", langchain_anthropic, "messages", "langchain_anthropic", ANTHROPIC_MODEL),
    Setup("litellm openai/", litellm_openai, "chat", "litellm"),
    Setup("litellm anthropic/", litellm_anthropic, "messages", "litellm", ANTHROPIC_MODEL),
    Setup("pydantic-ai openai chat", pydantic_ai_openai, "chat", "pydantic_ai"),
    Setup("pydantic-ai openai responses", pydantic_ai_responses, "responses", "pydantic_ai"),
    Setup("pydantic-ai anthropic", pydantic_ai_anthropic, "messages", "pydantic_ai", ANTHROPIC_MODEL),
    Setup("agents sdk (responses)", agents_responses, "responses", "agents"),
    Setup("agents sdk chat model", agents_chat, "chat", "agents"),
]


class Served:
    """A real uvicorn server for one ASGI app on a free port, in its own thread."""

    def __init__(self, app: Any, server: ServerConfig | None = None) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        config = uvicorn_config(app, "127.0.0.1", self.port, server or ServerConfig(), log_level="warning")
        self.server = uvicorn.Server(config)
        self.server.install_signal_handlers = lambda: None  # type: ignore[method-assign]
        self.thread = threading.Thread(target=lambda: asyncio.run(self.server.serve()), daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> Served:
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("server did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


@contextlib.contextmanager
def provider() -> Iterator[tuple[StandIn, str]]:
    standin = StandIn()
    with Served(create_standin_app(standin=standin)) as server:
        yield standin, server.url


@contextlib.contextmanager
def keel(upstream: str, aux: str, shape: str, store: Path, stability: str | None = None) -> Iterator[str]:
    features: dict[str, Any] = {**QUICKSTART_FEATURES, "memory": {**QUICKSTART_FEATURES["memory"],  # type: ignore[dict-item]
                                                                   "endpoint": aux + "/v1"}}
    if stability:
        features["tools"] = {**features["tools"], "stability": stability}
    kind = "anthropic-compatible" if shape == "messages" else "openai"
    import hashlib

    config = parse_config({"store": {"url": f"sqlite:///{store}"}, "tenants": [{
        "id": "bench", "auth": {"keys": [f"sha256:{hashlib.sha256(KEY.encode()).hexdigest()}"]},
        "upstream": {"base_url": upstream + "/v1", "kind": kind}, **features}]})
    with Served(create_app(config), config.server) as server:
        yield server.url


def bill(served: list[Any], model: str, prices: PriceTable) -> dict[str, Any]:
    usage = Usage()
    for s in served:
        usage = usage + Usage(s.prompt_tokens, s.cached_tokens, s.cache_write_tokens, s.completion_tokens)
    return {"calls": len(served), "input": usage.input, "cached": usage.cached / max(1, usage.input),
            "usd": prices.price(model).cost(usage),
            "tools": round(sum(s.tool_tokens for s in served) / max(1, len(served)))}


def measure(setup: Setup, through_keel: bool, prices: PriceTable, tmp: Path, stability: str | None = None) -> dict[str, Any]:
    with provider() as (standin, url), provider() as (aux, aux_url):
        error = ""
        try:
            if through_keel:
                store = tmp / f"{setup.name.replace(' ', '_').replace('/', '')}.db"
                with keel(url, aux_url, setup.shape, store, stability) as keel_url:
                    turns = setup.run(keel_url, KEY)
                    time.sleep(0.5)  # Keel's background work after the last answer (memory, savings)
            else:
                turns = setup.run(url, KEY)
        except Exception as exc:  # a client that fails is a row that says so, not a crashed bench
            turns, error = 0, f"{type(exc).__name__}: {str(exc)[:200]}"
            if os.environ.get("KEEL_BENCH_TRACE"):
                traceback.print_exc()
        row = bill(list(standin.served), setup.model, prices)
        own = bill(list(aux.served), "gpt-4o-mini", prices)
        row["keel calls"], row["usd"] = own["calls"], row["usd"] + own["usd"]
        row["input"] += own["input"]
        row["turns"], row["error"] = turns, error
        return row


def available(setup: Setup) -> bool:
    return importlib.util.find_spec(setup.module) is not None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--client", action="append", help="run only these setups (by name; see --list)")
    parser.add_argument("--stability", choices=("per_turn", "segment", "dispatch", "auto"),
                        help="tools.stability through Keel (default: the quickstart's)")
    parser.add_argument("--list", action="store_true", help="list the setups and whether each can run here")
    args = parser.parse_args()
    logging.getLogger("keel").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", message=".*deprecated by its provider")  # pydantic-ai on claude-sonnet-4-5
    if args.list:
        for s in SETUPS:
            print(f"{s.name:32} {s.shape:9} {'ok' if available(s) else 'missing: pip install ' + s.module}")
        return
    prices = PriceTable()
    chosen = [s for s in SETUPS if not args.client or s.name in args.client]
    import tempfile

    header = (f"{'client':32} {'path':6} {'turns':>5} {'calls':>5} {'tool tok/call':>13} {'input tok':>10} "
              f"{'cached':>6} {'dollars':>8}  notes")
    print(header)
    print("-" * len(header))
    missed = []
    with tempfile.TemporaryDirectory() as tmp:
        for setup in chosen:
            if not available(setup):
                print(f"{setup.name:32} skipped: {setup.module} is not installed in {sys.prefix}")
                continue
            rows = {}
            for through in (False, True):
                r = rows[through] = measure(setup, through, prices, Path(tmp), args.stability)
                notes = r["error"] or (f"{r['keel calls']} call(s) of Keel's own" if r["keel calls"] else "")
                print(f"{setup.name:32} {'keel' if through else 'direct':6} {r['turns']:>3}/{len(TURNS)} {r['calls']:>5} "
                      f"{r['tools']:>13,} {r['input']:>10,} {r['cached']:>6.3f} {r['usd']:>8.4f}  {notes}", flush=True)
            d, k = rows[False], rows[True]
            ok = (k["turns"] == len(TURNS) and k["input"] < d["input"] and k["usd"] < d["usd"]
                  and k["cached"] >= d["cached"] - 0.05)
            if not ok:
                missed.append(setup.name)
            print(f"{'':32} {'':6} {'met' if ok else 'MISSED':>9}: input {k['input'] / max(1, d['input']) - 1:+.1%}, "
                  f"dollars {k['usd'] / max(1e-9, d['usd']) - 1:+.1%}, cached {k['cached'] - d['cached']:+.3f}", flush=True)
    print(f"\ntargets missed by: {', '.join(missed)}" if missed else "\nevery client met the targets")


if __name__ == "__main__":
    main()
