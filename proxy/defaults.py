"""The implementations Keel uses where none is passed to `create_app`: the store a URL names,
the upstream client the config chooses, where memory jobs are spooled. Kept apart from the protocols, so an implementation
imports its protocol and nothing imports back."""

from __future__ import annotations

from pathlib import Path

from proxy.config import ServerConfig, StoreConfig
from proxy.stores import Store
from proxy.stores.queue import DeadLetters
from proxy.upstream import Upstream


def sqlite_path(url: str) -> str:
    return url.removeprefix("sqlite://").removeprefix("/") or "keel.db"


def spool_dir(store: StoreConfig) -> Path | None:
    """`store.spool_dir`; else `keel-spool` beside the SQLite file (None for an in-memory one,
    whose jobs cannot outlive the process anyway), else in the working directory."""
    if store.spool_dir:
        return Path(store.spool_dir)
    if store.url.startswith("sqlite://"):
        path = sqlite_path(store.url)
        return None if path == ":memory:" else Path(path).parent / "keel-spool"
    return Path("keel-spool")


def open_store(store: StoreConfig | str) -> Store:
    """The store a config (or a bare URL, with the config's defaults) names."""
    config = StoreConfig(url=store) if isinstance(store, str) else store
    dead = DeadLetters(config.dead_letter_ttl_seconds, config.dead_letters_max)
    if config.url.startswith("sqlite://"):
        from proxy.stores.sqlite import SqliteStore

        return SqliteStore(sqlite_path(config.url), dead)
    from proxy.stores.redis import RedisStore

    password, sentinel_password = config.passwords()
    return RedisStore(config.url, config.max_connections, password, sentinel_password, dead)


def create_upstream(server: ServerConfig) -> Upstream:
    if server.upstream_client == "httpx":
        from proxy.upstream_httpx import HttpxUpstream

        return HttpxUpstream(server)
    from proxy.upstream_aiohttp import AiohttpUpstream

    return AiohttpUpstream(server)
