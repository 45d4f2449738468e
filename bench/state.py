"""What Keel stores, by kind, per call and per conversation, on SQLite and Redis; and what one call
reads from Redis as a conversation grows.

    python bench/state.py [--part sizes|history] [--conversations N] [--turns T] [--root DIR]

sizes: N conversations (default 200) of T user turns (default 4), every feature on (tools under
dispatch with a 200-tool catalog, the frozen system prompt, cache hints, memory with the stand-in as
the memory model, savings), all under one ~17 KB system prompt with a clock that ticks every call,
each conversation named by X-Keel-Conversation (as LibreChat and Open WebUI send it). Each store
starts empty; after one warm-up conversation (what all share: the prompt's blobs) every row of
the SQLite file (key and value bytes, by table) and every Redis key (MEMORY USAGE) is counted, by
kind, and divided by the conversations and the calls that followed.

history: one conversation of 100 turns (tools and context on) on a Redis of its own; the bytes
Redis sent Keel (INFO's total_net_output_bytes) and the commands it ran for turns 10, 50 and 100.
`--root` runs the Keel of another checkout (e.g. main's: before and after a change).

Redis is a redis-server this bench starts on 127.0.0.1 (a port in 7100-7199, files in a
temporary directory), so nothing else's keys are counted.
"""

from __future__ import annotations

import argparse
import sqlite3
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import httpx
import redis
from cache import INSTRUCTIONS, tools_for
from common import KEY, ROOT, start_keel, start_standin
from overhead import table

sys.path.insert(0, str(ROOT / "tests"))
from redis_servers import Server, free_ports, redis_binary

SYSTEM = "\n\n".join([
    "Current date and time: 2026-11-30 10:{minute:02d}:{second:02d}",
    "You are Acme's support assistant.\n\n" + INSTRUCTIONS,
    "## Policies\n" + "\n".join(f"Policy {i}: refunds for plan {i} follow section {i} of the terms; "
                                f"escalate disputes over {i * 50} dollars to a human agent." for i in range(100)),
    "<memory>\nThe user prefers short answers.\n</memory>",
])
FEATURES: dict[str, Any] = {"context": {"stable": True}, "cache": {"breakpoints": "auto", "prompt_cache_key": "auto"},
                            "tools": {"enabled": True, "stability": "dispatch"},
                            "memory": {"enabled": True, "model": "gpt-4o-mini"}}
QUESTIONS = ("How do I get a refund for plan {i}?", "Please remember that my plan is {i}.",
             "Read the file notes_{i}.txt and summarize it.", "What time is it in Tokyo? Ticket {i}.",
             "Fetch https://example.com/{i} and tell me what it says.")
TTL_KINDS = ("turn", "anchor", "proof", "toolblock", "blob", "judged", "savings", "responses", "response", "learned",
             "embeddings", "health")


def kind_of(key: str) -> str:
    """A key's kind: `keel:{tag}:kind:…` by its part after the tag, or by its tag's prefix."""
    if not key.startswith("keel:{"):
        return key.split(":", 1)[0]
    tag, _, rest = key[6:].partition("}")
    parts = rest.strip(":").split(":")
    family = tag.split(":", 1)[0]
    if family in ("savings", "memory", "mq"):
        return f"{family}:{parts[0]}" if parts and parts[0] else family
    if family in ("judged", "learned", "responses", "response", "embeddings", "proofs") or family.startswith("health"):
        return family.split("-")[0]
    return parts[0] if parts and parts[0] else family


def redis_usage(url: str) -> dict[str, tuple[int, int, int]]:
    """Per kind: (keys, bytes by MEMORY USAGE, keys without a TTL)."""
    client = redis.Redis.from_url(url)
    out: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
    for raw in client.scan_iter(count=1000):
        key = raw.decode()
        row = out[kind_of(key)]
        row[0] += 1
        row[1] += int(client.memory_usage(raw, samples=0) or 0)
        row[2] += client.pttl(raw) == -1
    client.close()
    return {k: (v[0], v[1], v[2]) for k, v in out.items()}


