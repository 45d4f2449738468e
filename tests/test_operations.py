"""Operations: health, readiness, metrics, request ids, logs, passthrough auth, graceful shutdown."""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from conftest import KEY, KEY_DIGEST, ServerThread, keel_config, tenant
from recorder import Recorder, lifespan, read_body

from proxy.logs import JsonFormatter

AUTH = {"authorization": f"Bearer {KEY}"}
ROOT = Path(__file__).resolve().parents[1]


def test_healthz_and_readyz(keel: ServerThread) -> None:
    assert httpx.get(keel.url + "/healthz").json() == {"status": "ok", "store": "ok"}
    assert httpx.get(keel.url + "/readyz").status_code == 200


def test_store_down_is_a_health_detail_not_unreadiness(standin: ServerThread,
                                                       start_keel: Callable[..., ServerThread]) -> None:
    """A Keel whose store is down still serves (it passes requests through), so it stays ready;
    /healthz and keel_store_up say the store is down."""
    keel = start_keel(keel_config(tenant(standin.url + "/v1"), store={"url": "redis://127.0.0.1:1/0"}))
    assert httpx.get(keel.url + "/healthz").json() == {"status": "ok", "store": "unavailable"}
    assert httpx.get(keel.url + "/readyz").status_code == 200
    assert "keel_store_up 0.0" in httpx.get(keel.url + "/metrics").text


def test_metrics_count_requests_bytes_and_upstream_status(keel: ServerThread) -> None:
    httpx.post(keel.url + "/v1/chat/completions", json={"model": "m", "messages": [{"role": "user", "content": "a"}]},
               headers=AUTH)
    httpx.post(keel.url + "/v1/chat/completions",
               json={"model": "m", "messages": [{"role": "user", "content": "[[error 429]]"}]}, headers=AUTH)
    text = httpx.get(keel.url + "/metrics").text
    assert 'keel_requests_total{route="chat",status="200",tenant="acme"} 1.0' in text
    assert 'keel_upstream_responses_total{status="429",tenant="acme"} 1.0' in text
    assert 'keel_request_seconds_count{route="chat",tenant="acme"} 2.0' in text
    assert 'keel_request_bytes_total{tenant="acme"}' in text and "keel_streams_open" in text


def test_request_id_generated_and_passed_upstream(start_keel: Callable[..., ServerThread]) -> None:
    recorder = Recorder()
    with ServerThread(recorder) as upstream:
        keel = start_keel(keel_config(tenant(upstream.url + "/v1")))
        r = httpx.post(keel.url + "/v1/chat/completions", json={"messages": []}, headers=AUTH)
    rid = r.headers["x-request-id"]
    assert len(rid) == 32 and recorder.received[0].headers["x-request-id"] == rid


