"""The response cache: what a hit costs, and what a replayed evaluation run saves.

    python bench/respcache.py [--quick]

Every server is its own process (Keel's CPU per request is read from /proc), measured in this
one run against the same stand-in:

- hit: the added latency (p50, p99) and Keel's CPU per request of an answer served from the
  cache, JSON and as a stream (from a JSON original), against calling the stand-in directly and
  against Keel relaying the same request with every feature off (the cheapest path through
  Keel), at concurrency 1 and 16. The stand-in answers at once (`--rules none`), so what is
  measured is the proxies' own cost, not a model's.
- eval: an evaluation run of deterministic requests (temperature 0; a third each on Chat
  Completions, Responses with `store: false`, and Messages; ~1,500-token prompts, gpt-4o and
  claude-sonnet-4-5 prices) replayed twice, the second time a third of them streamed: hit
  rate per pass, upstream calls, and the dollars the first pass spent against what the cache
  saved (`keel_response_cache_saved_usd_total`).
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

import aiohttp
import httpx
import orjson
from common import KEY, percentile, start_keel, start_standin
from overhead import CHAT, ms, run, table

from proxy.prices import PriceTable
from proxy.usage import Usage

CACHE = {"cache": {"responses": "on"}}
PATHS = {"chat": CHAT, "responses": "/v1/responses", "messages": "/v1/messages"}


def hit_body() -> bytes:
    chat = [{"role": "system", "content": "You are a helpful assistant. " * 8}]
    for i in range(9):
        chat.append({"role": "user" if i % 2 == 0 else "assistant",
                     "content": f"Message {i}: " + "some earlier conversation text " * 13})
    return orjson.dumps({"model": "gpt-4o-mini", "temperature": 0, "messages": chat})


async def cpu_ms(proc: Any, url: str, body: bytes, count: int, concurrency: int) -> tuple[float, list[float]]:
    cpu0 = proc.cpu()
    latencies = await run(url, body, concurrency, count)
    return (proc.cpu() - cpu0) / count * 1000, latencies


async def part_hit(quick: bool) -> None:
    standin, standin_url = start_standin(rules="none")
    off, off_url, _ = start_keel(standin_url)
    on, on_url, _ = start_keel(standin_url, CACHE)
    body = hit_body()
    stream = orjson.dumps({**orjson.loads(body), "stream": True})
    count = 300 if quick else 1500
    try:
        await run(on_url, body, 1, 1)  # the original: a miss, kept
        for url in (standin_url, off_url, on_url):
            await run(url, body, 4, 50)  # warm every path
        rows = []
        for concurrency in (1, 16):
            direct = await run(standin_url, body, concurrency, count)
            relay_cpu, relay = await cpu_ms(off, off_url, body, count, concurrency)
            hit_cpu, hit = await cpu_ms(on, on_url, body, count, concurrency)
            sse_cpu, sse = await cpu_ms(on, on_url, stream, count, concurrency)
            base, relayed = percentile(direct, 0.5), percentile(relay, 0.5)
            for name, latencies, cpu in (("direct to the stand-in", direct, None), ("Keel, features off", relay, relay_cpu),
                                         ("Keel, cache hit (JSON)", hit, hit_cpu),
                                         ("Keel, cache hit (SSE from JSON)", sse, sse_cpu)):
                p50 = percentile(latencies, 0.5)
                rows.append([concurrency, name, ms(p50), ms(percentile(latencies, 0.99)),
                             "" if cpu is None else ms(p50 - base), "" if cpu is None else ms(p50 - relayed),
                             "" if cpu is None else f"{cpu:.2f}"])
        print(f"\nA cache hit against the stand-in and the features-off relay ({count} requests a row, "
              f"{len(body) / 1024:.1f} KB body; ms)")
        table(["conc", "path", "p50", "p99", "added vs direct", "vs relay", "Keel CPU/req"], rows)
    finally:
        for proc in (on, off, standin):
            proc.stop()


def eval_requests(n: int) -> list[tuple[str, dict[str, Any]]]:
    context = "Reference passage for the grader. " * 180  # about 1,500 tokens
    out: list[tuple[str, dict[str, Any]]] = []
    for i in range(n):
        question = f"Eval item {i}: answer the question about the passage, in one word."
        shape = ("chat", "responses", "messages")[i % 3]
        if shape == "chat":
            body: dict[str, Any] = {"model": "gpt-4o", "temperature": 0, "messages": [
                {"role": "system", "content": context}, {"role": "user", "content": question}]}
        elif shape == "responses":
            body = {"model": "gpt-4o", "temperature": 0, "store": False, "instructions": context, "input": question}
        else:
            body = {"model": "claude-sonnet-4-5", "temperature": 0, "max_tokens": 64, "system": context,
                    "messages": [{"role": "user", "content": question}]}
        out.append((shape, body))
    return out


async def replay(url: str, requests: list[tuple[str, dict[str, Any]]], stream_every: int) -> tuple[int, float]:
    """One pass: its hits, and what its upstream calls cost (the usage of each whole miss, priced)."""
    prices = PriceTable()
    hits, spent = 0, 0.0
    headers = {"authorization": f"Bearer {KEY}"}
    async with aiohttp.ClientSession() as client:
        for n, (shape, body) in enumerate(requests):
            streamed = bool(stream_every) and n % stream_every == 0
            async with client.post(url + PATHS[shape], json={**body, "stream": streamed}, headers=headers) as r:
                raw = await r.read()
                assert r.status == 200, raw[:200]
                state = r.headers.get("x-keel-response-cache", "")
            if state == "hit":
                hits += 1
            elif not streamed:
                usage = Usage.read(orjson.loads(raw).get("usage"), messages=shape == "messages")
                spent += prices.price(body["model"]).cost(usage) if usage else 0.0
        return hits, spent


async def part_eval(quick: bool) -> None:
    standin, standin_url = start_standin(rules="openai")
    keel, url, _ = start_keel(standin_url, CACHE)
    requests = eval_requests(30 if quick else 90)
    try:
        first_hits, spent = await replay(url, requests, 0)
        second_hits, spent_again = await replay(url, requests, 3)
        metrics = httpx.get(url + "/metrics").text
        saved = sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
                    if line.startswith("keel_response_cache_saved_usd_total"))
        n = len(requests)
        rows = [["1 (JSON)", n, f"{first_hits / n:.0%}", n - first_hits, f"{spent:.4f}", ""],
                ["2 (a third streamed)", n, f"{second_hits / n:.0%}", n - second_hits, f"{spent_again:.4f}",
                 f"{saved:.4f}"]]
        print(f"\nA replayed evaluation run: {n} deterministic requests, chat / responses / messages ($)")
        table(["pass", "requests", "hit rate", "upstream calls", "spent upstream", "saved by the cache"], rows)
        total = first_hits + second_hits
        print(f"over both passes: hit rate {total / (2 * n):.0%}, ${spent + spent_again:.4f} spent upstream, "
              f"${saved:.4f} saved ({saved / (2 * spent):.0%} of what two passes direct would cost)")
    finally:
        keel.stop()
        standin.stop()


async def main(quick: bool, parts: list[str]) -> None:
    for part in parts:
        await {"hit": part_hit, "eval": part_eval}[part](quick)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer requests")
    parser.add_argument("--part", action="append", choices=("hit", "eval"), help="what to measure (default: both)")
    args = parser.parse_args()
    asyncio.run(main(args.quick, args.part or ["hit", "eval"]))
