"""Keel's added latency and CPU per request over calling the stand-in directly.

    python bench/overhead.py [--quick] [--part off|on|shapes|gc|long ...] [--long N]

Both paths are measured in the same run, one after the other, against the same stand-in
process; Keel runs as its own process so its CPU time per request is read from /proc.

- `off`: features off, Chat Completions, both upstream clients (latency at concurrency 1/16/64,
  CPU per request, streaming time to first byte).
- `on`: features on (tools lexical with dispatch stability, context.stable, cache auto) for a
  new conversation per request (the first user message differs, the system prompt is one Keel
  has seen) and a repeated one (the same body again), compact and spaced bodies, beside this
  run's features-off row on the same store: the default SQLite file, then Redis at
  $KEEL_TEST_REDIS_URL (default redis://127.0.0.1:6379/14, a database this bench empties); with the
  planner stages skipped per turn (keel_planner_failures_total: a store call over its budget).
- `gc`: features on, 200 tools, new conversations at concurrency 16 and 64, Keel's garbage
  collector setting against Python's own (KEEL_GC=default) in this run.
- `long` (only when named): N new conversations (`--long`, default 20,000) on each store, CPU per
  turn in the first and last tenth, against features off in this run.
- `shapes`: features off on /v1/responses and /v1/messages, the same conversation and tools
  in each shape, beside Chat Completions' in this run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from collections.abc import Callable
from typing import Any

import aiohttp
import orjson
import redis
from common import KEY, Proc, catalog_tools, percentile, start_keel, start_standin

CONCURRENCY = (1, 16, 64)
CLIENTS = ("aiohttp", "httpx")  # Keel's upstream client, compared in the same run
PARTS = ("off", "on", "shapes", "gc", "long")
FEATURES = {"tools": {"enabled": True, "stability": "dispatch"}, "context": {"stable": True},
            "cache": {"breakpoints": "auto", "prompt_cache_key": "auto"}}
CHAT = "/v1/chat/completions"
Body = bytes | Callable[[int], bytes]  # one body, or the i-th request's


def spread(tools: list[Any], n: int) -> list[Any]:
    """n tools taken evenly across all 23 servers' catalog (not just the first server's)."""
    step = len(tools) / n
    return [tools[int(i * step)] for i in range(n)]


def bodies() -> dict[str, bytes]:
    tools = catalog_tools()
    chat = [{"role": "system", "content": "You are a helpful assistant. " * 8}]
    for i in range(19):
        role = "user" if i % 2 == 0 else "assistant"
        chat.append({"role": role, "content": f"Message {i}: " + "some earlier conversation text " * 13})
    small = {"model": "gpt-4o-mini", "messages": chat}
    medium = {"model": "gpt-4o-mini", "messages": chat[:3], "tools": spread(tools, 50)}
    large = {"model": "gpt-4o-mini", "messages": chat[:3], "tools": spread(tools, 200)}
    out = {name: orjson.dumps(b) for name, b in (("20 messages", small), ("50 tools", medium), ("200 tools", large))}
    out["200 tools, spaced"] = json.dumps(large, indent=1).encode()  # as some clients write it: same meaning
    return out


def as_responses(body: dict[str, Any]) -> dict[str, Any]:
    """The same conversation and tools as a /v1/responses body."""
    system, *rest = body["messages"]
    tools = [{"type": "function", **t["function"]} for t in body.get("tools") or []]
    out = {"model": body["model"], "instructions": system["content"],
           "input": [{"role": m["role"], "content": m["content"]} for m in rest]}
    return {**out, "tools": tools} if tools else out


def as_messages(body: dict[str, Any]) -> dict[str, Any]:
    """The same conversation and tools as an Anthropic /v1/messages body."""
    system, *rest = body["messages"]
    tools = [{"name": t["function"]["name"], "description": t["function"].get("description", ""),
              "input_schema": t["function"].get("parameters") or {"type": "object"}} for t in body.get("tools") or []]
    out = {"model": "claude-sonnet", "max_tokens": 1024, "system": system["content"],
           "messages": [{"role": m["role"], "content": m["content"]} for m in rest]}
    return {**out, "tools": tools} if tools else out


def new_conversations(body: bytes) -> Callable[[int], bytes]:
    """The i-th request's body: the same, but its first user message names conversation i."""
    assert body.count(b"Message 0: ") == 1
    stamp = time.time_ns()
    return lambda i: body.replace(b"Message 0: ", f"Message 0 of chat {stamp}-{i}: ".encode(), 1)


