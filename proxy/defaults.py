"""The implementations Keel uses where none is passed to `create_app`: the store a URL names,
the upstream client the config chooses. Kept apart from the protocols, so an implementation
imports its protocol and nothing imports back."""

from __future__ import annotations

from proxy.config import ServerConfig
from proxy.stores import Store
from proxy.upstream import Upstream


def open_store(url: str) -> Store:
    if url.startswith("sqlite://"):
        from proxy.stores.sqlite import SqliteStore

        return SqliteStore(url.removeprefix("sqlite://").removeprefix("/") or "keel.db")
    from proxy.stores.redis import RedisStore

    return RedisStore(url)


def create_upstream(server: ServerConfig) -> Upstream:
    if server.upstream_client == "httpx":
        from proxy.upstream_httpx import HttpxUpstream

        return HttpxUpstream(server)
    from proxy.upstream_aiohttp import AiohttpUpstream

    return AiohttpUpstream(server)
