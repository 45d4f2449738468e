"""Store URLs for each Redis topology: read at load, refused by check-config with a reason, and a
real TLS server with a private CA and a password; `keel report` on a store that does not answer."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import KEY_DIGEST

from proxy.config import ConfigError, masked, parse_config
from proxy.defaults import open_store
from proxy.stores.redis import RedisStore
from proxy.stores.redis_url import parse_redis_url


def config(url: str, **store: Any) -> dict[str, Any]:
    return {"store": {"url": url, **store}, "tenants": [{"id": "t", "auth": {"keys": [f"sha256:{KEY_DIGEST}"]},
                                                           "upstream": {"base_url": "http://up.example/v1"}}]}


def test_each_topology_is_read_from_its_url(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    single = parse_redis_url("redis://:s3cret@cache.internal:6380/3")
    assert (single.topology, single.hosts, single.db, single.password, single.tls) == (
        "single", (("cache.internal", 6380),), 3, "s3cret", False)
    tls = parse_redis_url(f"rediss://keel:pw@redis.internal/0?ssl_ca_certs={ca}&ssl_check_hostname=false")
    assert tls.tls and tls.username == "keel" and tls.tls_options == {"ssl_ca_certs": str(ca),
                                                                      "ssl_check_hostname": False}
    cluster = parse_redis_url("redis+cluster://a:7000,b:7001,[::1]:7002/")
    assert cluster.topology == "cluster" and cluster.hosts == (("a", 7000), ("b", 7001), ("::1", 7002))
    sentinel = parse_redis_url("rediss+sentinel://:pw@s1,s2:26380/keel-main/2")
    assert (sentinel.topology, sentinel.tls, sentinel.hosts, sentinel.service, sentinel.db) == (
        "sentinel", True, (("s1", 26379), ("s2", 26380)), "keel-main", 2)
    assert parse_redis_url("unix:///run/redis.sock?db=4").socket_path == "/run/redis.sock"


@pytest.mark.parametrize("url, says", [
    ("redis://a:6379,b:6379/0", "redis+cluster://"),
    ("redis://a:6379/0?cluster=true", "unknown URL parameter 'cluster'"),
    ("redis+cluster://a:7000,b:7001/2", "only database 0"),
    ("redis+sentinel://a:26379,b:26379/", "names the master's service"),
    ("redis://a:6379/0?ssl_ca_certs=/etc/ca.pem", "need TLS"),
    ("rediss://a:6379/0?ssl_ca_certs=/nowhere/ca.pem", "not a readable file"),
    ("redis://a:port/0", "the port must be a number"),
    ("redis://a:6379/zero", "database number"),
    ("mysql://x", "unknown scheme"),
])
def test_a_wrong_url_is_a_config_error_saying_why(url: str, says: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(config(url), "keel.yaml")
    assert "store.url" in str(info.value) and says in str(info.value)


def test_check_config_refuses_a_multi_host_url_without_a_traceback(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(config("redis://10.0.0.1:6379,10.0.0.2:6379/0")))
    out = subprocess.run([sys.executable, "-m", "proxy", "check-config", str(bad)], capture_output=True, text=True)
    assert out.returncode == 2 and "store.url" in out.stderr and "redis+cluster://" in out.stderr
    assert "Traceback" not in out.stderr
    good = tmp_path / "good.yaml"
    good.write_text(yaml.safe_dump(config("redis+sentinel://:hunter2@s1:26379,s2:26379/keel/0",
                                          password_env="KEEL_REDIS_PASSWORD")))
    out = subprocess.run([sys.executable, "-m", "proxy", "check-config", str(good)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    printed = yaml.safe_load(out.stdout)["store"]
    assert printed["url"] == "redis+sentinel://***@s1:26379,s2:26379/keel/0" and "hunter2" not in out.stdout
    assert printed["max_connections"] == 16 and printed["password_env"] == "KEEL_REDIS_PASSWORD"


def test_masked_config_hides_every_form_of_credentials() -> None:
    for url in ("redis://user:pw@h:1/0", "redis+cluster://:pw@a:1,b:2/", "rediss+sentinel://pw@s:1/m/0"):
        assert "pw" not in masked(parse_config(config(url)))["store"]["url"]


def test_blobs_must_outlive_records_and_detail_fits_retention() -> None:
    with pytest.raises(ConfigError, match="blob_ttl_seconds must be longer"):
        parse_config(config("sqlite:///k.db", conversation_ttl_seconds=100, blob_ttl_seconds=100))
    data = config("sqlite:///k.db") | {"savings": {"retention_days": 7, "detail_days": 8}}
    with pytest.raises(ConfigError, match="detail_days must be at most retention_days"):
        parse_config(data)


def test_keel_report_on_a_store_that_does_not_answer_says_so(tmp_path: Path) -> None:
    """No traceback, on a cluster URL none of whose nodes answer, or a plain one."""
    for url in ("redis+cluster://127.0.0.1:1,127.0.0.1:2/", "redis://127.0.0.1:1/0"):
        out = subprocess.run([sys.executable, "-m", "proxy", "report", "--store", url], capture_output=True,
                             text=True, timeout=60)
        assert out.returncode == 1 and "did not answer" in out.stderr and "Traceback" not in out.stderr, out.stderr
    out = subprocess.run([sys.executable, "-m", "proxy", "report", "--store", "redis://a:1,b:2/0"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "redis+cluster://" in out.stderr and "Traceback" not in out.stderr


async def test_tls_with_a_private_ca_and_a_password(tmp_path: Path) -> None:
    """rediss:// reaches a TLS-only Redis whose certificate a private CA signed, given the CA as
    ?ssl_ca_certs= and the password from store.password_env; without the CA, or with a wrong
    password, the store is down (StoreError, ping False), never a crash."""
    from redis_servers import redis_binary, tls_server

    binary = redis_binary()
    if binary is None:
        pytest.skip("redis-server is not installed")
    server, ca = tls_server(binary, tmp_path, password="tls-secret")
    try:
        os.environ["KEEL_TEST_REDIS_PASSWORD"] = "tls-secret"
        cfg = parse_config(config(f"rediss://127.0.0.1:{server.port}/0?ssl_ca_certs={ca}",
                                  password_env="KEEL_TEST_REDIS_PASSWORD"))
        store = open_store(cfg.store)
        assert await store.ping() is True
        await store.set("k", b"over tls")
        assert await store.get("k") == b"over tls"
        await store.close()
        for wrong in (RedisStore(f"rediss://:tls-secret@127.0.0.1:{server.port}/0"),  # no CA: not trusted
                      RedisStore(f"rediss://:wrong@127.0.0.1:{server.port}/0?ssl_ca_certs={ca}")):
            assert await wrong.ping() is False
            await wrong.close()
    finally:
        os.environ.pop("KEEL_TEST_REDIS_PASSWORD", None)
        server.remove()
