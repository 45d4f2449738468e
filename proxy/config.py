"""Keel's configuration: one YAML file, validated once at load, every default filled in.

The schema is the documentation: each field says what it is for. `load_config` is the only
way in; it reads the file, merges tenants from `tenants_dir`, and returns frozen models, so
code downstream never checks for a missing key.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Literal, get_args, get_origin
from urllib.parse import urlsplit
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import yaml
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator, model_validator

from proxy.jsontext import Json, JsonObject
from proxy.prices import PriceTable
from proxy.usage import Usage


class ConfigError(Exception):
    """The configuration file is missing, unreadable or invalid; the message names the key."""


# Seconds one planner stage may take (`proxy.pipeline.Pipeline.guard`): a backstop. Every budget inside
# a stage is shorter, so that its own fallback runs before the stage is cut off (`SelectConfig.timeout_ms`).
STAGE_DEADLINE = 2.0


def key_digests(keys: tuple[str, ...]) -> tuple[bytes, ...]:
    """SHA-256 digests of 'sha256:<hex>' and 'env:VAR' keys (env keys read and hashed now)."""
    digests = []
    for key in keys:
        if key.startswith("sha256:"):
            digests.append(bytes.fromhex(key.removeprefix("sha256:")))
        else:
            value = os.environ.get(key.removeprefix("env:"))
            if value:
                digests.append(hashlib.sha256(value.encode()).digest())
    return tuple(digests)


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _yaml_switches(cls, data: Json) -> Json:
        """YAML 1.1 reads an unquoted off/no (on/yes) as false (true). For a choice that offers "off",
        false means "off", and true means "auto" where "auto" is a choice and "on" is not."""
        if not isinstance(data, dict):
            return data
        fixed = dict(data)
        for name, field in cls.model_fields.items():
            value = data.get(name)
            choices = _choices(field.annotation)
            if not isinstance(value, bool) or "off" not in choices:
                continue
            if not value:
                fixed[name] = "off"
            elif "auto" in choices and "on" not in choices:
                fixed[name] = "auto"
        return fixed


def _choices(annotation: object) -> set[object]:
    """The values a Literal (or an optional Literal) allows; empty for any other type."""
    if get_origin(annotation) is Literal:
        return set(get_args(annotation))
    return {choice for arg in get_args(annotation) if get_origin(arg) is Literal for choice in get_args(arg)}


class TimeoutsConfig(_Model):
    connect: float = Field(5.0, gt=0, description="seconds to open a connection upstream")
    read: float = Field(300.0, gt=0, description="seconds to wait for each upstream read")
    write: float = Field(30.0, gt=0, description="seconds to send the request body upstream")
    pool: float = Field(10.0, gt=0, description="seconds to wait for a free pooled connection")
    client_header: float = Field(10.0, gt=0, description="seconds a client has to send a request's headers "
                                 "(slow clients are disconnected)")
    client_body: float = Field(60.0, gt=0, description="seconds a client has to send a request's body (408 after)")


class ServerConfig(_Model):
    host: str = "127.0.0.1"
    port: int = Field(8080, ge=0, le=65535)
    workers: int = Field(1, ge=1)
    body_limit_bytes: int = Field(16 * 1024 * 1024, gt=0, description="larger requests get 413")
    timeouts: TimeoutsConfig = TimeoutsConfig()
    upstream_client: Literal["aiohttp", "httpx"] = Field("aiohttp", description="HTTP client library upstream")
    max_connections: int = Field(512, ge=1, description="pooled connections per upstream")
    keepalive_connections: int = Field(128, ge=0, description="idle connections kept per upstream host, with "
                                       "upstream_client: httpx (aiohttp keeps an idle connection 30 s, within "
                                       "max_connections; it has no such cap, and the key is refused with it)")
    shutdown_grace_seconds: float = Field(30.0, ge=0, description="time in-flight streams get on SIGTERM")
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    log_bodies: bool = Field(False, description="log message bodies (debug only; never keys)")
    max_client_connections: int = Field(2048, ge=1, description="open client connections per worker; "
                                        "requests beyond get 503")
    max_connections_per_client: int = Field(0, ge=0, description="open connections one client address may hold "
                                            "per worker (beyond, 503 at once), so that one client cannot take "
                                            "them all; 0: half of max_client_connections. Behind a proxy or "
                                            "load balancer that connects from one address, set it to "
                                            "max_client_connections")
    keel_key_prefixes: tuple[str, ...] = Field(
        ("keel-", "sk-keel"), description="a bearer token with one of these prefixes is a Keel key: when it "
        "matches no tenant it gets 401, never forwarded upstream as a passthrough tenant's provider key")
    metrics_keys: tuple[str, ...] = Field((), description="'sha256:<hex>' or 'env:VAR' keys that may read "
                                          "/metrics (Bearer); empty: loopback callers only, unless metrics_open")
    metrics_open: bool = Field(False, description="without metrics_keys, serve /metrics to every address (a scraper "
                               "on a private network); off: loopback callers only")

    @field_validator("metrics_keys")
    @classmethod
    def _metrics_key_forms(cls, keys: tuple[str, ...]) -> tuple[str, ...]:
        return AuthConfig._key_forms(keys)

    @model_validator(mode="after")
    def _keepalive_is_httpx_only(self) -> ServerConfig:
        if "keepalive_connections" in self.model_fields_set and self.upstream_client != "httpx":
            raise ValueError("keepalive_connections applies to upstream_client: httpx only (aiohttp keeps an idle "
                             "connection 30 s, within max_connections); delete the key or choose httpx")
        return self

    @model_validator(mode="after")
    def _per_client_default(self) -> ServerConfig:
        if self.max_connections_per_client == 0:  # filled in at load: the effective config shows the number
            object.__setattr__(self, "max_connections_per_client", max(1, self.max_client_connections // 2))
        return self

    def metrics_digests(self) -> tuple[bytes, ...]:
        return key_digests(self.metrics_keys)


class StoreConfig(_Model):
    url: str = Field("sqlite:///keel.db", description="sqlite:///path; redis://host:6379/0 or rediss://… (one Redis "
                     "or Valkey); redis+cluster://h:p,h:p/ (a Cluster); redis+sentinel://h:p,h:p/<service>/<db>; "
                     "TLS: ?ssl_ca_certs=/path/ca.pem")
    password_env: str | None = Field(None, description="environment variable holding the Redis password (over the "
                                     "URL's, which then needs none)")
    sentinel_password_env: str | None = Field(None, description="environment variable holding the sentinels' own "
                                              "password, when they require one")
    max_connections: int = Field(16, ge=1, description="Redis calls one worker process has in flight at once, so "
                                 "connections it holds per Redis server")
    conversation_ttl_seconds: int = Field(30 * 24 * 3600, gt=0, description="TTL of turn records, anchors, proofs, "
                                          "response ids and frozen tool blocks (renewed as a conversation goes on)")
    blob_ttl_seconds: int = Field(60 * 24 * 3600, gt=0, description="TTL of content conversations share (system "
                                  "prompts, sections): longer than conversation_ttl_seconds, so it outlives them")
    job_marker_ttl_seconds: int = Field(30 * 24 * 3600, gt=0, description="how long a judged message stays marked, "
                                        "so a regeneration of it queues no second memory job")
    dead_letter_ttl_seconds: int = Field(14 * 24 * 3600, gt=0, description="how long a buried memory job is kept "
                                         "(GET /v1/keel/memory/dead)")
    dead_letters_max: int = Field(10_000, ge=1, description="buried memory jobs kept at most (the oldest go first)")
    job_lease_seconds: float = Field(30.0, gt=0, description="a worker's hold on a user's memory queue, renewed "
                                     "while it works; a replica that dies loses it after this")
    budget_ms: int = Field(250, ge=1, description="time one store call may take on the request path; slower "
                           "calls fail open, and after 3 failures in a row the store is bypassed (passthrough) "
                           "until a probe succeeds")
    spool_dir: str | None = Field(None, description="where memory jobs the store would not take wait on disk until "
                                  "it does; default: keel-spool beside the SQLite file, else in the working directory")

    @field_validator("url")
    @classmethod
    def _known_scheme(cls, url: str) -> str:
        if url.startswith("sqlite://"):
            return url
        from proxy.stores.redis_url import parse_redis_url

        parse_redis_url(url)  # ValueError: what is wrong with it
        return url

    @model_validator(mode="after")
    def _blobs_outlive_records(self) -> StoreConfig:
        if self.blob_ttl_seconds <= self.conversation_ttl_seconds:
            raise ValueError("blob_ttl_seconds must be longer than conversation_ttl_seconds: a record refers to "
                             "shared content, which must outlive it")
        return self

    def passwords(self) -> tuple[str | None, str | None]:
        """The Redis password and the sentinels', from the environment (None: the URL's, or none)."""
        return (os.environ.get(self.password_env) if self.password_env else None,
                os.environ.get(self.sentinel_password_env) if self.sentinel_password_env else None)


class UserKeyConfig(_Model):
    key: str = Field(description="'sha256:<hex>' or 'env:VAR'")
    user: str = Field(min_length=1, description="the one end user this key acts as")

    @field_validator("key")
    @classmethod
    def _key_form(cls, key: str) -> str:
        AuthConfig._key_forms((key,))
        return key


class AuthConfig(_Model):
    keys: tuple[str, ...] = Field((), description="'sha256:<hex>' or 'env:VAR' entries")
    user_keys: tuple[UserKeyConfig, ...] = Field((), description="keys bound to one end user each: they act only "
                                                  "as that user, on chat and on the memory API")
    admin_keys: tuple[str, ...] = Field((), description="keys that may also manage any user's memory in the tenant")
    passthrough: bool = Field(False, description="forward the client's own Authorization upstream")

    @field_validator("keys", "admin_keys")
    @classmethod
    def _key_forms(cls, keys: tuple[str, ...]) -> tuple[str, ...]:
        for key in keys:
            if key.startswith("sha256:"):
                digest = key.removeprefix("sha256:")
                if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest.lower()):
                    raise ValueError(f"{key[:12]}…: sha256 keys need 64 hex digits")
            elif not key.startswith("env:") or len(key) == 4:
                raise ValueError("each key must be 'sha256:<hex>' or 'env:VAR' (never the key itself)")
        return keys

    def key_digests(self, admin: bool = False) -> tuple[bytes, ...]:
        """SHA-256 digests of every accepted key; env keys are read and hashed at load time."""
        return key_digests(self.admin_keys if admin else self.keys)


UpstreamKind = Literal["openai", "openrouter", "anthropic-compatible", "standin"]


class UpstreamConfig(_Model):
    base_url: str = Field(description="e.g. https://api.openai.com/v1 (the part before /chat/completions)")
    api_key_env: str | None = Field(None, description="environment variable holding the provider key")
    kind: UpstreamKind = "openai"
    headers: dict[str, str] = Field(default_factory=dict, description="extra headers sent upstream")
    native_tool_search: bool | None = Field(
        None, description="the upstream answers clients' own tool search (defer_loading tools and a tool_search "
        "tool) itself; null: yes for api.anthropic.com on /v1/messages and api.openai.com on /v1/responses")

    @field_validator("base_url")
    @classmethod
    def _strip_slash(cls, url: str) -> str:
        if not url.startswith(("http://", "https://")):
            raise ValueError("must be an http:// or https:// URL")
        return url.rstrip("/")

    def api_key(self) -> str | None:
        return os.environ.get(self.api_key_env) if self.api_key_env else None

    def searches_natively(self, native_host: str | None) -> bool:
        """Does this upstream run a client's deferred-tool search itself? Said by
        `native_tool_search`, else by the host: the provider whose shape this is
        (`Shape.native_search_host`) does."""
        if self.native_tool_search is not None:
            return self.native_tool_search
        return native_host is not None and urlsplit(self.base_url).hostname == native_host


class DeferConfig(_Model):
    enabled: bool = True
    min_tools: int = Field(12, ge=0, description="requests with fewer tools are left alone")
    schema_chars: int = Field(160, ge=0, description="a tool whose schema JSON is shorter stays loaded")
    always: tuple[str, ...] = Field((), description="names or globs always surfaced")


# the local ranker's model: the published int8 ONNX exports and tokenizer of all-MiniLM-L6-v2
DEFAULT_MODEL_SOURCE = "https://huggingface.co/sentence-transformers/all-MiniLM-L6-v2/resolve/main"
DEFAULT_NEEDS_TOOL_QUESTION = "Does answering the user's newest message need any of these tools?"


class SelectConfig(_Model):
    enabled: bool = True
    backend: Literal["lexical", "local", "embeddings", "llm"] = Field(
        "lexical", description="lexical: BM25, embedded; local: an ONNX sentence-embedding model fused with BM25; "
        "embeddings: an OpenAI-compatible /v1/embeddings endpoint fused with BM25; llm: a chat model picks among "
        "numbered candidates")
    model_dir: str | None = Field(None, description="the local backend's model directory (model.onnx, "
                                  "tokenizer.json); default: keel/all-MiniLM-L6-v2 under the user's cache directory")
    model_source: str | None = Field(
        DEFAULT_MODEL_SOURCE, description="local backend: where model.onnx (the published int8 ONNX export) and tokenizer.json are "
        "fetched from when model_dir lacks them, once, in the background; null: never fetch")
    endpoint: str | None = Field(None, description="embeddings/llm backend: base URL; default: the tenant's upstream")
    model: str | None = Field(None, description="embeddings/llm backend: the model (default text-embedding-3-small "
                              "for embeddings, gpt-4o-mini for llm)")
    api_key_env: str | None = Field(None, description="embeddings/llm backend: its key; default: the upstream key")
    shortlist: int = Field(5, ge=0, description="tools surfaced from the ranking")
    max_catalog_tools: int = Field(100, ge=1, description="option ceiling per LLM ranking request")
    timeout_ms: int = Field(250, ge=1, description="deadline for one judgment; shorter than a planner stage's "
                            f"({STAGE_DEADLINE * 1000:.0f} ms)")
    learn: bool = Field(True, description="remember the words of turns whose tool the model found by search; "
                        "a request worded like them ships the tool beside the ranker's picks (per tenant, in the store)")
    question: str = Field(DEFAULT_NEEDS_TOOL_QUESTION, description="the yes/no needs-tool question")

    @field_validator("timeout_ms")
    @classmethod
    def _within_the_stage(cls, value: int) -> int:
        within_stage(value)
        return value


def within_stage(timeout_ms: int, deadline: float = STAGE_DEADLINE) -> None:
    """A ranking's deadline must end before its planner stage's: a stage cut off first throws the
    ranking away with its fallback, and the turn is planned per turn from the request alone (no
    frozen tool block, no ranking backend) every time the backend is slow, without a word."""
    if timeout_ms >= deadline * 1000:
        raise ValueError(f"{timeout_ms} ms is not shorter than a planner stage's deadline ({deadline * 1000:.0f} ms): "
                         "a ranking still running when the stage is cut off is dropped with its fallback, and the "
                         "turn planned per turn, lexically, without the tenant's tool block; set it lower")


def check_stage_deadline(config: KeelConfig, deadline: float) -> None:
    """Every tenant's ranking ends before a stage deadline set where Keel is composed."""
    for tenant in config.tenants:
        try:
            within_stage(tenant.tools.select.timeout_ms, deadline)
        except ValueError as exc:
            raise ConfigError(f"tenant {tenant.id}: tools.select.timeout_ms: {exc}") from None


