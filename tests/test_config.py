"""Configuration: defaults filled at load, errors that name the key, the example file, check-config."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import KEY_DIGEST

from proxy.config import ConfigError, load_config, masked, parse_config

ROOT = Path(__file__).resolve().parents[1]


def minimal() -> dict[str, object]:
    return {"tenants": [{"id": "t", "auth": {"keys": [f"sha256:{KEY_DIGEST}"]},
                         "upstream": {"base_url": "http://up.example/v1/"}}]}


def test_defaults_filled_at_load() -> None:
    """Everything left out is filled in: server, store, timeouts, feature blocks off."""
    config = parse_config(minimal())
    assert config.server.port == 8080 and config.server.timeouts.read == 300.0
    assert config.store.url == "sqlite:///keel.db"
    t = config.tenants[0]
    assert t.upstream.base_url == "http://up.example/v1" and t.upstream.kind == "openai"
    assert not t.features_on


@pytest.mark.parametrize(
    "patch, where",
    [
        ({"server": {"port": "eighty"}}, "server.port"),
        ({"server": {"prot": 1}}, "server.prot"),
        ({"store": {"url": "mysql://x"}}, "store.url"),
        ({"tenants": [{"id": "t", "auth": {"keys": ["plain-secret"]}, "upstream": {"base_url": "http://u"}}]},
         "tenants.0.auth.keys"),
        ({"tenants": [{"id": "t", "auth": {"keys": []}, "upstream": {"base_url": "http://u"}}]}, "tenants.0"),
        ({"tenants": [{"id": "t", "auth": {"passthrough": True}, "upstream": {"base_url": "ftp://u"}}]},
         "tenants.0.upstream.base_url"),
    ],
)
def test_errors_name_the_bad_key(patch: dict[str, object], where: str) -> None:
    data = minimal() | patch
    with pytest.raises(ConfigError) as info:
        parse_config(data, "keel.yaml")
    assert where in str(info.value)


def test_duplicate_tenants_rejected() -> None:
    data = minimal()
    data["tenants"] = data["tenants"] * 2  # type: ignore[operator]
    with pytest.raises(ConfigError, match="duplicate tenant ids: t"):
        parse_config(data)


def test_example_config_loads() -> None:
    """config.example.yaml is valid and documents a tenant of each auth mode."""
    config = load_config(ROOT / "config.example.yaml")
    assert [t.id for t in config.tenants] == ["acme", "byok"]
    assert config.tenants[1].auth.passthrough and config.tenants[1].default
    assert config.tenants[0].cache.breakpoints == "off"  # written unquoted: YAML's false


def test_example_documents_every_key() -> None:
    """Every field of the schema appears in config.example.yaml."""
    text = (ROOT / "config.example.yaml").read_text()
    from proxy import config as c

    models = (c.KeelConfig, c.ServerConfig, c.StoreConfig, c.TenantConfig, c.TimeoutsConfig, c.UpstreamConfig,
              c.ToolsConfig, c.DeferConfig, c.SelectConfig, c.SearchConfig, c.ModelConfig, c.SavingsConfig, c.ContextConfig, c.CacheConfig,
              c.MemoryConfig, c.MemoryGateConfig, c.AuthConfig)
    for model in models:
        for name in model.model_fields:
            assert f"{name}:" in text, f"{model.__name__}.{name} is not documented"


def test_tenants_dir(tmp_path: Path) -> None:
    """Tenants load from a directory of one YAML file each, next to inline ones."""
    (tmp_path / "tenants").mkdir()
    (tmp_path / "tenants" / "b.yaml").write_text(yaml.safe_dump(
        {"id": "b", "auth": {"passthrough": True}, "upstream": {"base_url": "http://b/v1"}}))
    (tmp_path / "keel.yaml").write_text(yaml.safe_dump(minimal() | {"tenants_dir": "tenants"}))
    config = load_config(tmp_path / "keel.yaml")
    assert [t.id for t in config.tenants] == ["t", "b"]


def test_env_keys_read_at_load(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MY_PROXY_KEY", "secret-1")
    data = minimal()
    data["tenants"][0]["auth"]["keys"] = ["env:MY_PROXY_KEY"]  # type: ignore[index]
    assert parse_config(data).tenants[0].auth.key_digests() == (hashlib.sha256(b"secret-1").digest(),)


def test_masked_hides_secrets() -> None:
    admin_digest = hashlib.sha256(b"admin-key").hexdigest()
    data = minimal()
    data["store"] = {"url": "redis://user:pw@redis:6379/0"}
    data["tenants"][0]["upstream"]["headers"] = {"x-secret": "abc"}  # type: ignore[index]
    data["tenants"][0]["auth"]["admin_keys"] = [f"sha256:{admin_digest}", "env:ADMIN_KEY"]  # type: ignore[index]
    shown = masked(parse_config(data))
    assert KEY_DIGEST not in str(shown) and "pw@" not in str(shown) and "abc" not in str(shown)
    assert admin_digest not in str(shown)
    assert shown["tenants"][0]["auth"]["admin_keys"] == [f"sha256:{admin_digest[:4]}…", "env:ADMIN_KEY"]


def test_unquoted_off_and_on(tmp_path: Path) -> None:
    """YAML 1.1 reads unquoted off/no/on/yes as booleans; an off|auto choice takes them as "off"/"auto"."""
    tenant = f"  - id: t\n    auth:\n      keys: [sha256:{KEY_DIGEST}]\n    upstream:\n      base_url: http://u/v1\n"
    (tmp_path / "a.yaml").write_text("tenants:\n" + tenant + "    cache: {breakpoints: on, prompt_cache_key: off}\n")
    (tmp_path / "b.yaml").write_text("tenants:\n" + tenant + "    cache: {breakpoints: no, prompt_cache_key: yes}\n")
    a, b = load_config(tmp_path / "a.yaml").tenants[0].cache, load_config(tmp_path / "b.yaml").tenants[0].cache
    assert (a.breakpoints, a.prompt_cache_key) == ("auto", "off")
    assert (b.breakpoints, b.prompt_cache_key) == ("off", "auto")
    (tmp_path / "c.yaml").write_text("tenants:\n" + tenant + "    tools: {search: {listing: off}}\n")
    with pytest.raises(ConfigError, match=r"tenants\.0\.tools\.search\.listing"):  # no "off" among its choices
        load_config(tmp_path / "c.yaml")


@pytest.mark.parametrize("data", [{}, {"server": {"port": 9000}}, {"tenants": []}])
def test_no_tenant_rejected(data: dict[str, object]) -> None:
    """A config that serves no tenant would refuse every request: it is rejected at load, naming `tenants`."""
    with pytest.raises(ConfigError, match=r"tenants: .*no tenant configured"):
        parse_config(data, "keel.yaml")


def test_empty_tenants_dir_rejected(tmp_path: Path) -> None:
    (tmp_path / "tenants").mkdir()
    (tmp_path / "keel.yaml").write_text("tenants_dir: tenants\n")
    with pytest.raises(ConfigError, match=r"tenants: .*no tenant configured"):
        load_config(tmp_path / "keel.yaml")


def test_quickstart_still_builds_its_config() -> None:
    """The no-config quickstart builds its own one-tenant config, unaffected by the tenants rule."""
    from proxy.server import quickstart_config

    config = quickstart_config(None, "sqlite:///:memory:", "127.0.0.1", 8080)
    assert [t.id for t in config.tenants] == ["local"]


def test_check_config_cli(tmp_path: Path) -> None:
    """`keel check-config` prints the effective config, or the bad key and exit code 2."""
    good = tmp_path / "good.yaml"
    good.write_text(yaml.safe_dump(minimal()))
    out = subprocess.run([sys.executable, "-m", "proxy", "check-config", str(good)], capture_output=True, text=True)
    assert out.returncode == 0 and "body_limit_bytes: 16777216" in out.stdout and KEY_DIGEST not in out.stdout
    bad = tmp_path / "bad.yaml"
    bad.write_text("server:\n  port: -1\n")
    out = subprocess.run([sys.executable, "-m", "proxy", "check-config", str(bad)], capture_output=True, text=True)
    assert out.returncode == 2 and "server.port" in out.stderr


def test_deploy_configs_load(monkeypatch: pytest.MonkeyPatch) -> None:
    """The compose file's config and each Kubernetes form's ConfigMap config are valid."""
    load_config(ROOT / "deploy" / "keel.compose.yaml")
    for form in ("gateway/keel.yaml", "sidecar/keel-sidecar.yaml"):
        docs = list(yaml.safe_load_all((ROOT / "deploy" / "kubernetes" / form).read_text()))
        config_map = next(d for d in docs if d["kind"] == "ConfigMap")
        config = parse_config(yaml.safe_load(config_map["data"]["keel.yaml"]), "configmap")
        assert config.store.url.startswith("redis://keel-redis:")
        deployment = next(d for d in docs if d["kind"] == "Deployment")
        keel = next(c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "keel")
        assert keel["livenessProbe"]["httpGet"]["path"] == "/healthz"
        assert keel["readinessProbe"]["httpGet"]["path"] == "/readyz"


def test_models_table_prices_and_endpoints() -> None:
    """`models:` overrides the built-in prices field by field, adds models, and gives select and memory
    the endpoint and key of the model they name."""
    data = minimal()
    data["models"] = {"gpt-4o": {"input": 2.0}, "my-model": {"input": 1.0, "output": 2.0},
                      "judge": {"endpoint": "http://judge/v1", "api_key_env": "JUDGE_KEY"}}
    data["tenants"][0]["tools"] = {"select": {"backend": "llm", "model": "judge"}}  # type: ignore[index]
    data["tenants"][0]["memory"] = {"model": "judge", "endpoint": "http://own/v1"}  # type: ignore[index]
    config = parse_config(data)
    tenant = config.tenants[0]
    prices = tenant.prices
    assert prices.price("gpt-4o").input == 2.0 and prices.price("gpt-4o").cached_input == 1.25
    assert prices.price("gpt-4o").cache_write == 2.0  # OpenAI writes at the input price, overridden too
    assert prices.price("my-model").cached_input == 1.0 and prices.price("my-model").output == 2.0
    assert prices.name_for("gpt-4o-mini-2024-07-18") == "gpt-4o-mini"
    assert prices.name_for("anthropic/claude-sonnet-4-5-20250929") == "claude-sonnet-4-5"
    assert prices.price("claude-sonnet-4-20250514").cache_write == 3.75
    assert prices.name_for("mystery") == "default"
    assert tenant.tools.select.endpoint == "http://judge/v1" and tenant.tools.select.api_key_env == "JUDGE_KEY"
    assert tenant.memory.endpoint == "http://own/v1"  # its own wins
    usage = {"prompt_tokens": 1_000_000, "completion_tokens": 1_000_000}
    assert tenant.tools.judgment_cost("my-model", usage) == pytest.approx(3.0)


def test_renamed_pricing_key_is_explained(tmp_path: Path) -> None:
    """tools.pricing is refused with a message that says where prices went, by check-config too."""
    data = minimal()
    data["tenants"][0]["tools"] = {"pricing": {"default": {"input_per_mtok": 0.1}}}  # type: ignore[index]
    with pytest.raises(ConfigError, match=r"tenants\.0\.tools\.pricing: .*top-level `models:` table"):
        parse_config(data)
    bad = tmp_path / "old.yaml"
    bad.write_text(yaml.safe_dump(data))
    out = subprocess.run([sys.executable, "-m", "proxy", "check-config", str(bad)], capture_output=True, text=True)
    assert out.returncode == 2 and "models:" in out.stderr and "input_per_mtok is now input" in out.stderr


@pytest.mark.parametrize("block, name, where", [
    ("select", "cut_at_drop", "CUT_AT_DROP in proxy/tools/planner.py"),
    ("select", "low_confidence_below", "LOW_CONFIDENCE_BELOW in proxy/tools/planner.py"),
    ("select", "low_confidence_extra", "LOW_CONFIDENCE_EXTRA in proxy/tools/planner.py"),
    ("select", "needs_tool_threshold", "NEEDS_TOOL_THRESHOLD in proxy/tools/planner.py"),
    ("search", "listing_chars", "LISTING_CHARS in proxy/tools/search.py"),
])
def test_removed_fitted_keys_are_explained(tmp_path: Path, block: str, name: str, where: str) -> None:
    """A tuned constant that was once a tenant key is refused with a message naming the constant
    and where it lives, at load and by check-config."""
    data = minimal()
    data["tenants"][0]["tools"] = {"enabled": True, block: {name: 0.3}}  # type: ignore[index]
    with pytest.raises(ConfigError, match=rf"tenants\.0\.tools\.{block}\.{name}: tools\.{block}\.{name} was removed"):
        parse_config(data)
    bad = tmp_path / "old.yaml"
    bad.write_text(yaml.safe_dump(data))
    out = subprocess.run([sys.executable, "-m", "proxy", "check-config", str(bad)], capture_output=True, text=True)
    assert out.returncode == 2 and where in out.stderr and "delete the key" in out.stderr


def _check_config(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "proxy", "check-config", str(path)], capture_output=True, text=True,
                          timeout=30)


def test_a_config_that_is_not_utf8_is_a_clear_error(tmp_path: Path) -> None:
    """A Latin-1 config gave a traceback; it is exit 2 naming the file and the byte."""
    bad = tmp_path / "latin1.yaml"
    bad.write_bytes(yaml.safe_dump(minimal()).encode() + "# café\n".encode("latin-1"))
    out = _check_config(bad)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert str(bad) in out.stderr and "UTF-8" in out.stderr


@pytest.mark.parametrize("text, key, line", [
    ("server:\n  port: 8080\n  port: 9090\n", "port", 3),
    ("store: {url: 'sqlite:///a.db'}\nstore: {url: 'sqlite:///b.db'}\n", "store", 2),
])
def test_duplicate_yaml_keys_are_refused(tmp_path: Path, text: str, key: str, line: int) -> None:
    """YAML keeps the last of two equal keys silently (which port did the operator mean?): refused,
    naming the key, the file and the line."""
    path = tmp_path / "dup.yaml"
    path.write_text(text + yaml.safe_dump(minimal()))
    with pytest.raises(ConfigError, match=f"(?s)duplicate key '{key}'.*dup.yaml\", line {line}"):
        load_config(path)
    assert _check_config(path).returncode == 2


OTHER = "sha256:" + hashlib.sha256(b"another key").hexdigest()


@pytest.mark.parametrize("tenants, places", [
    ([{"keys": [f"sha256:{KEY_DIGEST}"]}, {"keys": [f"sha256:{KEY_DIGEST}"]}], ("tenants.a.auth.keys", "tenants.b.auth.keys")),
    ([{"keys": [OTHER], "admin_keys": [f"sha256:{KEY_DIGEST}"]}, {"user_keys": [{"key": f"sha256:{KEY_DIGEST}", "user": "u"}]}],
     ("tenants.a.auth.admin_keys", "tenants.b.auth.user_keys")),
    ([{"keys": [f"sha256:{KEY_DIGEST}", f"sha256:{KEY_DIGEST}"]}, {"keys": [OTHER]}], ("tenants.a.auth.keys",)),
    ([{"keys": ["env:KEEL_TEST_SAME"]}, {"admin_keys": ["env:KEEL_TEST_SAME_TOO"]}], ("tenants.a", "tenants.b")),
], ids=["two-tenants", "admin-and-user", "twice-in-one-list", "env-values"])
def test_one_key_in_two_places_is_refused(monkeypatch: pytest.MonkeyPatch, tenants: list[dict[str, object]],
                                          places: tuple[str, ...]) -> None:
    """The same key in two tenants (or twice in one) was accepted, the first match winning silently:
    which tenant a request meant is not Keel's to guess. Refused at load, naming both places."""
    monkeypatch.setenv("KEEL_TEST_SAME", "one secret")
    monkeypatch.setenv("KEEL_TEST_SAME_TOO", "one secret")
    data = {"tenants": [{"id": name, "auth": auth, "upstream": {"base_url": "http://u/v1"}}
                        for name, auth in zip("ab", tenants, strict=True)]}
    with pytest.raises(ConfigError, match="the same key") as info:
        parse_config(data, "keel.yaml")
    assert all(place in str(info.value) for place in places)


