"""redis-py clients for each topology a store URL names, and the one error they all raise as.

A plain client for one server, redis-py's cluster client (it follows MOVED/ASK and re-reads the
slot map when a master fails over) and a Sentinel-managed client (each new connection asks the
sentinels where the master is now, and a master turned replica drops its connections). The
cluster client raises `RedisClusterException`s that are not `RedisError`s, so `STORE_ERRORS`
names both families: every caller translates them into `StoreError` the same way.
"""

from __future__ import annotations

from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel
from redis.backoff import ExponentialBackoff
from redis.exceptions import RedisClusterException, RedisError

from proxy.stores.redis_url import RedisTarget

# Every failure a Redis call can end in: the server's and the client's, in each topology.
STORE_ERRORS: tuple[type[BaseException], ...] = (RedisError, RedisClusterException, OSError)
CONNECT_TIMEOUT = 2.0
SOCKET_TIMEOUT = 5.0


def _retry(attempts: int) -> Retry:
    """Quick retries: a call waits `store.budget_ms` at most anyway, and the breaker, not the client,
    decides when to stop asking (redis-py's default backs off for seconds). A cluster retries more:
    each retry may follow a master that moved."""
    return Retry(ExponentialBackoff(cap=0.2, base=0.02), attempts)


def _tls(target: RedisTarget) -> dict[str, Any]:  # Any: keyword arguments of redis-py's constructors
    if not target.tls:
        return {}
    return {"ssl": True, **target.tls_options}


def connect(target: RedisTarget, max_connections: int, sentinel_password: str | None = None) -> Any:
    """A client for `target` whose pools hold at most `max_connections` per server. (Any: redis-py
    types every reply bytes | str, decided at runtime; Keel reads bytes.)"""
    # Any: keyword arguments of redis-py's constructors
    common: dict[str, Any] = {"username": target.username, "password": target.password,
                              "socket_connect_timeout": CONNECT_TIMEOUT, "socket_timeout": SOCKET_TIMEOUT}
    if target.topology == "cluster":
        nodes = [ClusterNode(host, port) for host, port in target.hosts]
        return RedisCluster(startup_nodes=nodes, max_connections=max_connections, retry=_retry(3), **common,
                            **_tls(target))
    common["retry"] = _retry(1)
    if target.topology == "sentinel":
        assert target.service is not None
        sentinel_auth = {"password": sentinel_password, "socket_connect_timeout": CONNECT_TIMEOUT,
                         "socket_timeout": SOCKET_TIMEOUT, **_tls(target)}
        sentinel = Sentinel(list(target.hosts), sentinel_kwargs=sentinel_auth, **common, **_tls(target))
        return sentinel.master_for(target.service, db=target.db, max_connections=max_connections)
    if target.socket_path is not None:
        pool = aioredis.ConnectionPool(connection_class=aioredis.UnixDomainSocketConnection, path=target.socket_path,
                                       db=target.db, max_connections=max_connections, **common)
        return aioredis.Redis(connection_pool=pool)
    ((host, port),) = target.hosts
    return aioredis.Redis(host=host, port=port, db=target.db, max_connections=max_connections, **common,
                          **_tls(target))