def sqlite_usage(db: Path) -> dict[str, tuple[int, int, int]]:
    """Per kind (the kv/lists/hashes/counters tables by key; the queue's tables by name): (rows,
    key and value bytes, rows without an expiry)."""
    out: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
    with sqlite3.connect(db) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        for table_name, value in (("kv", "value"), ("lists", "value"), ("hashes", "field || value"),
                                  ("counters", "field")):
            for key, size, forever in conn.execute(
                    f"SELECT key, LENGTH(key) + LENGTH({value}), expires IS NULL FROM {table_name}"):
                row = out[kind_of(key)]
                row[0] += 1
                row[1] += size
                row[2] += forever
        for table_name in ("jobs", "queues"):
            columns = [c[1] for c in conn.execute(f"PRAGMA table_info({table_name})")]
            total = " + ".join(f"COALESCE(LENGTH({c}), 0)" for c in columns)
            count, size = conn.execute(f"SELECT COUNT(*), COALESCE(SUM({total}), 0) FROM {table_name}").fetchone()
            if count:
                out[f"queue:{table_name}"] = [count, size, count]
    return {k: (v[0], v[1], v[2]) for k, v in out.items()}


def converse(client: httpx.Client, url: str, i: int, turns: int, tools: list[Any] | None,
             user: bool = True) -> None:
    messages: list[dict[str, Any]] = []
    for t in range(turns):
        system = SYSTEM.format(minute=(i + t) // 60 % 60, second=(i + t) % 60)
        messages.append({"role": "user", "content": QUESTIONS[(i + t) % len(QUESTIONS)].format(i=i)})
        body: dict[str, Any] = {"model": "gpt-4o-mini", "messages": [{"role": "system", "content": system},
                                                                     *messages]}
        if user:
            body["user"] = f"user-{i}"
        if tools:
            body["tools"] = tools
        reply = client.post(url + "/v1/chat/completions", json=body, headers={"x-keel-conversation": f"conv-{i}"})
        assert reply.status_code == 200, reply.text
        message = reply.json()["choices"][0]["message"]
        messages.append({k: v for k, v in message.items() if v is not None})
        for call in message.get("tool_calls") or []:
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": "done"})


def settle(url: str) -> None:
    """Wait for the memory jobs and the savings writes after the answers."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        memory = httpx.get(url + "/healthz", timeout=5).json().get("memory", {})
        if not memory.get("spooled"):
            break
        time.sleep(0.2)
    time.sleep(3)


def sizes(conversations: int, turns: int, root: Path | None) -> None:
    binary = redis_binary()
    assert binary, "redis-server is needed"
    server = Server(free_ports(1)[0], binary, ["--maxmemory-policy", "noeviction"]).start()
    tools = tools_for(with_catalog=True)
    results: dict[str, dict[str, tuple[int, int, int]]] = {}
    try:
        for store in ("sqlite", "redis"):
            standin, standin_url = start_standin(rules="none")
            redis_url = f"redis://127.0.0.1:{server.port}/0"
            keel, url, tmp = start_keel(standin_url, FEATURES, store=redis_url if store == "redis" else None,
                                        root=root)
            try:
                with httpx.Client(timeout=60, headers={"authorization": f"Bearer {KEY}"}) as client:
                    converse(client, url, 0, turns, tools)
                    settle(url)
                    before = redis_usage(redis_url) if store == "redis" else sqlite_usage(tmp / "keel.db")
                    for i in range(1, conversations + 1):
                        converse(client, url, i, turns, tools)
                    settle(url)
                    after = redis_usage(redis_url) if store == "redis" else sqlite_usage(tmp / "keel.db")
            finally:
                keel.stop()
                standin.stop()
            results[store] = {k: (after[k][0] - before.get(k, (0, 0, 0))[0], after[k][1] - before.get(k, (0, 0, 0))[1],
                                  after[k][2]) for k in after}
    finally:
        server.remove()
    calls = conversations * turns
    kinds = sorted(set(results["sqlite"]) | set(results["redis"]), key=lambda k: -results["redis"].get(k, (0, 0, 0))[1])
    rows = []
    for kind in kinds:
        s, r = results["sqlite"].get(kind, (0, 0, 0)), results["redis"].get(kind, (0, 0, 0))
        rows.append([kind, f"{s[1] / conversations:,.0f}", f"{r[1] / conversations:,.0f}", f"{r[1] / calls:,.0f}",
                     f"{r[0] / conversations:.1f}", "no TTL" if r[2] else "TTL"])
    total_s = sum(v[1] for v in results["sqlite"].values())
    total_r = sum(v[1] for v in results["redis"].values())
    rows.append(["all", f"{total_s / conversations:,.0f}", f"{total_r / conversations:,.0f}", f"{total_r / calls:,.0f}",
                 "", ""])
    print(f"{conversations} conversations x {turns} calls, every feature on, one {len(SYSTEM) / 1024:.0f} KB prompt")
    table(["kind", "SQLite B/conv", "Redis B/conv", "Redis B/call", "Redis keys/conv", "expiry"], rows)


def history(root: Path | None) -> None:
    binary = redis_binary()
    assert binary, "redis-server is needed"
    server = Server(free_ports(1)[0], binary).start()
    redis_url = f"redis://127.0.0.1:{server.port}/0"
    standin, standin_url = start_standin(rules="none")
    features = {"context": {"stable": True}, "tools": {"enabled": True, "stability": "dispatch"}}
    keel, url, _ = start_keel(standin_url, features, store=redis_url, server={"workers": 1}, root=root)
    probe = redis.Redis.from_url(redis_url)
    first = probe.info("stats")["total_net_output_bytes"]
    info_bytes = probe.info("stats")["total_net_output_bytes"] - first  # what one INFO stats reply costs
    rows = []
    try:
        with httpx.Client(timeout=60, headers={"authorization": f"Bearer {KEY}"}) as client:
            tools = tools_for(with_catalog=True)
            messages: list[dict[str, Any]] = []
            for turn in range(1, 101):
                messages.append({"role": "user", "content": f"Turn {turn}: read notes_{turn}.txt, please."})
                body = {"model": "gpt-4o-mini", "user": "u", "tools": tools,
                        "messages": [{"role": "system", "content": SYSTEM.format(minute=0, second=0)},
                                     *messages]}
                stats = probe.info("stats")
                sent, commands = stats["total_net_output_bytes"], stats["total_commands_processed"]
                reply = client.post(url + "/v1/chat/completions", json=body)
                assert reply.status_code == 200
                time.sleep(0.3)  # the turn's bookkeeping after the answer lands too
                stats = probe.info("stats")
                if turn in (10, 50, 100):  # less our own INFO's reply and command
                    rows.append([turn, f"{stats['total_net_output_bytes'] - sent - info_bytes:,}",
                                 stats["total_commands_processed"] - commands - 1])
                message = reply.json()["choices"][0]["message"]
                messages.append({k: v for k, v in message.items() if v is not None})
                for call in message.get("tool_calls") or []:
                    messages.append({"role": "tool", "tool_call_id": call["id"], "content": "done"})
    finally:
        probe.close()
        keel.stop()
        standin.stop()
        server.remove()
    print(f"one conversation, tools and context on; Keel from {root or ROOT}")
    table(["turn", "bytes Redis sent for the call", "Redis commands"], rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--part", choices=("sizes", "history"), action="append")
    parser.add_argument("--conversations", type=int, default=200)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--root", type=Path, help="run the Keel of this checkout (e.g. main's, for before/after)")
    args = parser.parse_args()
    for part in args.part or ("sizes", "history"):
        if part == "sizes":
            sizes(args.conversations, args.turns, args.root)
        else:
            history(args.root)


if __name__ == "__main__":
    main()
