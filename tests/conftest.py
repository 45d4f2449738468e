"""Shared fixtures: real servers on port 0 in a background thread, builders, the stand-in."""

from __future__ import annotations

import asyncio
import hashlib
import os
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn

SHARED = Path(__file__).resolve().parents[2] / "shared"
os.environ.setdefault("TIKTOKEN_CACHE_DIR", str(SHARED / "data" / "tiktoken"))

from proxy.app import create_app  # noqa: E402
from proxy.config import KeelConfig, ServerConfig, parse_config  # noqa: E402
from proxy.server import uvicorn_config  # noqa: E402
from proxy.standin.app import StandIn, create_standin_app  # noqa: E402
from proxy.tokens import TokenCounter  # noqa: E402

REDIS_URL = os.environ.get("KEEL_TEST_REDIS_URL", "redis://127.0.0.1:6379/15")
KEY = "sk-keel-test"
KEY_DIGEST = hashlib.sha256(KEY.encode()).hexdigest()
CATALOGS = SHARED / "data" / "catalogs"


class ServerThread:
    """A real uvicorn server for one ASGI app, on a free port, in its own thread and loop."""

    def __init__(self, app: Any, **config: Any) -> None:
        self.app = app
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        sock.close()
        server_config = config.pop("server_config", None) or ServerConfig()
        cfg = dict(timeout_graceful_shutdown=5)
        cfg.update(config)
        self.server = uvicorn.Server(uvicorn_config(app, "127.0.0.1", self.port, server_config, **cfg))
        self.server.install_signal_handlers = lambda: None  # type: ignore[method-assign]
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        asyncio.run(self.server.serve())

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> ServerThread:
        self.thread.start()
        for _ in range(500):
            if self.server.started:
                return self
            threading.Event().wait(0.01)
        raise RuntimeError("server did not start")

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


def tenant(upstream_url: str, **overrides: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "id": "acme",
        "auth": {"keys": [f"sha256:{KEY_DIGEST}"]},
        "upstream": {"base_url": upstream_url, "api_key_env": "KEEL_TEST_UPSTREAM_KEY"},
    }
    data.update(overrides)
    return data


def keel_config(*tenants: dict[str, Any], **top: Any) -> KeelConfig:
    data: dict[str, Any] = {"store": {"url": "sqlite:///:memory:"}, "tenants": list(tenants)}
    data.update(top)
    return parse_config(data, "test")


def chat_request(**overrides: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hello"}]}
    body.update(overrides)
    return body


def tool(name: str, description: str = "", **params: Any) -> dict[str, Any]:
    props = {k: {"type": v} for k, v in params.items()}
    return {"type": "function", "function": {"name": name, "description": description,
                                             "parameters": {"type": "object", "properties": props}}}


@pytest.fixture(scope="session")
def token_counter() -> TokenCounter:
    return TokenCounter()


@pytest.fixture
def standin(token_counter: TokenCounter) -> Iterator[ServerThread]:
    app = create_standin_app(standin=StandIn(tokens=token_counter))
    with ServerThread(app) as server:
        yield server


@pytest.fixture
def start_keel(tmp_path: Path) -> Iterator[Callable[..., ServerThread]]:
    """Start Keel for a config; stopped at teardown."""
    started: list[ServerThread] = []
    os.environ["KEEL_TEST_UPSTREAM_KEY"] = "sk-upstream-secret"

    def start(config: KeelConfig, **kwargs: Any) -> ServerThread:
        server = ServerThread(create_app(config, **kwargs), server_config=config.server).__enter__()
        started.append(server)
        return server

    yield start
    for server in started:
        server.__exit__()


@pytest.fixture
def keel(standin: ServerThread, start_keel: Callable[..., ServerThread]) -> ServerThread:
    """Keel in front of a fresh stand-in, features off."""
    return start_keel(keel_config(tenant(standin.url + "/v1")))


async def redis_or_skip() -> Any:
    """A RedisStore on the test database, flushed; unreachable Redis skips, or fails under CI."""
    from proxy.stores.redis import RedisStore

    store = RedisStore(REDIS_URL)
    if not await store.ping():
        await store.close()
        if os.environ.get("CI"):
            pytest.fail(f"Redis at {REDIS_URL} is unreachable and CI is set")
        pytest.skip(f"Redis at {REDIS_URL} is unreachable (set CI to make this a failure)")
    await store._redis.flushdb()
    return store