async def run(url: str, body: Body, concurrency: int, count: int, path: str = CHAT) -> list[float]:
    """`count` requests from `concurrency` workers; aiohttp, so the load generator's own pool
    is not the bottleneck (httpx's pool contention shows up as multi-second p99s at 64)."""
    latencies: list[float] = []
    headers = {"authorization": f"Bearer {KEY}", "content-type": "application/json"}
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=60)) as client:
        remaining = count
        sent = 0

        async def worker() -> None:
            nonlocal remaining, sent
            while remaining > 0:
                remaining -= 1
                data = body(sent) if callable(body) else body
                sent += 1
                started = time.perf_counter()
                async with client.post(url + path, data=data, headers=headers) as r:
                    await r.read()
                    assert r.status == 200, r.status
                latencies.append(time.perf_counter() - started)

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return latencies


async def ttfb(url: str, body: bytes, count: int) -> list[float]:
    times = []
    headers = {"authorization": f"Bearer {KEY}"}
    async with aiohttp.ClientSession() as client:
        for _ in range(count):
            started = time.perf_counter()
            async with client.post(url + "/v1/chat/completions", data=body, headers=headers) as r:
                first = True
                async for _chunk in r.content.iter_any():
                    if first:
                        times.append(time.perf_counter() - started)
                        first = False
    return times


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f}"


async def cpu_per_request(proc: Proc, url: str, body: Body, count: int, path: str = CHAT) -> tuple[float, float]:
    """Keel's CPU ms per request at concurrency 16, and the p50 latency there (ms)."""
    cpu0 = proc.cpu()
    latencies = await run(url, body, 16, count, path)
    return (proc.cpu() - cpu0) / count * 1000, percentile(latencies, 0.5) * 1000


async def part_off(quick: bool, standin_url: str) -> None:
    keels = {client: start_keel(standin_url, server={"upstream_client": client})[:2] for client in CLIENTS}
    rows: list[list[Any]] = []
    cpu_rows: list[list[Any]] = []
    ttfb_rows: list[list[Any]] = []
    try:
        for name, body in bodies().items():
            for url in (standin_url, *(u for _, u in keels.values())):  # warm every path
                await run(url, body, 4, 40)
            cpu: dict[str, str] = {}
            for conc in CONCURRENCY:
                count = (150 if quick else 400) if conc == 1 else (400 if quick else 1500)
                direct = await run(standin_url, body, conc, count)
                d50, d99 = percentile(direct, 0.5), percentile(direct, 0.99)
                for client, (proc, url) in keels.items():
                    cpu0 = proc.cpu()
                    via = await run(url, body, conc, count)
                    if conc == 16:
                        cpu[client] = f"{(proc.cpu() - cpu0) / count * 1000:.2f}"
                    k50, k99 = percentile(via, 0.5), percentile(via, 0.99)
                    rows.append([name, f"{len(body) / 1024:.0f} KB", conc, client, ms(d50), ms(k50), ms(k50 - d50),
                                 ms(d99), ms(k99), f"{k99 / k50:.1f}x"])
            cpu_rows.append([name, f"{len(body) / 1024:.0f} KB", *(cpu[c] for c in CLIENTS)])
        stream_body = orjson.loads(bodies()["20 messages"])
        stream_body["stream"] = True
        stream_body["messages"][-1]["content"] = "[[words 50]]"
        sbody = orjson.dumps(stream_body)
        n = 100 if quick else 300
        for url in (standin_url, *(u for _, u in keels.values())):
            await ttfb(url, sbody, 20)
        t_direct = percentile(await ttfb(standin_url, sbody, n), 0.5)
        for client, (_, url) in keels.items():
            t_keel = percentile(await ttfb(url, sbody, n), 0.5)
            ttfb_rows.append([client, ms(t_direct), ms(t_keel), ms(t_keel - t_direct)])
    finally:
        for proc, _ in keels.values():
            proc.stop()

    print("\nLatency, features off (ms; added = Keel p50 - direct p50, both measured in this run)")
    table(["body", "size", "conc", "client", "direct p50", "keel p50", "added p50", "direct p99", "keel p99",
           "keel p99/p50"], rows)
    print("\nKeel CPU per request, ms (Keel process CPU seconds / requests, at concurrency 16)")
    table(["body", "size", *CLIENTS], cpu_rows)
    print("\nStreaming time to first byte, ms (concurrency 1, 9 KB body)")
    table(["client", "direct p50", "keel p50", "added p50"], ttfb_rows)