class SearchConfig(_Model):
    max_results: int = Field(5, ge=1, description="tools one tool_search call returns")
    max_rounds: int = Field(3, ge=0, description="tool_search rounds Keel answers inside one client turn")
    listing: Literal["names", "auto", "groups"] = Field(
        "names", description="names: tool_search lists every deferred name (invariant 3); groups: only name "
        "families with counts; auto: names, folding the families that save most into counts until the listing "
        "fits about 200 tokens (a folded tool is found by search, no longer named)")


class ToolsConfig(_Model):
    """Tool deferral and preselection: ship the few schemas a turn needs, search for the rest."""

    enabled: bool = False
    defer: DeferConfig = DeferConfig()
    select: SelectConfig = SelectConfig()
    search: SearchConfig = SearchConfig()
    stability: Literal["per_turn", "segment", "dispatch", "auto"] = Field(
        "auto", description="per_turn: chosen fresh each turn; segment: the block chosen at the segment's "
        "start stays, tools needed later are appended once; dispatch: the block never changes, later tools are "
        "called through call_tool; auto: dispatch, re-choosing the block when a fresh one is expected to cost "
        "less than reading the cached one (cache.read_price)")
    _prices: PriceTable = PrivateAttr(default_factory=PriceTable)  # the config's models table, set at load

    def judgment_cost(self, model: str | None, usage: Json) -> float | None:
        """What a judgment's (or the memory model's) usage cost, priced from the `models` table
        (the model's entry, else 'default'); None when there is no usage."""
        read = Usage.read(usage)
        return None if read is None else self._prices.price(model).cost(read)


