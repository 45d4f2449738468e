"""The memory job queue: throughput, delay from turn to applied memory, model runs per job.

    .venv/bin/python bench/memory_queue.py [--quick] [--outage SECONDS]

1. The queue alone (push, claim, complete) on SQLite and Redis, against plain store writes
   (`set`) measured in the same run: jobs/s and the ratio.
2. End to end through `keel serve` (SQLite): a chat mix where one turn in five asks to remember
   something, the stand-in as the memory model; p50/p99 delay from the turn's reply to the
   memory being readable, and memory-model runs per remembering job.
3. An outage: the memory model down for `--outage` seconds (default 30) with the default retry
   settings, then back: how many of the memories asked for during it were kept.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.common import KEY, percentile, start_keel, start_standin
from proxy.stores.sqlite import SqliteStore


async def queue_throughput(store: Any, jobs: int) -> tuple[float, float]:
    """(jobs/s through push+claim+complete with 4 workers, plain `set`s per second)."""
    queue = store.job_queue()
    started = time.perf_counter()
    for n in range(jobs):
        await store.set(f"bench:{n}", b"x" * 200)
    sets = jobs / (time.perf_counter() - started)
    started = time.perf_counter()
    for n in range(jobs):
        await queue.push(f"u{n % 200}", f"job-{time.time_ns()}-{n}", b"x" * 200)

    async def worker(name: str) -> None:
        while (job := await queue.claim(name, 30)) is not None:
            await queue.complete(job, name)

    await asyncio.gather(*(worker(f"w{i}") for i in range(4)))
    return jobs / (time.perf_counter() - started), sets


async def stores(jobs: int) -> None:
    print("1. queue alone (push + claim + complete, 4 workers) vs plain store writes, same run")
    with tempfile.TemporaryDirectory() as tmp:
        sqlite = SqliteStore(f"{tmp}/q.db")
        rate, sets = await queue_throughput(sqlite, jobs)
        await sqlite.close()
    print(f"   sqlite: {rate:8.0f} jobs/s   set: {sets:8.0f}/s   ratio {rate / sets:.2f}")
    try:
        from proxy.stores.redis import RedisStore

        redis = RedisStore("redis://127.0.0.1:6379/12")
        if await redis.ping():
            await redis._redis.flushdb()
            rate, sets = await queue_throughput(redis, jobs)
            print(f"   redis:  {rate:8.0f} jobs/s   set: {sets:8.0f}/s   ratio {rate / sets:.2f}")
            await redis._redis.flushdb()
        await redis.close()
    except Exception as exc:  # no Redis here
        print(f"   redis: skipped ({exc!r})")


def end_to_end(turns: int) -> None:
    print(f"2. end to end through keel serve (SQLite): {turns} turns, one in five asks to remember")
    standin, upstream = start_standin()
    keel, url, _ = start_keel(upstream, {"memory": {"enabled": True}})
    try:
        headers = {"authorization": f"Bearer {KEY}"}
        delays: list[float] = []
        asked: list[str] = []
        pending: dict[str, float] = {}
        lock = threading.Lock()
        sending = True

        def watch() -> None:  # polls while the turns go out, so a delay is not the sender's
            with httpx.Client(headers=headers) as client:
                while sending or pending:
                    with lock:
                        waiting = list(pending.items())
                    for user, sent in waiting:
                        if client.get(url + "/v1/keel/memory", headers={"x-keel-user": user}).json()["entries"]:
                            delays.append(time.monotonic() - sent)
                            with lock:
                                del pending[user]
                    time.sleep(0.005)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        with httpx.Client(headers=headers, timeout=10) as client:
            for n in range(turns):
                user = f"u{n}"
                text = f"please remember that my locker is L{n}" if n % 5 == 0 else f"what is {n} squared?"
                client.post(url + "/v1/chat/completions", headers={"x-keel-user": user},
                            json={"model": "m", "messages": [{"role": "user", "content": text}]}).raise_for_status()
                if n % 5 == 0:
                    asked.append(user)
                    with lock:
                        pending[user] = time.monotonic()
        sending = False
        watcher.join(60)
        metrics = httpx.get(url + "/metrics").text
        runs = _sample(metrics, 'keel_memory_model_runs_total{result="ok",tenant="bench"}')
        print(f"   applied {len(delays)}/{len(asked)}; delay from reply to readable memory p50 "
              f"{percentile(delays, 0.5) * 1000:.0f} ms, p99 {percentile(delays, 0.99) * 1000:.0f} ms "
              f"(polled every ~5 ms)")
        print(f"   memory-model runs: {runs:.0f} for {len(asked)} remembering turns of {turns} "
              f"({runs / max(1, len(asked)):.2f} runs per job; the gate skipped the rest)")
    finally:
        keel.stop()
        standin.stop()


def outage(seconds: float) -> None:
    print(f"3. the memory model down for {seconds:.0f} s (default retries), then back")
    import uvicorn

    from bench.common import free_port
    from proxy.config import ServerConfig
    from proxy.server import uvicorn_config

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from memory_model import MemoryModel  # the tests' memory model: switchable, counts runs

    model = MemoryModel(down=True)
    port = free_port()
    server = uvicorn.Server(uvicorn_config(model, "127.0.0.1", port, ServerConfig(), log_level="warning"))
    thread = threading.Thread(target=lambda: asyncio.run(server.serve()), daemon=True)
    thread.start()
    standin, upstream = start_standin()
    keel, url, _ = start_keel(upstream, {"memory": {"enabled": True, "endpoint": f"http://127.0.0.1:{port}/v1"}})
    try:
        headers = {"authorization": f"Bearer {KEY}"}
        for n in range(10):
            httpx.post(url + "/v1/chat/completions", headers={**headers, "x-keel-user": f"o{n}"}, timeout=10,
                       json={"model": "m", "messages": [{"role": "user",
                                                          "content": f"please remember that my seat is s{n}"}]})
        time.sleep(seconds)
        model.down = False
        back = time.monotonic()
        kept = 0
        while time.monotonic() - back < 150 and kept < 10:
            kept = sum(bool(httpx.get(url + "/v1/keel/memory", headers={**headers, "x-keel-user": f"o{n}"})
                            .json()["entries"]) for n in range(10))
            time.sleep(0.5)
        print(f"   kept {kept}/10, the last {time.monotonic() - back:.0f} s after the model came back; "
              f"runs per job {max(model.runs.values(), default=0)} at most")
    finally:
        keel.stop()
        standin.stop()
        server.should_exit = True


def _sample(metrics: str, name: str) -> float:
    for line in metrics.splitlines():
        if line.startswith(name):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--outage", type=float, default=30.0)
    args = parser.parse_args()
    asyncio.run(stores(500 if args.quick else 3000))
    end_to_end(50 if args.quick else 300)
    outage(3 if args.quick else args.outage)


if __name__ == "__main__":
    main()
