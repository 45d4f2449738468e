"""Redis store URLs: one server, a Cluster, or a Sentinel-managed master, read once and checked.

    redis://[user:password@]host:port/db            one Redis or Valkey (rediss://: TLS)
    redis+cluster://[user:password@]h:p,h:p/        a Redis/Valkey Cluster: any few nodes to start from
    redis+sentinel://[user:password@]h:p,h:p/service/db
                                                     the master Sentinel names for `service`
    unix:///path/to/redis.sock?db=0                 one server on a socket

TLS (`rediss`, `rediss+cluster`, `rediss+sentinel`) takes these query parameters:
`ssl_ca_certs` (a PEM file: the private CA that signed the server's certificate),
`ssl_certfile` and `ssl_keyfile` (a client certificate), `ssl_check_hostname` (true/false).
A URL is parsed at config load, so `keel check-config` names what is wrong with it, and a
multi-host URL that says neither cluster nor sentinel is refused there instead of at start.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Literal
from urllib.parse import parse_qsl, unquote, urlsplit

Topology = Literal["single", "cluster", "sentinel"]
SCHEMES: dict[str, tuple[Topology, bool]] = {
    "redis": ("single", False), "rediss": ("single", True), "unix": ("single", False),
    "redis+cluster": ("cluster", False), "rediss+cluster": ("cluster", True),
    "redis+sentinel": ("sentinel", False), "rediss+sentinel": ("sentinel", True),
}
TLS_OPTIONS = ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile", "ssl_check_hostname")
DEFAULT_PORT = {"single": 6379, "cluster": 6379, "sentinel": 26379}


@dataclass(frozen=True)
class RedisTarget:
    topology: Topology
    tls: bool
    hosts: tuple[tuple[str, int], ...]
    db: int = 0
    username: str | None = None
    password: str | None = None
    service: str | None = None  # sentinel: the monitored master's name
    socket_path: str | None = None  # unix://
    tls_options: dict[str, str | bool] = field(default_factory=dict)

    def with_passwords(self, password: str | None) -> RedisTarget:
        return self if password is None else RedisTarget(self.topology, self.tls, self.hosts, self.db, self.username,
                                                         password, self.service, self.socket_path, self.tls_options)


def parse_redis_url(url: str) -> RedisTarget:
    """The target a store URL names; ValueError saying what is wrong, never a traceback."""
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    if scheme not in SCHEMES:
        raise ValueError(f"unknown scheme {scheme or url!r}: use one of " + ", ".join(f"{s}://" for s in SCHEMES))
    topology, tls = SCHEMES[scheme]
    parts = urlsplit(url)
    query = dict(parse_qsl(parts.query, keep_blank_values=True))
    userinfo, _, hostlist = parts.netloc.rpartition("@")
    username, password = _credentials(userinfo)
    if scheme == "unix":
        return _unix(parts.path, query, username, password)
    hosts = _hosts(hostlist, topology)
    if len(hosts) > 1 and topology == "single":
        raise ValueError(f"{len(hosts)} hosts in a {scheme}:// URL: a Redis Cluster is redis+cluster://h:p,h:p/ and "
                         "Sentinel is redis+sentinel://h:p,h:p/<service>/<db>")
    path = [unquote(p) for p in parts.path.split("/") if p]
    service, db = None, 0
    if topology == "sentinel":
        if not path:
            raise ValueError("a sentinel URL names the master's service: redis+sentinel://h:p,h:p/<service>/<db>")
        service, db = path[0], _db(path[1:], scheme)
    else:
        db = _db(path, scheme)
        if topology == "cluster" and db != 0:
            raise ValueError("a Redis Cluster has only database 0: end the URL with / or /0")
    if "db" in query:
        raise ValueError("the database goes in the path (redis://host:6379/2), not ?db=")
    return RedisTarget(topology, tls, hosts, db, username, password, service, None, _tls_options(query, tls, scheme))


def _credentials(userinfo: str) -> tuple[str | None, str | None]:
    if not userinfo:
        return None, None
    user, colon, password = userinfo.partition(":")
    if not colon:  # redis://secret@host: a bare password, as redis-cli takes it
        return None, unquote(user) or None
    return unquote(user) or None, unquote(password) or None


def _hosts(hostlist: str, topology: Topology) -> tuple[tuple[str, int], ...]:
    hosts: list[tuple[str, int]] = []
    for item in hostlist.split(","):
        item = item.strip()
        if not item:
            raise ValueError("an empty host in the URL's host list")
        if item.startswith("["):  # [::1]:6379
            host, _, rest = item[1:].partition("]")
            port_text = rest.removeprefix(":")
        else:
            host, _, port_text = item.rpartition(":") if item.count(":") == 1 else (item, "", "")
        if not host:
            raise ValueError(f"{item!r}: no host")
        try:
            port = int(port_text) if port_text else DEFAULT_PORT[topology]
        except ValueError:
            raise ValueError(f"{item!r}: the port must be a number") from None
        if not 0 < port < 65536:
            raise ValueError(f"{item!r}: the port must be 1-65535")
        hosts.append((host, port))
    return tuple(hosts)


def _db(path: list[str], scheme: str) -> int:
    if not path:
        return 0
    if len(path) > 1 or not path[0].isdigit():
        raise ValueError(f"{'/'.join(path)!r}: a {scheme}:// URL's path is the database number")
    return int(path[0])


def _tls_options(query: dict[str, str], tls: bool, scheme: str) -> dict[str, str | bool]:
    unknown = sorted(set(query) - set(TLS_OPTIONS))
    if unknown:
        raise ValueError(f"unknown URL parameter {unknown[0]!r}; the URL takes only " + ", ".join(TLS_OPTIONS)
                         + " (with TLS); a cluster is redis+cluster://, Sentinel redis+sentinel://")
    if query and not tls:
        raise ValueError(f"{', '.join(sorted(query))}: TLS parameters need TLS: use rediss in place of {scheme}")
    options: dict[str, str | bool] = {}
    for name, value in query.items():
        if name == "ssl_check_hostname":
            if value.lower() not in ("true", "false"):
                raise ValueError("ssl_check_hostname is true or false")
            options[name] = value.lower() == "true"
            continue
        if not os.path.isfile(value):
            raise ValueError(f"{name}: {value!r} is not a readable file")
        options[name] = value
    return options


def _unix(path: str, query: dict[str, str], username: str | None, password: str | None) -> RedisTarget:
    unknown = sorted(set(query) - {"db"})
    if unknown:
        raise ValueError(f"unknown URL parameter {unknown[0]!r}; a unix:// URL takes only ?db=")
    db_text = query.get("db", "0")
    if not db_text.isdigit():
        raise ValueError("?db= is a database number")
    if not path:
        raise ValueError("unix:///path/to/redis.sock: the socket's path")
    return RedisTarget("single", False, (), int(db_text), username, password, socket_path=path)


def masked_url(url: str) -> str:
    """The URL with its credentials hidden (logs, `keel check-config`)."""
    scheme, sep, rest = url.partition("://")
    netloc, slash, tail = rest.partition("/")
    if "@" not in netloc:
        return url
    return f"{scheme}{sep}***@{netloc.rpartition('@')[2]}{slash}{tail}"
