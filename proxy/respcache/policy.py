"""What may be answered from the cache, and what may be kept in it.

Looked up and kept (`cache.responses`):
- `on` (the default once enabled): requests that ask for determinism, `temperature` 0 or a
  `seed`; anything sampled differs on purpose from one call to the next, so it is not served
  twice. `always`: every request that is not refused below (an evaluation run's, say).
- Never: what the shape refuses (`AnswerShape.never`: a request whose answer the provider stores,
  a chat completion with `store: true` or a Responses request with `store` true or absent, or that
  continues state held upstream, `previous_response_id`, `conversation`, or runs in the
  `background`), and a request whose body Keel cannot read.

Kept only when whole (`AnswerShape.whole`): status 200, a stream that reached its end marker,
every choice finished as a model finishes (stop, a tool call), or cut at the token limit the
request set itself. Never an error, a cut stream, a refusal or a content filter.

The client's say, by header:
- `Cache-Control: no-store`: neither looked up nor kept (bypass);
- `Cache-Control: no-cache` (or `max-age=0`): not looked up, the fresh answer kept (refresh);
- `Cache-Control: max-age=N`: a cached answer older than N seconds is not served (refresh);
- `x-keel-cache-ttl: N`: keep this answer N seconds (at most `stored.max_ttl_seconds`; 0: do not
  keep it).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from proxy.config import CacheConfig
from proxy.jsontext import Json, JsonObject

TTL_HEADER = "x-keel-cache-ttl"
_DIRECTIVE = re.compile(r"\s*([a-z-]+)\s*(?:=\s*\"?(\d+)\"?)?\s*")

State = Literal["lookup", "refresh", "bypass"]


@dataclass(frozen=True)
class Decision:
    state: State
    reason: str = ""
    ttl: float = 0.0  # how long the fresh answer is kept (0: not kept)
    max_age: float | None = None  # the oldest cached answer the client takes

    @property
    def keeps(self) -> bool:
        return self.state != "bypass" and self.ttl > 0


def directives(headers: Mapping[str, str]) -> dict[str, int | None]:
    """`Cache-Control`'s directives (lower-cased), with their number when they carry one."""
    found: dict[str, int | None] = {}
    for part in headers.get("cache-control", "").lower().split(","):
        match = _DIRECTIVE.fullmatch(part)
        if match and match.group(1):
            found[match.group(1)] = int(match.group(2)) if match.group(2) else None
    return found


def deterministic(wire: JsonObject) -> bool:
    """Does the request ask for the same answer every time: temperature 0, or a seed?"""
    temperature, seed = wire.get("temperature"), wire.get("seed")
    zero = isinstance(temperature, (int, float)) and not isinstance(temperature, bool) and temperature == 0
    return zero or (isinstance(seed, int) and not isinstance(seed, bool))


def ttl_of(headers: Mapping[str, str], config: CacheConfig) -> float:
    asked = headers.get(TTL_HEADER, "").strip()
    if asked.isdigit():
        return float(min(int(asked), config.stored.max_ttl_seconds))
    return float(config.stored.ttl_seconds)


def decide(wire: JsonObject, headers: Mapping[str, str], config: CacheConfig, never: str | None,
           mode: str | None = None) -> Decision:
    """Whether this request is looked up, refreshed or passed by; `never`: the shape's reason to
    refuse it (see `AnswerShape.never`); `mode`: `cache.responses` (on, always)."""
    said = directives(headers)
    if "no-store" in said:
        return Decision("bypass", "no-store")
    if never is not None:
        return Decision("bypass", never)
    if (mode or config.responses) != "always" and not deterministic(wire):
        return Decision("bypass", "not-deterministic")
    ttl = ttl_of(headers, config)
    if "no-cache" in said or said.get("max-age", 1) == 0:
        return Decision("refresh", "no-cache", ttl)
    max_age = said.get("max-age")
    return Decision("lookup", "", ttl, float(max_age) if max_age is not None else None)


def limit_set(wire: JsonObject, *names: str) -> bool:
    """Did the request set a token limit itself (so an answer cut there is what it asked for)?"""
    return any(isinstance(wire.get(name), int) and not isinstance(wire.get(name), bool) for name in names)


def number(value: Json) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0
