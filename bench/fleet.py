"""A fleet on one store: N Keel processes behind HAProxy (round-robin), on one Redis and on a
3-master Redis Cluster; what each call costs the store.

    python bench/fleet.py [--keels 3] [--seconds 20] [--concurrency 24]

Every Keel runs tools (dispatch, a 200-tool catalog), the frozen system prompt, cache hints,
memory (the stand-in as memory model) and savings, in front of one stand-in provider. Clients hold
conversations of 4 turns through HAProxy (`apt-get install haproxy`; the bench says so and stops
when it is missing). The Redis servers are started here (127.0.0.1, ports 7100-7199, files in a
temporary directory). Printed per store: calls/s through the fleet, and from Redis's INFO summed over
its masters: CPU per call (used_cpu_user + used_cpu_sys), commands per call, bytes in and out per
call; and where that puts one Redis core (1 s of CPU / CPU per call). On a 2-core machine the
fleet's own CPU, not Redis, limits calls/s: the per-call costs are what scale.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import redis
from cache import INSTRUCTIONS, tools_for
from common import KEY, ROOT, free_port, start_keel, start_standin, wait_ready
from overhead import table

sys.path.insert(0, str(ROOT / "tests"))
from redis_servers import Cluster, Server, free_ports, redis_binary

SYSTEM = "You are Acme's support assistant.\n\n" + INSTRUCTIONS + "\n\nNow: 2026-11-30 10:{minute:02d}"
FEATURES: dict[str, Any] = {"context": {"stable": True}, "cache": {"breakpoints": "auto", "prompt_cache_key": "auto"},
                            "tools": {"enabled": True, "stability": "dispatch"},
                            "memory": {"enabled": True, "model": "gpt-4o-mini"}}
QUESTIONS = ("How do I get a refund for plan {i}?", "Please remember that my plan is {i}.",
             "Read the file notes_{i}.txt and summarize it.", "Thanks, that is all for ticket {i}.")


def haproxy(ports: list[int]) -> tuple[subprocess.Popen[bytes], str, Path]:
    binary = shutil.which("haproxy")
    if binary is None:
        sys.exit("bench/fleet.py needs HAProxy: apt-get install haproxy")
    tmp = Path(tempfile.mkdtemp(prefix="keel-haproxy-"))
    port = free_port()
    servers = "\n".join(f"    server keel{n} 127.0.0.1:{p} check" for n, p in enumerate(ports))
    (tmp / "haproxy.cfg").write_text(f"""
global
    maxconn 4096
defaults
    mode http
    timeout connect 2s
    timeout client 60s
    timeout server 60s
frontend keel
    bind 127.0.0.1:{port}
    default_backend keels