class ContextConfig(_Model):
    """Frozen system prompt per segment; changes delivered as <context_update> blocks."""

    stable: bool = False
    timezone: str = Field("UTC", description="IANA zone for the local date (a request may send X-Keel-Timezone)")
    date: bool = Field(True, description="tell the local date on the first turn that speaks of time; announce a new date once")
    message_timestamps: bool = Field(False, description="add the send time to each new user message's update")

    @field_validator("timezone")
    @classmethod
    def _known_zone(cls, zone: str) -> str:
        try:
            ZoneInfo(zone)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(f"unknown timezone {zone!r}") from None
        return zone


DEFAULT_MEMORY_INSTRUCTIONS = (
    "You maintain a small memory about the user. Store only what the user explicitly asks you to remember, "
    "update what they ask you to change, and delete what they ask you to forget. Use set_memory and "
    "delete_memory; call nothing when the user asked for none of this."
)
DEFAULT_MEMORY_QUESTION = "Does the user's newest message ask to remember, update or forget something about them?"


class MemoryGateConfig(_Model):
    enabled: bool = True
    backend: Literal["lexical", "llm"] = Field(
        "lexical", description="lexical: embedded, multilingual, no network; llm: the memory model's endpoint, "
        "P(yes) from logprobs")
    threshold: float = Field(0.5, ge=0, le=1, description="below it the memory model does not run")
    question: str = Field(DEFAULT_MEMORY_QUESTION, description="the yes/no question (for model-backed gates)")
    context_messages: int = Field(3, ge=0, description="earlier messages sent with the newest one, as context")
    timeout_ms: int = Field(2000, ge=1, description="deadline for one gate judgment; on timeout the model runs")
    audit_rate: float = Field(0.02, ge=0, le=1, description="share of turns the gate skipped on which the memory "
                              "model runs anyway, to count (and keep) what the gate missed: "
                              "keel_memory_gate_audit_total")


