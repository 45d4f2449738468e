"""One usage shape for the three the upstreams report, normalized once.

- Chat Completions: `prompt_tokens` (all input, cached included), `prompt_tokens_details.cached_tokens`,
  `completion_tokens`; Anthropic-compatible chat endpoints may add `cache_read_input_tokens` /
  `cache_creation_input_tokens`.
- Responses: `input_tokens` (all input), `input_tokens_details.cached_tokens`, `output_tokens`.
- Messages: `input_tokens` (the *uncached* part only), `cache_read_input_tokens`,
  `cache_creation_input_tokens`, `output_tokens`.

`Usage.input` is always every input token of the request, whatever was cached or written.
"""

from __future__ import annotations

from dataclasses import dataclass

from proxy.jsontext import Json


def _int(value: Json) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


@dataclass(frozen=True)
class Usage:
    input: int = 0  # every input token, cached and written ones included
    cached: int = 0  # read from the provider's prompt cache
    cache_write: int = 0  # written to the provider's prompt cache (Anthropic bills these at a premium)
    output: int = 0

    @property
    def uncached(self) -> int:
        """Input tokens billed at the full input price."""
        return max(0, self.input - self.cached - self.cache_write)

    def __add__(self, other: Usage) -> Usage:
        return Usage(self.input + other.input, self.cached + other.cached, self.cache_write + other.cache_write,
                     self.output + other.output)

    @classmethod
    def read(cls, usage: Json, messages: bool | None = None) -> Usage | None:
        """The usage object of an answer in any of the three shapes; None when it is not one.
        `messages` (the shape's `usage` says it) settles what `input_tokens` means: Messages'
        leaves out what the cache read and wrote; without it, a usage with cache_read or
        cache_creation fields and input_tokens is read as Messages'."""
        if not isinstance(usage, dict):
            return None
        reads = _int(usage.get("cache_read_input_tokens"))
        writes = _int(usage.get("cache_creation_input_tokens"))
        if isinstance(usage.get("prompt_tokens"), int):
            details = usage.get("prompt_tokens_details")
            cached = _int(details.get("cached_tokens")) if isinstance(details, dict) else 0
            return cls(_int(usage["prompt_tokens"]), cached or reads, writes, _int(usage.get("completion_tokens")))
        if not isinstance(usage.get("input_tokens"), int):
            return None
        if messages is None:
            messages = "cache_read_input_tokens" in usage or "cache_creation_input_tokens" in usage
        output = _int(usage.get("output_tokens"))
        if messages:
            return cls(_int(usage["input_tokens"]) + reads + writes, reads, writes, output)
        details = usage.get("input_tokens_details")
        cached = _int(details.get("cached_tokens")) if isinstance(details, dict) else 0
        return cls(_int(usage["input_tokens"]), cached, 0, output)
