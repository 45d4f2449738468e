"""What `keel serve` says at start and stop; metrics right with several workers."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import orjson
import yaml
from conftest import KEY, KEY_DIGEST, ServerThread


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _events(text: str) -> list[dict[str, object]]:
    out = []
    for line in text.splitlines():
        if line.startswith("{"):
            out.append(orjson.loads(line))
    return out


def test_serve_with_workers_logs_and_counts_across_workers(standin: ServerThread, tmp_path: Path) -> None:
    """`keel serve --workers 2` logs where it listens, its tenants, upstreams and features, and its stop;
    /metrics adds up every worker's requests whichever worker answers the scrape."""
    port = _free_port()
    config = {"server": {"port": port}, "store": {"url": f"sqlite:///{tmp_path}/k.db"},
              "tenants": [{"id": "acme", "auth": {"keys": [f"sha256:{KEY_DIGEST}"]},
                           "upstream": {"base_url": standin.url + "/v1"}, "context": {"stable": True}}]}
    (tmp_path / "keel.yaml").write_text(yaml.safe_dump(config))
    env = {k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"}
    log = (tmp_path / "keel.log").open("w+")
    proc = subprocess.Popen([sys.executable, "-m", "proxy", "serve", "--config", str(tmp_path / "keel.yaml"),
                             "--workers", "2"], stderr=log, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            try:
                if httpx.get(url + "/healthz").status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.05)
        requests = 24
        for n in range(requests):  # a new connection each: both workers serve some
            reply = httpx.post(url + "/v1/chat/completions", headers={"authorization": f"Bearer {KEY}"},
                               json={"model": "m", "messages": [{"role": "user", "content": f"hi {n}"}]})
            assert reply.status_code == 200
        totals = set()
        for _ in range(8):
            scrape = httpx.get(url + "/metrics").text
            counted = sum(float(v) for v in re.findall(r'^keel_requests_total\{[^}]*tenant="acme"[^}]*\} (\S+)$',
                                                        scrape, re.MULTILINE))
            totals.add(counted)
        assert totals == {float(requests)}
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=20)
    log.seek(0)
    events = _events(log.read())
    start = next(e for e in events if e.get("event") == "keel_starting")
    assert start["listen"] == url and start["workers"] == 2
    assert start["tenants"] == [{"id": "acme", "upstream": standin.url + "/v1", "kind": "openai", "auth": "keys",
                                 "features": ["context"]}]
    assert sum(1 for e in events if e.get("event") == "keel_stopping") == 2  # each worker
    assert any(e.get("event") == "keel_stopped" for e in events)
    assert not Path(str(start["metrics_dir"])).exists()  # the directory Keel made is gone