class MemoryJobsConfig(_Model):
    max_attempts: int = Field(8, ge=1, description="runs of one job before it is buried as a dead letter")
    backoff_seconds: float = Field(1.0, gt=0, description="wait after the first failure, doubled after each")
    max_backoff_seconds: float = Field(60.0, gt=0, description="the longest wait between two runs")
    timeout_seconds: float = Field(120.0, gt=0, description="the longest one run of a job may take (gate, memory "
                                   "model, writes); past it the run has failed and is retried like any failure")


class MemoryConfig(_Model):
    """Per-user memory with a classifier gate in front of the memory model."""

    enabled: bool = False
    model: str = Field("gpt-4o-mini", description="the memory model")
    endpoint: str | None = Field(None, description="its base URL; default: the tenant's upstream")
    api_key_env: str | None = Field(None, description="its key; default: the tenant's upstream key")
    instructions: str = Field(DEFAULT_MEMORY_INSTRUCTIONS, description="the memory model's instructions")
    valid_keys: tuple[str, ...] = Field((), description="optional categories the memory keys must use")
    token_limit: int = Field(2000, ge=1, description="memory shown to the model (anchor and memory model) at most, "
                             "estimated; the newest entries first")
    max_entry_chars: int = Field(2000, ge=1, description="one entry's value at most (413 from the API; refused and "
                                 "audited from the memory model)")
    max_entries: int = Field(200, ge=1, description="entries per user at most")
    max_total_chars: int = Field(40000, ge=1, description="characters per user at most, keys and values")
    keyless: bool = Field(False, description="a passthrough tenant's callers that send no credential at all (a "
                          "keyless upstream) get memory, shared by the user name they claim; off: none for them")
    gate: MemoryGateConfig = MemoryGateConfig()
    jobs: MemoryJobsConfig = MemoryJobsConfig()