class ProviderIds(Recorder):
    """An upstream that names each reply with its own x-request-id, as OpenAI does."""

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if await lifespan(scope, receive, send):
            return
        await read_body(receive)
        self.received.append(None)  # type: ignore[arg-type]
        stream = scope["path"].endswith("/stream")
        kind = b"text/event-stream" if stream else b"application/json"
        body = b"data: [DONE]\n\n" if stream else b'{"id":"x","choices":[]}'
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", kind), (b"x-request-id", f"req_provider{len(self.received)}".encode())]})
        await send({"type": "http.response.body", "body": body})


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/models", "/v1/files/stream"])
def test_provider_request_id_is_kept_and_both_are_logged(start_keel: Callable[..., ServerThread], path: str,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    """The provider's x-request-id reaches the client (its SDK and a support ticket quote it); Keel's own
    id travels beside it as x-keel-request-id, and the access log carries both."""
    with ServerThread(ProviderIds()) as upstream, caplog.at_level(logging.INFO, logger="keel.access"):
        keel = start_keel(keel_config(tenant(upstream.url + "/v1")))
        reply = httpx.post(keel.url + path, json={"model": "m", "messages": []}, headers=AUTH)
        mine = httpx.post(keel.url + path, json={"model": "m", "messages": []}, headers={**AUTH, "x-request-id": "mine"})
    assert reply.headers["x-request-id"] == "req_provider1" and len(reply.headers["x-keel-request-id"]) == 32
    assert mine.headers["x-request-id"] == "req_provider2" and mine.headers["x-keel-request-id"] == "mine"
    logged = [json.loads(JsonFormatter().format(r)) for r in caplog.records if r.name == "keel.access"]
    assert [(e["request_id"], e["upstream_request_ids"]) for e in logged] == [
        (reply.headers["x-keel-request-id"], ["req_provider1"]), ("mine", ["req_provider2"])]


def test_keels_own_answers_carry_its_request_id(keel: ServerThread) -> None:
    """An answer Keel makes itself (here a 401) names Keel's id in both headers: there is no provider's."""
    reply = httpx.post(keel.url + "/v1/chat/completions", json={}, headers={"x-request-id": "req-1"})
    assert reply.status_code == 401
    assert reply.headers["x-request-id"] == reply.headers["x-keel-request-id"] == "req-1"


def test_passthrough_tenant_forwards_client_key(start_keel: Callable[..., ServerThread]) -> None:
    """A passthrough tenant (by X-Keel-Tenant, or as default) sends the client's own key upstream."""
    recorder = Recorder()
    with ServerThread(recorder) as upstream:
        byok = {"id": "byok", "default": True, "auth": {"passthrough": True}, "upstream": {"base_url": upstream.url}}
        keel = start_keel(keel_config(tenant(upstream.url), byok))
        named = httpx.get(keel.url + "/v1/models", headers={"authorization": "Bearer sk-user-own",
                                                            "x-keel-tenant": "byok"})
        default = httpx.get(keel.url + "/v1/models", headers={"authorization": "Bearer sk-user-2"})
        keyed = httpx.get(keel.url + "/v1/models", headers=AUTH)
    assert named.status_code == default.status_code == keyed.status_code == 200
    sent = [r.headers["authorization"] for r in recorder.received]
    assert sent == ["Bearer sk-user-own", "Bearer sk-user-2", "Bearer sk-upstream-secret"]


def test_unknown_route_is_openai_error(keel: ServerThread) -> None:
    r = httpx.get(keel.url + "/nope")
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"


def test_access_log_is_json_without_keys_or_bodies(keel: ServerThread, caplog: pytest.LogCaptureFixture) -> None:
    """One JSON line per request with tenant, status, latency, bytes; never the key or the message."""
    with caplog.at_level(logging.INFO, logger="keel.access"):
        httpx.post(keel.url + "/v1/chat/completions",
                   json={"model": "m", "messages": [{"role": "user", "content": "my secret plan"}]}, headers=AUTH)
    records = [r for r in caplog.records if r.name == "keel.access"]
    assert len(records) == 1
    line = JsonFormatter().format(records[0])
    data = json.loads(line)
    assert data["tenant"] == "acme" and data["status"] == 200 and data["latency_ms"] > 0 and data["bytes_in"] > 0
    assert KEY not in line and "secret plan" not in line and "sk-upstream" not in line


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_sigterm_finishes_inflight_stream(standin: ServerThread, tmp_path: Path) -> None:
    """On SIGTERM Keel stops accepting but lets an in-flight stream finish, then logs keel_stopped."""
    port = _free_port()
    config = {"server": {"port": port, "shutdown_grace_seconds": 10}, "store": {"url": f"sqlite:///{tmp_path}/k.db"},
              "tenants": [{"id": "acme", "auth": {"keys": [f"sha256:{KEY_DIGEST}"]},
                           "upstream": {"base_url": standin.url + "/v1"}}]}
    (tmp_path / "keel.yaml").write_text(yaml.safe_dump(config))
    log = (tmp_path / "keel.log").open("wb")
    proc = subprocess.Popen([sys.executable, "-m", "proxy", "serve", "--config", str(tmp_path / "keel.yaml")],
                            stderr=log, stdout=log, env={**os.environ})
    try:
        for _ in range(200):
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz").status_code == 200:
                    break
            except httpx.ConnectError:
                time.sleep(0.05)
        body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "[[words 20]] [[drip 0.05]]"}]}
        with httpx.stream("POST", f"http://127.0.0.1:{port}/v1/chat/completions", json=body, headers=AUTH,
                          timeout=10) as r:
            chunks = r.iter_raw()
            received = next(chunks)
            proc.send_signal(signal.SIGTERM)
            time.sleep(0.2)
            with pytest.raises(httpx.ConnectError):
                httpx.get(f"http://127.0.0.1:{port}/healthz")
            for chunk in chunks:
                received += chunk
        assert received.endswith(b"data: [DONE]\n\n") and b"word19" in received
        assert proc.wait(timeout=10) in (0, -signal.SIGTERM)  # uvicorn re-raises the signal once done
        events = [json.loads(line).get("event") for line in (tmp_path / "keel.log").read_text().splitlines()
                  if line.startswith("{")]
        assert events[-2:] == ["keel_stopping", "keel_stopped"]
    finally:
        proc.kill()
        log.close()


def test_version_from_package_metadata() -> None:
    """`keel --version` prints `keel <version>`, the version pyproject.toml declares."""
    declared = re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.MULTILINE)
    assert declared
    out = subprocess.run([sys.executable, "-m", "proxy", "--version"], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout == f"keel {declared.group(1)}\n"


def test_version_falls_back_to_pyproject(monkeypatch: pytest.MonkeyPatch) -> None:
    """From a source tree that is not installed, the version comes from pyproject.toml."""
    from importlib import metadata

    from proxy.cli import version

    def missing(name: str) -> str:
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "version", missing)
    declared = re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.MULTILINE)
    assert declared and version() == declared.group(1)


