"""Shared bench plumbing: start real servers as subprocesses, measure their CPU, build bodies."""

from __future__ import annotations

import hashlib
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import orjson
import yaml

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
CATALOGS = SHARED / "data" / "catalogs"
os.environ.setdefault("TIKTOKEN_CACHE_DIR", str(SHARED / "data" / "tiktoken"))
KEY = "sk-bench"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_ready(url: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            httpx.get(url, timeout=1)
            return
        except httpx.HTTPError:
            time.sleep(0.05)
    raise RuntimeError(f"{url} did not come up")


class Proc:
    """A server subprocess; `cpu()` is its user+system CPU seconds so far (from /proc)."""

    def __init__(self, args: list[str], ready_url: str, root: Path | None = None,
                 env: dict[str, str] | None = None) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "proxy", *args], cwd=root or ROOT,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     env={**os.environ, **env} if env else None)
        wait_ready(ready_url)

    def cpu(self) -> float:
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def start_standin(rules: str = "openai") -> tuple[Proc, str]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    return Proc(["standin", "--port", str(port), "--rules", rules, "--log-level", "warning"], url + "/v1/models"), url


def start_keel(upstream: str, tenant_extra: dict[str, Any] | None = None,
               server: dict[str, Any] | None = None, kind: str = "openai", store: str | None = None,
               root: Path | None = None, env: dict[str, str] | None = None) -> tuple[Proc, str, Path]:
    """Keel on a free port (`store`: its URL, default a SQLite file in a temporary directory;
    `root`: run the proxy package of another checkout; `env`: added to its environment)."""
    port = free_port()
    tmp = Path(tempfile.mkdtemp(prefix="keel-bench-"))
    tenant: dict[str, Any] = {"id": "bench", "auth": {"keys": [f"sha256:{hashlib.sha256(KEY.encode()).hexdigest()}"]},
                              "upstream": {"base_url": upstream + "/v1", "kind": kind}}
    tenant.update(tenant_extra or {})
    config = {"server": {"port": port, **(server or {})}, "store": {"url": store or f"sqlite:///{tmp}/keel.db"},
              "tenants": [tenant]}
    (tmp / "keel.yaml").write_text(yaml.safe_dump(config))
    url = f"http://127.0.0.1:{port}"
    return Proc(["serve", "--config", str(tmp / "keel.yaml")], url + "/healthz", root, env), url, tmp


def catalog_tools(name: str = "all_tools.json") -> list[dict[str, Any]]:
    tools: list[dict[str, Any]] = orjson.loads((CATALOGS / name).read_bytes())["tools"]
    return tools


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]