@pytest.mark.parametrize("command", [["standin", "--port", "99999"], ["standin", "--port", "-1"],
                                     ["serve", "--port", "70000"]])
def test_a_port_out_of_range_is_refused(command: list[str]) -> None:
    """`keel standin --port 99999` hung; a port outside 0-65535 is a usage error (exit 2) at once."""
    out = subprocess.run([sys.executable, "-m", "proxy", *command], capture_output=True, text=True, timeout=30)
    assert out.returncode == 2 and "port" in out.stderr and "65535" in out.stderr


def test_removed_system_timestamps_key_is_explained() -> None:
    """context.system_timestamps had one value and did nothing: a config that still sets it is told
    that system-prompt timestamps are always pinned, and to delete the key."""
    data = minimal()
    data["tenants"][0]["context"] = {"stable": True, "system_timestamps": "pin"}  # type: ignore[index]
    with pytest.raises(ConfigError, match=r"tenants\.0\.context\.system_timestamps: .*always pinned"):
        parse_config(data)


def test_keepalive_connections_is_for_the_httpx_client_only() -> None:
    """server.keepalive_connections caps idle connections in the httpx client; the default aiohttp
    client has no such cap, so setting the key with it is refused instead of silently ignored."""
    data = minimal()
    data["server"] = {"keepalive_connections": 8}
    with pytest.raises(ConfigError, match=r"keepalive_connections applies to upstream_client: httpx only"):
        parse_config(data)
    data["server"] = {"keepalive_connections": 8, "upstream_client": "httpx"}
    assert parse_config(data).server.keepalive_connections == 8
    assert parse_config(minimal()).server.keepalive_connections == 128, "the httpx default, filled in at load"


