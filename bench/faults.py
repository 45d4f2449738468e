"""Keel under faults and heavy inputs: what the reliability probe measured, measured again.

    .venv/bin/python bench/faults.py [--quick]

1. A hung Redis (accepts connections, never answers) as the store, every feature on: latency
   of sequential chat turns (they pass through once the store's breaker opens).
2. Many distinct 208-tool catalogs (a new one per request): the `keel serve` process's RSS.
3. A large SSE answer (many small chunks): through Keel with tools on (the tool_search
   responder reads every event) against features off (relayed as it comes), same run.
"""

from __future__ import annotations

import argparse
import hashlib
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import orjson
import yaml
from common import CATALOGS, KEY, Proc, free_port, percentile, start_standin

ROOT = Path(__file__).resolve().parents[1]


def serve(tenant: dict[str, Any], store: str) -> tuple[Proc, str]:
    port = free_port()
    tmp = Path(tempfile.mkdtemp(prefix="keel-faults-"))
    config = {"server": {"port": port, "log_level": "error"}, "store": {"url": store}, "tenants": [
        {"id": "bench", "auth": {"keys": [f"sha256:{hashlib.sha256(KEY.encode()).hexdigest()}"]}, **tenant}]}
    (tmp / "keel.yaml").write_text(yaml.safe_dump(config))
    url = f"http://127.0.0.1:{port}"
    return Proc(["serve", "--config", str(tmp / "keel.yaml")], url + "/healthz"), url


def rss_mib(proc: Proc) -> int:
    status = Path(f"/proc/{proc.proc.pid}/status").read_text()
    return int(status.split("VmRSS:")[1].split()[0]) // 1024


def hung_redis(turns: int) -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(256)
    held: list[socket.socket] = []
    threading.Thread(target=lambda: [held.append(listener.accept()[0]) for _ in iter(int, 1)], daemon=True).start()
    standin, upstream = start_standin()
    keel, url = serve({"upstream": {"base_url": upstream + "/v1"}, "context": {"stable": True},
                       "tools": {"enabled": True}, "memory": {"enabled": True}},
                      f"redis://127.0.0.1:{listener.getsockname()[1]}/0")
    try:
        latencies = []
        with httpx.Client(headers={"authorization": f"Bearer {KEY}"}, timeout=60) as client:
            started = time.perf_counter()
            for n in range(turns):
                t = time.perf_counter()
                client.post(url + "/v1/chat/completions", headers={"x-keel-user": f"u{n}"}, json={
                    "model": "m", "messages": [{"role": "system", "content": "hi"},
                                               {"role": "user", "content": f"hello {n}"}]}).raise_for_status()
                latencies.append(time.perf_counter() - t)
            rate = turns / (time.perf_counter() - started)
        print(f"1. hung Redis store, {turns} sequential turns: p50 {percentile(latencies, 0.5) * 1000:.1f} ms, "
              f"p99 {percentile(latencies, 0.99) * 1000:.0f} ms, {rate:.0f} turns/s; "
              f"/healthz {httpx.get(url + '/healthz', timeout=5).json()}")
    finally:
        keel.stop()
        standin.stop()


def catalogs(count: int) -> None:
    standin, upstream = start_standin("none")
    tmp = tempfile.mkdtemp(prefix="keel-faults-")
    keel, url = serve({"upstream": {"base_url": upstream + "/v1"}, "tools": {"enabled": True}},
                      f"sqlite:///{tmp}/keel.db")
    tools = orjson.loads((CATALOGS / "agent_8servers.json").read_bytes())["tools"]
    text = orjson.dumps(tools).decode()
    try:
        start = rss_mib(keel)
        marks = []
        with httpx.Client(headers={"authorization": f"Bearer {KEY}"}, timeout=60) as client:
            for n in range(count):
                variant = orjson.loads(text.replace('"description":"', f'"description":"v{n} ', 1))
                client.post(url + "/v1/chat/completions", json={"model": "m", "tools": variant, "messages": [
                    {"role": "user", "content": "list my pull requests"}]}).raise_for_status()
                if (n + 1) % max(1, count // 4) == 0:
                    marks.append(f"{n + 1}: {rss_mib(keel)} MiB")
        print(f"2. {count} distinct 208-tool catalogs: RSS {start} MiB at start; " + ", ".join(marks))
    finally:
        keel.stop()
        standin.stop()


def big_stream(megabytes: int) -> None:
    chunks = [b'data: {"id":"x","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"'
              + b"w" * 200 + b'"},"finish_reason":null}]}\n\n'] * (megabytes * 1024 * 1024 // 300)
    tail = [b'data: {"id":"x","object":"chat.completion.chunk","choices":[{"index":0,"delta":{},'
            b'"finish_reason":"stop"}]}\n\n', b"data: [DONE]\n\n"]
    sys.path.insert(0, str(ROOT / "tests"))
    from conftest import ServerThread
    from recorder import Recorder

    recorder = Recorder(content_type=b"text/event-stream", chunks=[b"".join(chunks[i:i + 32])
                                                                    for i in range(0, len(chunks), 32)] + tail)
    tools = [{"type": "function", "function": {"name": f"tool_{i}", "description": f"does thing {i} " * 20,
                                               "parameters": {"type": "object"}}} for i in range(20)]
    with ServerThread(recorder) as upstream:
        times = {}
        for label, tenant in (("features off", {}), ("tools on", {"tools": {"enabled": True}})):
            keel, url = serve({"upstream": {"base_url": upstream.url + "/v1"}, **tenant}, "sqlite:///:memory:")
            try:
                started = time.perf_counter()
                with httpx.stream("POST", url + "/v1/chat/completions", headers={"authorization": f"Bearer {KEY}"},
                                  json={"model": "m", "stream": True, "tools": tools,
                                        "messages": [{"role": "user", "content": "hi"}]}, timeout=600) as r:
                    size = sum(len(c) for c in r.iter_raw())
                times[label] = time.perf_counter() - started
            finally:
                keel.stop()
        print(f"3. a {size / 1e6:.0f} MB SSE answer: features off {times['features off']:.2f} s, through the "
              f"tool_search responder {times['tools on']:.2f} s ({times['tools on'] / times['features off']:.1f}x)")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    hung_redis(20 if args.quick else 60)
    catalogs(40 if args.quick else 300)
    big_stream(10 if args.quick else 100)


if __name__ == "__main__":
    main()