class StoredAnswersConfig(_Model):
    """Bounds and scope of the answers Keel keeps itself (`cache.responses`, `cache.embeddings`)."""

    ttl_seconds: int = Field(86400, ge=1, description="how long an answer is served from the cache")
    max_ttl_seconds: int = Field(7 * 86400, ge=1, description="the longest a request's x-keel-cache-ttl may ask")
    scope: Literal["caller", "tenant"] = Field(
        "caller", description="caller: an answer is served only to the credential, end user and conversation id "
        "that asked for it; tenant: to any caller of the tenant sending the same request (shared, non-personal "
        "traffic)")
    max_bytes: int = Field(256 * 1024 * 1024, ge=1024, description="bytes kept per tenant (both caches); the "
                           "oldest entries go first")
    max_entry_bytes: int = Field(4 * 1024 * 1024, ge=1, description="an answer larger than this is not kept")


class CacheConfig(_Model):
    """Provider prompt-cache hints, and the answers Keel caches itself (`responses`, `embeddings`)."""

    breakpoints: Literal["off", "auto"] = Field("off", description="place cache_control where the upstream takes it")
    ttl: Literal["5m", "1h"] | None = Field(None, description="cache_control ttl where the upstream offers a choice")
    prompt_cache_key: Literal["off", "auto"] = Field(
        "off", description="auto: derive one per conversation segment for OpenAI-kind upstreams when none is sent")
    min_tokens: int = Field(1024, ge=0, description="no breakpoint on a prefix shorter than this (estimated)")
    read_price: float = Field(0.1, ge=0, le=1, description="a cache read's price as a fraction of an input token's "
                              "(tools.stability auto weighs it)")
    responses: Literal["off", "on", "always"] = Field(
        "off", description="answer a repeated request from Keel's own cache (chat, responses, messages; JSON and "
        "SSE): on: requests that ask for determinism (temperature 0, or a seed); always: every cacheable request")
    embeddings: Literal["off", "on"] = Field("off", description="answer /v1/embeddings per input item from Keel's "
                                             "own cache; only the items not cached go upstream")
    stored: StoredAnswersConfig = StoredAnswersConfig()

    @field_validator("responses", "embeddings", mode="before")
    @classmethod
    def _switch_on(cls, value: Json) -> Json:
        return "on" if value is True else value  # YAML reads an unquoted `on` as true