def test_serve_listens_where_keel_port_says(standin: ServerThread, tmp_path: Path) -> None:
    """`keel serve` takes KEEL_HOST/KEEL_PORT (the container image sets them) over the config's
    server.host/port, so the image's HEALTHCHECK knows the port; a bad KEEL_PORT exits 2 naming it."""
    config_port, env_port = _free_port(), _free_port()
    config = {"server": {"port": config_port}, "store": {"url": f"sqlite:///{tmp_path}/k.db"},
              "tenants": [{"id": "acme", "auth": {"keys": [f"sha256:{KEY_DIGEST}"]},
                           "upstream": {"base_url": standin.url + "/v1"}}]}
    (tmp_path / "keel.yaml").write_text(yaml.safe_dump(config))
    serve = [sys.executable, "-m", "proxy", "serve", "--config", str(tmp_path / "keel.yaml")]
    env = {**os.environ, "KEEL_HOST": "127.0.0.1", "KEEL_PORT": str(env_port)}
    proc = subprocess.Popen(serve, stderr=subprocess.DEVNULL, env=env)
    try:
        for _ in range(200):
            try:
                assert httpx.get(f"http://127.0.0.1:{env_port}/healthz").status_code == 200
                break
            except httpx.ConnectError:
                time.sleep(0.05)
        else:
            pytest.fail("Keel did not listen on KEEL_PORT")
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"http://127.0.0.1:{config_port}/healthz")
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    bad = subprocess.run(serve, capture_output=True, text=True, env={**env, "KEEL_PORT": "http"}, timeout=30)
    assert bad.returncode == 2 and "KEEL_PORT" in bad.stderr


def test_listen_address_precedence(monkeypatch: pytest.MonkeyPatch) -> None:
    """Flags first, then KEEL_HOST/KEEL_PORT, else nothing (the config decides; 127.0.0.1 by default)."""
    from proxy.cli import listen_address

    monkeypatch.delenv("KEEL_HOST", raising=False)
    monkeypatch.delenv("KEEL_PORT", raising=False)
    assert listen_address(None, None) == (None, None)
    monkeypatch.setenv("KEEL_HOST", "0.0.0.0")
    monkeypatch.setenv("KEEL_PORT", "9000")
    assert listen_address(None, None) == ("0.0.0.0", 9000)
    assert listen_address("127.0.0.1", 8081) == ("127.0.0.1", 8081)


def test_estimated_token_counts_are_said_once_at_start(tmp_path: Path) -> None:
    """Without tiktoken's files (and no way to download them) Keel says at start, in one plain
    line, that token figures are estimates."""
    port = _free_port()
    config = {"server": {"port": port}, "store": {"url": f"sqlite:///{tmp_path}/k.db"},
              "tenants": [{"id": "acme", "auth": {"keys": [f"sha256:{KEY_DIGEST}"]},
                           "upstream": {"base_url": "http://127.0.0.1:9/v1"}}]}
    (tmp_path / "keel.yaml").write_text(yaml.safe_dump(config))
    (tmp_path / "empty").mkdir()
    env = {**os.environ, "TIKTOKEN_CACHE_DIR": str(tmp_path / "empty"), "HTTPS_PROXY": "http://127.0.0.1:9",
           "HTTP_PROXY": "http://127.0.0.1:9"}
    log = (tmp_path / "keel.log").open("wb")
    proc = subprocess.Popen([sys.executable, "-m", "proxy", "serve", "--config", str(tmp_path / "keel.yaml")],
                            stderr=log, stdout=log, env=env)
    try:
        for _ in range(300):
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz").status_code == 200:
                    break
            except httpx.ConnectError:
                time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=10)
    finally:
        proc.kill()
        log.close()
    lines = [json.loads(line) for line in (tmp_path / "keel.log").read_text().splitlines() if line.startswith("{")]
    said = [line for line in lines if line.get("event") == "token_counts_estimated"]
    assert len(said) == 1 and "estimates" in said[0]["detail"]


def test_serve_on_a_taken_port_exits_at_once(tmp_path: Path) -> None:
    """`keel serve` on a port another process holds, with a Redis store and the memory worker on, stayed
    up serving nothing and ignored SIGTERM; it binds first and exits 1 saying which address is taken."""
    from conftest import REDIS_URL

    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        config = {"server": {"port": port}, "store": {"url": REDIS_URL},
                  "tenants": [{"id": "acme", "auth": {"keys": [f"sha256:{KEY_DIGEST}"]}, "memory": {"enabled": True},
                               "upstream": {"base_url": "http://127.0.0.1:9/v1"}}]}
        (tmp_path / "keel.yaml").write_text(yaml.safe_dump(config))
        for workers in ("1", "2"):
            started = time.monotonic()
            out = subprocess.run([sys.executable, "-m", "proxy", "serve", "--config", str(tmp_path / "keel.yaml"),
                                  "--workers", workers], capture_output=True, text=True, timeout=30)
            assert out.returncode == 1 and f"127.0.0.1:{port}" in out.stderr and "in use" in out.stderr, out.stderr
            assert time.monotonic() - started < 10
