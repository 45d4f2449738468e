"""One turn's figures, and how the dollars it saved split by cause.

The client's own request ("direct") is never sent, so its figures are estimates built from
what was: the upstream's usage of Keel's request (every round), the token counts of what
Keel left out, and how much of the client's request repeats its previous one.

    direct input   = Keel's first-round input + the deferred schemas' tokens - tool_search's
    direct cached  = the prefix the client's request shares with its previous request in the
                     conversation (0 when its upstream caches only at breakpoints and it set none)
    direct output  = Keel's output less what the search rounds produced (the tool_search calls)

The causes add up to direct - Keel, so the page can show where every dollar came from:

    tools        the deferred tokens at what the client would have paid for them (the tools come
                 first in a prompt, so the direct request's cached tokens cover them first)
    search       - the tool_search rounds: their input at what Keel's rounds paid, and the
                 output of the rounds before the last
    cache        the rest: cache reads Keel gained over the direct request, net of cache writes
                 (with Keel's own added text, a context update, counted here too)
    judgments    - what Keel's own model calls for the turn cost (an llm or embeddings ranker)
"""

from __future__ import annotations

from dataclasses import MISSING, asdict, dataclass, field, fields, replace

import orjson

from proxy.jsontext import JsonObject
from proxy.prices import ModelPrice
from proxy.usage import Usage

CAUSES = ("tools", "search", "cache", "judgments")
MIN_CACHEABLE = 1024  # below this no provider caches anything


@dataclass(frozen=True)
class TurnFacts:
    """What one turn came to: written once to the store, shown by the inspector."""

    at: float
    tenant: str
    conversation: str
    request_id: str
    shape: str
    model: str
    kind: str  # new | continued | regenerated | tool_results (the client sends its tools' results)
    usage: Usage  # Keel's request, every round summed
    first: Usage  # the first round alone (the direct request's counterpart)
    segment: str = ""
    stream: bool = False
    rounds: int = 0  # tool_search calls Keel answered
    offered: int = 0  # tools the client sent
    surfaced: tuple[str, ...] = ()  # shipped with the first call
    found: tuple[str, ...] = ()  # surfaced later by a search
    called: tuple[str, ...] = ()  # the client's own tools the model called
    tools_outcome: str | None = None  # ranked | ranking_fallback | no_tool_needed | not_ranked | segment
    scores: dict[str, float] = field(default_factory=dict)  # the ranker's score of each shipped tool, when known
    deferred_tokens: int = 0  # the client's tool block less Keel's first one (tool_search's listing included)
    shared_fraction: float = 0.0  # of the client's request, the part its previous request began with
    direct_cached: int = 0
    breakpoints: int = 0  # cache_control breakpoints Keel added
    prompt_cache_key: str | None = None  # the one Keel added
    context_update: str | None = None
    notes: JsonObject = field(default_factory=dict)  # why the prefix may have changed (planned misses)
    judgment_usd: float = 0.0
    direct_usd: float = 0.0
    keel_usd: float = 0.0
    causes: dict[str, float] = field(default_factory=dict)

    @property
    def direct(self) -> Usage:
        """The client's own request, estimated (see the module docstring)."""
        extra_out = self.first.output * self.rounds if self.rounds else 0
        return Usage(self.first.input + self.deferred_tokens, min(self.direct_cached, self.first.input
                                                                  + self.deferred_tokens),
                     0, max(0, self.usage.output - extra_out))

    @property
    def missed(self) -> bool:
        """A later turn of a conversation that read nothing from the cache, long enough to have."""
        return self.kind != "new" and self.usage.cached == 0 and self.usage.input >= MIN_CACHEABLE

    @property
    def first_shot(self) -> int:
        """How many of the called tools had shipped with the first call."""
        return sum(1 for name in self.called if name in self.surfaced)

    def settled(self, price: ModelPrice) -> TurnFacts:
        """The turn with its dollars, direct and through Keel, and their split by cause."""
        direct, keel = self.direct, self.usage
        direct_usd = price.cost(direct)
        keel_usd = price.cost(keel)
        deferred_cached = min(self.deferred_tokens, direct.cached)
        tools = ((self.deferred_tokens - deferred_cached) * price.input + deferred_cached * price.cached_input) / 1e6
        search = 0.0
        if self.rounds:
            later = Usage(keel.input - self.first.input, max(0, keel.cached - self.first.cached),
                          max(0, keel.cache_write - self.first.cache_write))
            search = -(price.cost(later) + (self.first.output * self.rounds) * price.output / 1e6)
        cache = direct_usd - keel_usd - tools - search
        causes = {"tools": tools, "search": search, "cache": cache, "judgments": -self.judgment_usd}
        return replace(self, direct_usd=direct_usd, keel_usd=keel_usd + self.judgment_usd,
                       causes={k: round(v, 9) for k, v in causes.items()})

    def counters(self) -> dict[str, float]:
        """This turn's share of its tenant's hourly figures."""
        direct = self.direct
        out: dict[str, float] = {
            "turns": 1, "input_direct": direct.input, "input_keel": self.usage.input,
            "cached_direct": direct.cached, "cached_keel": self.usage.cached, "cache_write": self.usage.cache_write,
            "output": self.usage.output, "usd_direct": self.direct_usd, "usd_keel": self.keel_usd,
            "tokens_tools": self.deferred_tokens, "tokens_search": self.usage.input - self.first.input,
            "rounds": self.rounds, "turns_searched": 1 if self.rounds else 0,
            "calls": len(self.called), "calls_first_shot": self.first_shot,
        }
        for cause, usd in self.causes.items():
            out[f"usd_{cause}"] = usd
        if self.tools_outcome:
            out[f"gate_{self.tools_outcome}"] = 1
        if self.missed:
            out["misses_planned" if self.notes else "misses_unexplained"] = 1
        return {k: v for k, v in out.items() if v}

    def as_dict(self) -> JsonObject:
        return asdict(self)

    def to_bytes(self) -> bytes:
        """As stored (one row per turn): no field at its default, no zero usage count, and `first`
        only when it differs from `usage` (a turn of one round); `from_bytes` restores each."""
        out: JsonObject = {}
        for name, value in asdict(self).items():
            if value == _DEFAULTS.get(name, _REQUIRED):
                continue
            if name == "first" and self.first == self.usage:
                continue
            out[name] = {k: n for k, n in value.items() if n} if name in ("usage", "first") else value
        return orjson.dumps(out)

    @classmethod
    def from_bytes(cls, raw: bytes) -> TurnFacts:
        data = orjson.loads(raw)
        names = set(cls.__dataclass_fields__)
        data = {k: v for k, v in data.items() if k in names}
        data.setdefault("first", data.get("usage", {}))
        for name in ("usage", "first"):
            data[name] = Usage(**data.get(name, {}))
        for name in ("surfaced", "found", "called"):
            data[name] = tuple(data.get(name) or ())
        return cls(**data)


_REQUIRED = object()  # a field without a default: always stored
_DEFAULTS = {f.name: f.default if f.default is not MISSING else f.default_factory() if f.default_factory is not MISSING
             else _REQUIRED for f in fields(TurnFacts)}
