"""The first thing a newcomer sees: the quickstart with every feature on, `keel demo`, and what
`keel serve` says at start and stop; metrics right with several workers."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import orjson
import yaml
from conftest import KEY, KEY_DIGEST, ServerThread

from proxy.server import QUICKSTART_KEY, quickstart_config


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_quickstart_serves_with_features_on() -> None:
    """Tools, context, cache hints and memory are on; keel-local calls the API and opens the page."""
    tenant = quickstart_config("http://127.0.0.1:9/v1", "sqlite:///:memory:", "127.0.0.1", 8080).tenants[0]
    assert tenant.tools.enabled and tenant.context.stable and tenant.memory.enabled
    assert tenant.cache.breakpoints == "auto" and tenant.cache.prompt_cache_key == "auto"
    assert tenant.auth.admin_keys and QUICKSTART_KEY == "keel-local"


def test_demo_saves_and_points_at_the_page(standin: ServerThread, start_keel: Callable[..., ServerThread],
                                           tmp_path: Path) -> None:
    """`keel demo`'s conversation costs less through Keel than direct, searches for a deferred tool, and
    Keel's own estimate of direct is close to the direct run's measured cost."""
    from proxy.demo import run_demo

    keel = start_keel(quickstart_config(standin.url + "/v1", f"sqlite:///{tmp_path}/q.db", "127.0.0.1", 0))
    said: list[str] = []
    result = run_demo(keel.url, QUICKSTART_KEY, said.append)
    direct, through = result["direct"], result["keel"]
    assert through.usage.input < direct.usage.input / 3
    assert {"issue_write", "slack_post_message", "get_current_time"} <= set(through.tools_called)
    assert result["estimate"]["turns"] == through.calls
    measured = direct.usage.input
    assert abs(result["estimate"]["input_direct"] - measured) / measured < 0.15
    text = "\n".join(said)
    assert "fewer input tokens" in text and f"{keel.url}/keel/conversation?id={result['conversation']}" in text
    rounds = httpx.get(f"{keel.url}/keel/api/summary", headers={"authorization": f"Bearer {QUICKSTART_KEY}"}).json()
    assert rounds["tool_search"]["rounds"] >= 1


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