class ModelConfig(_Model):
    """A model Keel calls or prices, by name: where it is served and what it costs ($ per million tokens).

    Names match the `model` a request sends (or its longest listed prefix). A built-in table
    (proxy/prices.py) prices common OpenAI and Anthropic models; an entry here overrides the
    fields it gives and adds models the table lacks."""

    endpoint: str | None = Field(None, description="base URL when Keel calls this model itself (a judge, embeddings, "
                                 "the memory model); default: the tenant's upstream")
    api_key_env: str | None = Field(None, description="environment variable holding its key; default: the upstream's")
    input: float | None = Field(None, ge=0, description="$ per million uncached input tokens")
    cached_input: float | None = Field(None, ge=0, description="$ per million input tokens read from the cache")
    cache_write: float | None = Field(None, ge=0, description="$ per million input tokens written to the cache")
    output: float | None = Field(None, ge=0, description="$ per million output tokens")


class SavingsConfig(_Model):
    """Per-turn savings figures, written to the store once per turn (the /keel/ page, `keel report`)."""

    enabled: bool = Field(True, description="record what each turn cost through Keel and would have cost direct")
    retention_days: int = Field(30, ge=1, description="hourly figures, conversation totals and the daily top lists "
                                "are kept this long")
    detail_days: int = Field(7, ge=1, description="each conversation's turns (the inspector's detail) are kept this "
                             "long after its last turn; at most retention_days")
    conversation_turns: int = Field(200, ge=1, description="turns kept per conversation for the inspector (the first)")

    @model_validator(mode="after")
    def _detail_within_retention(self) -> SavingsConfig:
        if self.detail_days > self.retention_days:
            raise ValueError("detail_days must be at most retention_days")
        return self


class TenantConfig(_Model):
    id: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")
    default: bool = Field(False, description="serve passthrough requests that name no tenant")
    auth: AuthConfig = AuthConfig()
    upstream: UpstreamConfig
    tools: ToolsConfig = ToolsConfig()
    context: ContextConfig = ContextConfig()
    memory: MemoryConfig = MemoryConfig()
    cache: CacheConfig = CacheConfig()
    _prices: PriceTable = PrivateAttr(default_factory=PriceTable)  # the config's models table, set at load

    @property
    def prices(self) -> PriceTable:
        return self._prices

    @model_validator(mode="after")
    def _has_auth(self) -> TenantConfig:
        if not self.auth.keys and not self.auth.admin_keys and not self.auth.user_keys and not self.auth.passthrough:
            raise ValueError("auth needs keys or passthrough: true")
        return self

    @property
    def features_on(self) -> bool:
        cache = self.cache.breakpoints != "off" or self.cache.prompt_cache_key != "off"
        return self.tools.enabled or self.context.stable or self.memory.enabled or cache

    def model_endpoint(self, endpoint: str | None, api_key_env: str | None) -> tuple[str, str | None]:
        """Base URL and key of a model Keel calls itself (a judge, embeddings, the memory model):
        its own when configured, else this tenant's upstream's."""
        key = os.environ.get(api_key_env) if api_key_env else self.upstream.api_key()
        return (endpoint or self.upstream.base_url).rstrip("/"), key


