"""Running servers: uvicorn with graceful shutdown, and the no-config quickstart.

SIGTERM makes uvicorn stop accepting and wait up to `shutdown_grace_seconds` for in-flight
requests (streams included) before it closes what is left. A client that dribbles its
headers (slowloris) is disconnected after `timeouts.client_header`; its body has
`timeouts.client_body` (the app answers 408); past `max_client_connections`, 503, and past
`max_connections_per_client` from one address, 503 to that address only.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import logging
import os
import shutil
import socket
import tempfile
from typing import Any

import uvicorn
from fastapi import FastAPI
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from proxy.app import create_app
from proxy.config import KeelConfig, ServerConfig, load_config, parse_config
from proxy.errors import error_body
from proxy.jsontext import JsonObject
from proxy.logs import configure_logging
from proxy.standin.app import create_standin_app

QUICKSTART_KEY = "keel-local"
log = logging.getLogger("keel.server")


def describe(config: KeelConfig, host: str, port: int, workers: int) -> JsonObject:
    """What a starting Keel serves: where, with which store, and each tenant's upstream and features
    (never a key)."""
    from proxy.stores.redis_url import masked_url

    store = masked_url(config.store.url)
    tenants = []
    for t in config.tenants:
        features = [name for name, on in (
            ("tools", t.tools.enabled), ("context", t.context.stable), ("memory", t.memory.enabled),
            ("cache_breakpoints", t.cache.breakpoints != "off"),
            ("prompt_cache_key", t.cache.prompt_cache_key != "off")) if on]
        tenants.append({"id": t.id, "upstream": t.upstream.base_url, "kind": t.upstream.kind,
                        "auth": "passthrough" if t.auth.passthrough else "keys", "features": features or ["none"]})
    return {"listen": f"http://{host}:{port}", "workers": workers, "store": store, "tenants": tenants,
            "savings_page": f"http://{host}:{port}/keel/"}


BUSY = (b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nconnection: close\r\n"
        b"content-length: %d\r\n\r\n%s")


class HeaderDeadlineProtocol(HttpToolsProtocol):
    """uvicorn's HTTP protocol, closing a connection whose request headers take longer than
    `config.keel_header_timeout` from their first byte (or from connecting, when nothing
    arrives at all), and answering 503 at once to a client address that already holds
    `config.keel_per_client` connections (one client cannot take the global cap from the rest)."""

    def __init__(self, config: uvicorn.Config, *args: Any, **kwargs: Any) -> None:  # Any: uvicorn's own, passed on
        super().__init__(config, *args, **kwargs)
        self._seconds: float = getattr(config, "keel_header_timeout", 10.0)
        self._deadline: asyncio.TimerHandle | None = None
        self._per_client: int | None = getattr(config, "keel_per_client", None)
        holders = getattr(config, "keel_holders", None)
        self._holders: collections.Counter[str] = holders if isinstance(holders, collections.Counter) else collections.Counter()
        self._address: str | None = None  # counted in `_holders` while open

    def _arm(self) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(self._seconds, self._expired)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expired(self) -> None:
        self._deadline = None
        if not self.transport.is_closing():
            self.transport.close()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        address = self.client[0] if self.client else None
        if address is not None and self._per_client is not None:
            if self._holders[address] >= self._per_client:
                body = error_body(f"too many connections from {address}", "service_unavailable", "too_many_connections")
                transport.write(BUSY % (len(body), body))
                transport.close()
                return
            self._holders[address] += 1
            self._address = address
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        if self._address is not None:
            self._holders[self._address] -= 1
            if self._holders[self._address] <= 0:
                del self._holders[self._address]
            self._address = None
        super().connection_lost(exc)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._arm()

    def on_headers_complete(self) -> None:
        self._disarm()
        super().on_headers_complete()


def uvicorn_config(app: Any, host: str, port: int, server: ServerConfig,  # Any: any ASGI app, as uvicorn takes
                   **extra: Any) -> uvicorn.Config:  # Any: uvicorn.Config's keyword arguments
    """How Keel runs under uvicorn: bounded connections, header deadline, the upstream's own
    Date and Server headers (uvicorn's would duplicate them)."""
    options: JsonObject = dict(
        log_config=None, access_log=False, lifespan="on", timeout_graceful_shutdown=round(server.shutdown_grace_seconds),
        timeout_keep_alive=30, limit_concurrency=server.max_client_connections, server_header=False,
        date_header=False, http=HeaderDeadlineProtocol)
    options.update(extra)
    config = uvicorn.Config(app, host=host, port=port, **options)
    config.keel_header_timeout = server.timeouts.client_header  # type: ignore[attr-defined]
    config.keel_per_client = server.max_connections_per_client  # type: ignore[attr-defined]
    config.keel_holders = collections.Counter()  # type: ignore[attr-defined]  # open connections by address
    return config


def app_from_env() -> FastAPI:
    """Factory for multi-worker runs: each worker process loads the config itself."""
    config = load_config(os.environ["KEEL_CONFIG"])
    configure_logging(config.server.log_level)
    return served(create_app(config))


def served(app: FastAPI) -> FastAPI:
    """The app as a serving process runs it: its garbage collector set once start-up is done
    (proxy/gcposture.py)."""
    app.state.settle_gc = True
    return app


# The quickstart serves what Keel is for: every feature on (the memory model is the upstream's,
# the stand-in playing it when there is no OpenAI key).
QUICKSTART_FEATURES: JsonObject = {
    "tools": {"enabled": True},
    "context": {"stable": True},
    "memory": {"enabled": True},
    "cache": {"breakpoints": "auto", "prompt_cache_key": "auto"},
}


def quickstart_config(standin_url: str | None, store_url: str, host: str, port: int) -> KeelConfig:
    """One tenant with every feature on: the real OpenAI when OPENAI_API_KEY is set, else the built-in
    stand-in. Its key `keel-local` is an admin key: it calls the API and opens /keel/."""
    upstream: JsonObject
    if standin_url is None:
        upstream = {"base_url": "https://api.openai.com/v1", "api_key_env": "OPENAI_API_KEY"}
    else:
        upstream = {"base_url": standin_url}
    digest = hashlib.sha256(QUICKSTART_KEY.encode()).hexdigest()
    return parse_config({
        "server": {"host": host, "port": port},
        "store": {"url": store_url},
        "tenants": [{"id": "local", "auth": {"keys": ["env:KEEL_API_KEY"], "admin_keys": [f"sha256:{digest}"]},
                     "upstream": upstream, **QUICKSTART_FEATURES}],
    }, "quickstart")


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


async def serve_quickstart(host: str, port: int, store_url: str) -> None:
    servers = []
    standin_url = None
    if not os.environ.get("OPENAI_API_KEY"):
        standin_port = _free_port(host)
        standin_url = f"http://{host}:{standin_port}/v1"
        standin_cfg = uvicorn_config(create_standin_app(), host, standin_port, ServerConfig())
        servers.append(uvicorn.Server(standin_cfg))
    config = quickstart_config(standin_url, store_url, host, port)
    configure_logging(config.server.log_level)
    sock = listening_socket(host, port)
    servers.append(uvicorn.Server(uvicorn_config(served(create_app(config)), host, port, config.server)))
    where = "the built-in stand-in provider" if standin_url else "OpenAI (OPENAI_API_KEY is set)"
    log.info("keel_starting", extra=describe(config, host, port, 1))
    print(
        f"Keel on http://{host}:{port}/v1 -> {where}; store {store_url}\n"
        f"  features on: lean tools, frozen system prompt + context updates, cache hints, gated memory\n"
        f"  from openai import OpenAI\n"
        f"  client = OpenAI(base_url=\"http://{host}:{port}/v1\", api_key=\"{QUICKSTART_KEY}\")\n"
        f"  client.chat.completions.create(model=\"gpt-4o-mini\", messages=[{{\"role\": \"user\", \"content\": \"hi\"}}])\n"
        f"  see it save: `keel demo` (or `make demo`), then http://{host}:{port}/keel/ with the key {QUICKSTART_KEY}",
        flush=True,
    )
    try:
        await asyncio.gather(*(s.serve(sockets=[sock] if s is servers[-1] else None) for s in servers))
    finally:
        sock.close()


def metrics_dir() -> tuple[str, bool]:
    """A directory for Prometheus' multiprocess mode (workers > 1): $PROMETHEUS_MULTIPROC_DIR, emptied
    of an earlier run's files, or one Keel creates (and removes at exit). Set before the workers start,
    so every worker writes its metrics there and any worker's /metrics adds them all up."""
    given = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if given:
        os.makedirs(given, exist_ok=True)
        for name in os.listdir(given):
            if name.endswith(".db"):
                os.remove(os.path.join(given, name))
        return given, False
    made = tempfile.mkdtemp(prefix="keel-metrics-")
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = made
    return made, True


def listening_socket(host: str, port: int) -> socket.socket:
    """The server's socket, bound before anything else starts (the store's clients, the memory
    worker): a taken port is an `OSError` naming the address (`keel serve` exits 1), never a process
    that stays up serving nothing."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise OSError(exc.errno, f"cannot listen on {host}:{port}: {exc.strerror}") from None
    sock.set_inheritable(True)  # the workers of a multi-process run accept on it
    return sock


def serve(config_path: str, host: str | None, port: int | None, workers: int | None) -> None:
    config = load_config(config_path)
    server = config.server
    host, port, workers = host or server.host, port if port is not None else server.port, workers or server.workers
    configure_logging(server.log_level)
    sock = listening_socket(host, port)
    started = {"config": os.path.abspath(config_path), **describe(config, host, port, workers)}
    if workers > 1:
        os.environ["KEEL_CONFIG"] = os.path.abspath(config_path)
        directory, made = metrics_dir()
        log.info("keel_starting", extra={**started, "metrics_dir": directory})
        from uvicorn.supervisors import Multiprocess

        multi = uvicorn_config("proxy.server:app_from_env", host, port, server, factory=True, workers=workers)
        try:
            Multiprocess(multi, sockets=[sock]).run()
        finally:
            if made:
                shutil.rmtree(directory, ignore_errors=True)
        return
    log.info("keel_starting", extra=started)
    uvicorn.Server(uvicorn_config(served(create_app(config)), host, port, server)).run(sockets=[sock])


def serve_standin(host: str, port: int, rules: str, log_level: str = "info", gzip: bool = False) -> None:
    configure_logging(log_level)
    app = create_standin_app(rules, gzip=gzip)  # type: ignore[arg-type]
    uvicorn.Server(uvicorn_config(app, host, port, ServerConfig())).run()