REDIS = os.environ.get("KEEL_TEST_REDIS_URL", "redis://127.0.0.1:6379/14")  # a database this bench empties


def stores() -> dict[str, str | None]:
    """The stores features on runs against: the default SQLite file, and REDIS (emptied first)."""
    client = redis.Redis.from_url(REDIS)
    client.flushdb()
    client.close()
    return {"sqlite": None, "redis": REDIS}


async def failures(url: str) -> float:
    """Planner stages Keel skipped so far (keel_planner_failures_total, every planner and tenant)."""
    async with aiohttp.ClientSession() as client, client.get(url + "/metrics") as r:
        text = await r.text()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("keel_planner_failures_total{"))


async def part_on(quick: bool, standin_url: str) -> None:
    """Features on against features off, each body size, new and repeated conversations, on each store;
    with the planner stages skipped per turn (a store call over its budget is one)."""
    count = 400 if quick else 1200
    rows: list[list[Any]] = []
    for store, store_url in stores().items():
        off, off_url, _ = start_keel(standin_url, store=store_url)
        on, on_url, _ = start_keel(standin_url, FEATURES, store=store_url)
        try:
            for name, body in bodies().items():
                new = new_conversations(body)
                warm = new_conversations(body)  # the system prompt and catalog seen before, as in steady state
                await run(off_url, body, 4, 40)
                await run(on_url, warm, 4, 40)
                await run(on_url, body, 4, 40)
                base_cpu, base_p50 = await cpu_per_request(off, off_url, body, count)
                failed = await failures(on_url)
                new_cpu, new_p50 = await cpu_per_request(on, on_url, new, count)
                new_failed = await failures(on_url)
                rep_cpu, rep_p50 = await cpu_per_request(on, on_url, body, count)
                rep_failed = await failures(on_url)
                size = f"{len(body) / 1024:.0f} KB"
                rows.append([store, name, size, "off", f"{base_cpu:.2f}", "1.00", f"{base_p50:.2f}", ""])
                rows.append([store, name, size, "on, new conversation", f"{new_cpu:.2f}", f"{new_cpu / base_cpu:.2f}",
                             f"{new_p50:.2f}", f"{(new_failed - failed) / count:.3f}"])
                rows.append([store, name, size, "on, repeated", f"{rep_cpu:.2f}", f"{rep_cpu / base_cpu:.2f}",
                             f"{rep_p50:.2f}", f"{(rep_failed - new_failed) / count:.3f}"])
        finally:
            off.stop()
            on.stop()
    print("\nFeatures on (tools lexical + dispatch, context.stable, cache auto): Keel CPU ms per request at "
          "concurrency 16, against features off on the same store in this run; stage failures per turn")
    table(["store", "body", "size", "features", "cpu ms", "x off", "p50 ms", "failed/turn"], rows)


async def part_gc(quick: bool, standin_url: str) -> None:
    """Features on, new conversations of the 200-tool body, at concurrency 16 and 64: Keel's garbage
    collector setting (proxy/gcposture.py) against Python's own (KEEL_GC=default), in this run."""
    count = 400 if quick else 1200
    body = bodies()["200 tools"]
    keels = {"Python's defaults": start_keel(standin_url, FEATURES, env={"KEEL_GC": "default"})[:2],
             "Keel's setting": start_keel(standin_url, FEATURES)[:2]}
    rows: list[list[Any]] = []
    try:
        for _, url in keels.values():
            await run(url, new_conversations(body), 4, 40)
        for conc in (16, 64):
            base = 0.0
            for name, (proc, url) in keels.items():
                cpu0 = proc.cpu()
                latencies = await run(url, new_conversations(body), conc, count)
                cpu = (proc.cpu() - cpu0) / count * 1000
                base = base or cpu
                rows.append([conc, name, f"{cpu:.2f}", f"{cpu / base:.2f}", f"{percentile(latencies, 0.5) * 1000:.2f}",
                             f"{percentile(latencies, 0.99) * 1000:.2f}"])
    finally:
        for proc, _ in keels.values():
            proc.stop()
    print("\nGarbage collector: features on, new conversations, 200 tools; Keel CPU ms per request")
    table(["conc", "gc", "cpu ms", "x defaults", "p50 ms", "p99 ms"], rows)