class KeelConfig(_Model):
    server: ServerConfig = ServerConfig()
    store: StoreConfig = StoreConfig()
    models: dict[str, ModelConfig] = Field(default_factory=dict, description="models by name: endpoint, key, prices "
                                           "(extends and overrides the built-in price table)")
    savings: SavingsConfig = SavingsConfig()
    tenants: tuple[TenantConfig, ...] = ()
    tenants_dir: str | None = Field(None, description="directory of one YAML file per tenant")
    _prices: PriceTable = PrivateAttr(default_factory=PriceTable)

    @property
    def prices(self) -> PriceTable:
        return self._prices

    @model_validator(mode="before")
    @classmethod
    def _model_endpoints(cls, data: Json) -> Json:
        """`tools.select` and `memory` name a model; where they give no endpoint or key of their
        own, the models table's entry for it supplies them."""
        if not isinstance(data, dict) or not isinstance(data.get("models"), dict):
            return data
        models, tenants = data["models"], []
        for tenant in data.get("tenants") or []:
            if isinstance(tenant, dict):
                tenant = dict(tenant)
                tools = tenant.get("tools") if isinstance(tenant.get("tools"), dict) else None
                select = tools.get("select") if tools and isinstance(tools.get("select"), dict) else None
                if tools is not None and select is not None:
                    backend = select.get("backend")
                    name = select.get("model") or ("text-embedding-3-small" if backend == "embeddings" else "gpt-4o-mini")
                    tenant["tools"] = {**tools, "select": _with_endpoint(select, models.get(name))}
                memory = tenant.get("memory")
                if isinstance(memory, dict):
                    tenant["memory"] = _with_endpoint(memory, models.get(memory.get("model") or "gpt-4o-mini"))
            tenants.append(tenant)
        return {**data, "tenants": tenants}

    @model_validator(mode="after")
    def _price_table(self) -> KeelConfig:
        table = PriceTable({name: m.model_dump(include={"input", "cached_input", "cache_write", "output"})
                            for name, m in self.models.items()})
        self._prices = table
        for tenant in self.tenants:
            tenant._prices = table
            tenant.tools._prices = table
        return self

    @field_validator("tenants")
    @classmethod
    def _some_tenant(cls, tenants: tuple[TenantConfig, ...]) -> tuple[TenantConfig, ...]:
        if not tenants:  # every request would be refused: say so at load, not with a 401 later
            raise ValueError("no tenant configured: add one here, or a tenants_dir with one YAML file per tenant")
        return tenants

    @model_validator(mode="after")
    def _tenants_unique(self) -> KeelConfig:
        ids = [t.id for t in self.tenants]
        duplicates = sorted({i for i in ids if ids.count(i) > 1})
        if duplicates:
            raise ValueError(f"duplicate tenant ids: {', '.join(duplicates)}")
        if sum(t.default for t in self.tenants) > 1:
            raise ValueError("at most one tenant may be default: true")
        return self

    @model_validator(mode="after")
    def _keys_unique(self) -> KeelConfig:
        """One key, one place: the same key in two tenants (or twice in one) would be served by whichever
        matched first, silently; which tenant a request meant is not Keel's to guess."""
        places: dict[bytes, list[str]] = {}
        for t in self.tenants:
            slots = [("keys", t.auth.keys), ("admin_keys", t.auth.admin_keys),
                     ("user_keys", tuple(u.key for u in t.auth.user_keys))]
            for slot, keys in slots:
                for digest in key_digests(keys):
                    places.setdefault(digest, []).append(f"tenants.{t.id}.auth.{slot}")
        twice = [where for where in places.values() if len(where) > 1]
        if twice:
            raise ValueError("the same key is configured in " + "; ".join(" and ".join(w) for w in twice)
                             + ": give each tenant, admin and user its own key")
        return self


def _with_endpoint(block: JsonObject, model: Json) -> JsonObject:
    if not isinstance(model, dict):
        return block
    filled = {k: model[k] for k in ("endpoint", "api_key_env") if model.get(k) and block.get(k) is None}
    return {**block, **filled}


# Keys that moved or were removed: where they went, said at load (and by `keel check-config`) instead of
# pydantic's "extra inputs are not permitted".
_FITTED = ("was removed: it is a fitted constant now, tuned with the rankers, not a setting ({where}); "
           "delete the key (select.shortlist is how many tools a tenant wants)")
