"""Keel's added latency and CPU per request over calling the stand-in directly (features off).

    python bench/overhead.py [--quick]

Both paths are measured in the same run, one after the other, against the same stand-in
process; Keel runs as its own process so its CPU time per request is read from /proc.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

import aiohttp
import orjson
from common import KEY, catalog_tools, percentile, start_keel, start_standin

CONCURRENCY = (1, 16, 64)
CLIENTS = ("aiohttp", "httpx")  # Keel's upstream client, compared in the same run


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
    return {name: orjson.dumps(b) for name, b in (("20 messages", small), ("50 tools", medium), ("200 tools", large))}


async def run(url: str, body: bytes, concurrency: int, count: int) -> list[float]:
    """`count` requests from `concurrency` workers; aiohttp, so the load generator's own pool
    is not the bottleneck (httpx's pool contention shows up as multi-second p99s at 64)."""
    latencies: list[float] = []
    headers = {"authorization": f"Bearer {KEY}", "content-type": "application/json"}
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=60)) as client:
        remaining = count

        async def worker() -> None:
            nonlocal remaining
            while remaining > 0:
                remaining -= 1
                started = time.perf_counter()
                async with client.post(url + "/v1/chat/completions", data=body, headers=headers) as r:
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


async def main(quick: bool) -> None:
    standin, standin_url = start_standin(rules="none")
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
        standin.stop()

    print("\nLatency, features off (ms; added = Keel p50 - direct p50, both measured in this run)")
    table(["body", "size", "conc", "client", "direct p50", "keel p50", "added p50", "direct p99", "keel p99",
           "keel p99/p50"], rows)
    print("\nKeel CPU per request, ms (Keel process CPU seconds / requests, at concurrency 16)")
    table(["body", "size", *CLIENTS], cpu_rows)
    print("\nStreaming time to first byte, ms (concurrency 1, 9 KB body)")
    table(["client", "direct p50", "keel p50", "added p50"], ttfb_rows)


def table(head: list[str], rows: list[list[Any]]) -> None:
    widths = [max(len(str(x)) for x in col) for col in zip(head, *rows, strict=False)]
    print(" | ".join(str(h).ljust(w) for h, w in zip(head, widths, strict=False)))
    print("-+-".join("-" * w for w in widths))
    for row in rows:
        print(" | ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=False)))



if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer requests (about a minute)")
    asyncio.run(main(parser.parse_args().quick))