async def part_long(quick: bool, standin_url: str, conversations: int) -> None:
    """CPU per turn as the day's conversations grow: `conversations` new conversations (the 50-tool
    body) at concurrency 16 on each store, CPU per turn by tenth of the run, against features off
    measured in the same run."""
    body = bodies()["50 tools"]
    tenth = max(1, conversations // 10)
    rows: list[list[Any]] = []
    for store, store_url in stores().items():
        off, off_url, _ = start_keel(standin_url, store=store_url)
        on, on_url, _ = start_keel(standin_url, FEATURES, store=store_url)
        try:
            await run(off_url, body, 4, 40)
            base_cpu, _ = await cpu_per_request(off, off_url, body, 400 if quick else 1200)
            new = new_conversations(body)
            done = 0
            tenths: list[tuple[float, float]] = []
            failed = await failures(on_url)
            for _ in range(10):
                cpu0 = on.cpu()
                await run(on_url, lambda i, start=done, new=new: new(start + i), 16, tenth)
                proc_cpu = on.cpu()
                now_failed = await failures(on_url)
                tenths.append(((proc_cpu - cpu0) / tenth * 1000, (now_failed - failed) / tenth))
                failed = now_failed
                done += tenth
            for i in (0, 9):
                cpu, fails = tenths[i]
                rows.append([store, f"{i * tenth + 1:,}-{(i + 1) * tenth:,}", f"{base_cpu:.2f}", f"{cpu:.2f}",
                             f"{cpu / base_cpu:.2f}", f"{fails:.3f}"])
            rows.append([store, "last / first", "", f"{tenths[9][0] / tenths[0][0]:.2f}", "", ""])
        finally:
            off.stop()
            on.stop()
    print(f"\nA long run: {10 * tenth:,} new conversations (50 tools, features on, concurrency 16); Keel CPU ms "
          "per turn in the first and last tenth, against features off on the same store in this run")
    table(["store", "conversations", "off cpu ms", "on cpu ms", "x off", "failed/turn"], rows)


async def part_shapes(quick: bool, standin_url: str) -> None:
    """Features off on each API shape: added p50 at concurrency 1, CPU per request at 16."""
    keel, url, _ = start_keel(standin_url)
    count = 400 if quick else 1200
    rows: list[list[Any]] = []
    try:
        for name, raw in bodies().items():
            chat = orjson.loads(raw)
            shaped = {CHAT: raw, "/v1/responses": orjson.dumps(as_responses(chat)),
                      "/v1/messages": orjson.dumps(as_messages(chat))}
            chat_cpu = chat_added = 0.0
            for path, body in shaped.items():
                await run(standin_url, body, 4, 40, path)
                await run(url, body, 4, 40, path)
                direct = percentile(await run(standin_url, body, 1, count // 2, path), 0.5) * 1000
                via = percentile(await run(url, body, 1, count // 2, path), 0.5) * 1000
                cpu, _ = await cpu_per_request(keel, url, body, count, path)
                if path == CHAT:
                    chat_cpu, chat_added = cpu, via - direct
                rows.append([name, f"{len(body) / 1024:.0f} KB", path, f"{via - direct:.2f}",
                             f"{(via - direct) / chat_added:.2f}", f"{cpu:.2f}", f"{cpu / chat_cpu:.2f}"])
    finally:
        keel.stop()
    print("\nFeatures off per API shape: added p50 at concurrency 1 and Keel CPU per request at 16 (ms), "
          "against Chat Completions' in this run")
    table(["body", "size", "path", "added p50", "x chat", "cpu ms", "x chat"], rows)


async def main(quick: bool, parts: list[str], long: int) -> None:
    standin, standin_url = start_standin(rules="none")
    try:
        for part in parts:
            if part == "long":
                await part_long(quick, standin_url, long)
            else:
                await {"off": part_off, "on": part_on, "shapes": part_shapes, "gc": part_gc}[part](quick, standin_url)
    finally:
        standin.stop()


def table(head: list[str], rows: list[list[Any]]) -> None:
    widths = [max(len(str(x)) for x in col) for col in zip(head, *rows, strict=False)]
    print(" | ".join(str(h).ljust(w) for h, w in zip(head, widths, strict=False)))
    print("-+-".join("-" * w for w in widths))
    for row in rows:
        print(" | ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=False)))



if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer requests (about a minute a part)")
    parser.add_argument("--part", action="append", choices=PARTS,
                        help="what to measure (default: all but long)")
    parser.add_argument("--long", type=int, metavar="N", default=20_000,
                        help="conversations of the long part (default 20,000)")
    args = parser.parse_args()
    asyncio.run(main(args.quick, args.part or [p for p in PARTS if p != "long"], args.long))