MOVED = {
    ("tools", "select", "cut_at_drop"): "tools.select.cut_at_drop "
    + _FITTED.format(where="CUT_AT_DROP in proxy/tools/planner.py"),
    ("tools", "select", "low_confidence_below"): "tools.select.low_confidence_below "
    + _FITTED.format(where="LOW_CONFIDENCE_BELOW in proxy/tools/planner.py"),
    ("tools", "select", "low_confidence_extra"): "tools.select.low_confidence_extra "
    + _FITTED.format(where="LOW_CONFIDENCE_EXTRA in proxy/tools/planner.py"),
    ("tools", "select", "needs_tool_threshold"): "tools.select.needs_tool_threshold "
    + _FITTED.format(where="NEEDS_TOOL_THRESHOLD in proxy/tools/planner.py"),
    ("tools", "search", "listing_chars"): "tools.search.listing_chars was removed: it is a fixed budget now "
    "(LISTING_CHARS in proxy/tools/search.py, about 200 tokens); delete the key",
    ("context", "system_timestamps"): "context.system_timestamps was removed: it had one value (pin), and "
    "timestamps in the system prompt are always pinned to the segment start (a changed time alone is no "
    "change); delete the key",
    ("tools", "pricing"): "tools.pricing was replaced by the top-level `models:` table: prices per million tokens "
    "by model name (input, cached_input, cache_write, output), e.g. `models: {gpt-4o-mini: {input: 0.15, "
    "output: 0.6}}` (input_per_mtok is now input, output_per_mtok output); common OpenAI and Anthropic models are "
    "priced built in",
}


def _moved_keys(tenants: list[Json], source: str) -> None:
    for n, tenant in enumerate(tenants):
        for path, why in MOVED.items():
            block: Json = tenant
            for part in path[:-1]:
                block = block.get(part) if isinstance(block, dict) else None
            if isinstance(block, dict) and path[-1] in block:
                raise ConfigError(f"{source}: invalid configuration\n  tenants.{n}.{'.'.join(path)}: {why}")


def _format_errors(err: ValidationError, source: str) -> str:
    lines = [f"{source}: invalid configuration"]
    for e in err.errors():
        where = ".".join(str(p) for p in e["loc"]) or "(top level)"
        lines.append(f"  {where}: {e['msg']}")
    return "\n".join(lines)


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a mapping that names one key twice (YAML keeps the last one
    silently: which port did the operator mean?)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Json, Json]:
        seen: set[Json] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<:` merges: their keys may be overridden
                continue
            name = self.construct_object(key_node, deep=deep)
            if isinstance(name, (str, int, float, bool)) and name in seen:
                raise yaml.constructor.ConstructorError("while reading a mapping", node.start_mark,
                                                        f"found duplicate key {name!r}", key_node.start_mark)
            seen.add(name)
        return super().construct_mapping(node, deep)


def _read_yaml(path: Path) -> Json:
    try:
        loader = _UniqueKeyLoader(path.read_bytes().decode("utf-8"))
        loader.name = str(path)  # marks say where: the file, its line and column
        try:
            return loader.get_single_data() or {}
        finally:
            loader.dispose()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read ({exc.strerror})") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (byte {exc.object[exc.start]:#04x} at offset {exc.start}); "
                          "save the file as UTF-8") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from exc


def parse_config(data: Json, source: str = "config", base_dir: Path | None = None) -> KeelConfig:
    """Validate a parsed YAML document (and its tenants_dir) into a `KeelConfig`."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: the top level must be a mapping")
    data = dict(data)
    tenants = list(data.get("tenants") or [])
    tenants_dir = data.get("tenants_dir")
    if tenants_dir:
        directory = Path(tenants_dir)
        if not directory.is_absolute() and base_dir is not None:
            directory = base_dir / directory
        if not directory.is_dir():
            raise ConfigError(f"{source}: tenants_dir: {directory} is not a directory")
        for file in sorted(directory.glob("*.y*ml")):
            tenant = _read_yaml(file)
            if not isinstance(tenant, dict):
                raise ConfigError(f"{file}: a tenant file must be a mapping")
            tenants.append(tenant)
    data["tenants"] = tenants
    _moved_keys(tenants, source)
    try:
        return KeelConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError(_format_errors(err, source)) from None


def load_config(path: str | Path) -> KeelConfig:
    path = Path(path)
    return parse_config(_read_yaml(path), str(path), path.parent)


def masked(config: KeelConfig) -> JsonObject:
    """The effective config as plain data with secrets masked (for `keel check-config`)."""
    data = config.model_dump(mode="json")
    for tenant in data["tenants"]:
        for keys in ("keys", "admin_keys"):
            tenant["auth"][keys] = [k if k.startswith("env:") else k[:11] + "…" for k in tenant["auth"][keys]]
        tenant["upstream"]["headers"] = {k: "***" for k in tenant["upstream"]["headers"]}
    from proxy.stores.redis_url import masked_url

    data["store"]["url"] = masked_url(data["store"]["url"])
    return data