@pytest.mark.parametrize("timeout_ms", [2000, 5000])
def test_a_ranking_deadline_past_the_stages_is_refused(timeout_ms: int) -> None:
    """A ranker's timeout_ms at or past the planner stage's deadline (2 s) would let the stage be cut off
    before the ranking's own fallback: the ranking dropped, the turn planned per turn, silently. Refused."""
    with pytest.raises(ConfigError, match=r"tenants\.0\.tools\.select\.timeout_ms.*not shorter than a planner "
                                          r"stage's deadline \(2000 ms\)"):
        parse_config({"store": {"url": "sqlite:///:memory:"}, "tenants": [
            {"id": "t", "auth": {"passthrough": True}, "upstream": {"base_url": "http://up/v1"},
             "tools": {"enabled": True, "select": {"timeout_ms": timeout_ms}}}]}, "test")


def test_a_stage_deadline_set_where_keel_is_composed_is_checked_too() -> None:
    from proxy.app import create_app

    config = parse_config({"store": {"url": "sqlite:///:memory:"}, "tenants": [
        {"id": "t", "auth": {"passthrough": True}, "upstream": {"base_url": "http://up/v1"},
         "tools": {"enabled": True, "select": {"timeout_ms": 1999}}}]}, "test")
    with pytest.raises(ConfigError, match=r"tenant t: tools\.select\.timeout_ms: 1999 ms is not shorter"):
        create_app(config, stage_deadline=0.5)
    create_app(config)  # within the default 2 s