backend keels
    balance roundrobin
    option httpchk GET /readyz
{servers}
""")
    proc = subprocess.Popen([binary, "-f", str(tmp / "haproxy.cfg"), "-db"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    wait_ready(url + "/readyz")
    return proc, url, tmp


def redis_totals(ports: list[int]) -> dict[str, float]:
    """INFO's counters summed over `ports`, each command's calls and microseconds too (cmd:NAME, us:NAME)."""
    total = {"cpu": 0.0, "commands": 0.0, "bytes_in": 0.0, "bytes_out": 0.0}
    for port in ports:
        client = redis.Redis(port=port)
        cpu, stats = client.info("cpu"), client.info("stats")
        total["cpu"] += float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])
        total["commands"] += stats["total_commands_processed"]
        total["bytes_in"] += stats["total_net_input_bytes"]
        total["bytes_out"] += stats["total_net_output_bytes"]
        for name, row in client.info("commandstats").items():
            command = name.removeprefix("cmdstat_")
            total["cmd:" + command] = total.get("cmd:" + command, 0.0) + row["calls"]
            total["us:" + command] = total.get("us:" + command, 0.0) + row["usec"]
        client.close()
    return total


async def load(url: str, seconds: float, concurrency: int) -> int:
    """Clients holding 4-turn conversations until `seconds` pass; the calls answered 200."""
    tools = tools_for(with_catalog=True)
    done = 0
    deadline = time.monotonic() + seconds

    async def client(c: int) -> None:
        nonlocal done
        async with httpx.AsyncClient(timeout=60, headers={"authorization": f"Bearer {KEY}"}) as http:
            conversation = 0
            while time.monotonic() < deadline:
                conversation += 1
                i = c * 100_000 + conversation
                messages: list[dict[str, Any]] = []
                for turn in range(4):
                    messages.append({"role": "user", "content": QUESTIONS[turn].format(i=i)})
                    body = {"model": "gpt-4o-mini", "user": f"user-{i % 5000}", "tools": tools,
                            "messages": [{"role": "system", "content": SYSTEM.format(minute=turn)}, *messages]}
                    reply = await http.post(url + "/v1/chat/completions", json=body,
                                            headers={"x-keel-conversation": f"c{i}"})
                    if reply.status_code != 200:
                        raise RuntimeError(f"{reply.status_code}: {reply.text[:200]}")
                    done += 1
                    message = reply.json()["choices"][0]["message"]
                    messages.append({k: v for k, v in message.items() if v is not None})
                    for call in message.get("tool_calls") or []:
                        messages.append({"role": "tool", "tool_call_id": call["id"], "content": "done"})

    await asyncio.gather(*(client(c) for c in range(concurrency)))
    return done


def run(store: str, keels: int, seconds: float, concurrency: int) -> list[Any]:
    binary = redis_binary()
    assert binary, "redis-server is needed"
    if store == "redis":
        servers: Any = Server(free_ports(1)[0], binary).start()
        url, masters = f"redis://127.0.0.1:{servers.port}/0", [servers.port]
    else:
        servers = Cluster(binary).start()
        url, masters = servers.url, [n.port for n in servers.masters()]
    standin, standin_url = start_standin(rules="openai")
    fleet = [start_keel(standin_url, FEATURES, store=url) for _ in range(keels)]
    balancer, lb_url, _ = haproxy([int(u.rsplit(":", 1)[1]) for _, u, _ in fleet])
    try:
        asyncio.run(load(lb_url, 3, concurrency))  # warm-up: shared prompts stored, caches filled
        time.sleep(1)
        before, began = redis_totals(masters), time.monotonic()
        calls = asyncio.run(load(lb_url, seconds, concurrency))
        elapsed = time.monotonic() - began
        time.sleep(2)  # the calls' bookkeeping after the answers, memory jobs
        after = redis_totals(masters)
    finally:
        balancer.terminate()
        for keel, _, _ in fleet:
            keel.stop()
        standin.stop()
        servers.stop() if store == "cluster" else servers.remove()
    per = {k: (after[k] - before.get(k, 0.0)) / calls for k in after}
    busiest = sorted((k[3:] for k in per if k.startswith("us:")), key=lambda c: -per["us:" + c])[:5]
    print(f"{store}: per call, the costliest commands: " + ", ".join(
        f"{c} {per['cmd:' + c]:.1f}x {per['us:' + c]:.0f} µs" for c in busiest), file=sys.stderr)
    return [store, keels, calls, f"{calls / elapsed:,.0f}", f"{per['cpu'] * 1e6:,.0f}", f"{per['commands']:.1f}",
            f"{per['bytes_in']:,.0f}", f"{per['bytes_out']:,.0f}", f"{1 / per['cpu']:,.0f}" if per["cpu"] else "-"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--keels", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--concurrency", type=int, default=24)
    parser.add_argument("--store", choices=("redis", "cluster"), action="append")
    args = parser.parse_args()
    rows = [run(store, args.keels, args.seconds, args.concurrency) for store in args.store or ("redis", "cluster")]
    print(f"{args.keels} Keel processes behind HAProxy (round-robin), {args.concurrency} clients, {args.seconds:.0f} s")
    table(["store", "keels", "calls", "calls/s", "Redis CPU µs/call", "commands/call", "bytes in/call",
           "bytes out/call", "calls/s per Redis core"], rows)


if __name__ == "__main__":
    main()
