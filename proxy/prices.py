"""Model prices: a maintained built-in table, extended and overridden by the config's `models:`.

Prices are US dollars per million tokens: `input` (uncached), `cached_input` (a cache read),
`cache_write` (a cache write: Anthropic's 5-minute write is 1.25x input; OpenAI charges none,
so it is the input price), `output`. A model is found by its exact name, else by the longest
known name it starts with (`gpt-4o-mini-2024-07-18` is `gpt-4o-mini`), after dropping a
provider prefix (`openai/…`, `anthropic/…`); anything else is priced as `default`.

Sources (checked 2025-11): https://openai.com/api/pricing/ and
https://docs.anthropic.com/en/docs/about-claude/pricing. Update the table when they change;
an operator overrides any entry in YAML without waiting for a release.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from proxy.usage import Usage


@dataclass(frozen=True)
class ModelPrice:
    input: float
    cached_input: float
    cache_write: float
    output: float

    def cost(self, usage: Usage) -> float:
        """Dollars for one usage: uncached input, cache reads, cache writes and output each at its price."""
        return (usage.uncached * self.input + usage.cached * self.cached_input
                + usage.cache_write * self.cache_write + usage.output * self.output) / 1e6


def _openai(input: float, cached: float, output: float) -> ModelPrice:
    return ModelPrice(input, cached, input, output)


def _anthropic(input: float, output: float) -> ModelPrice:
    return ModelPrice(input, round(input * 0.1, 6), round(input * 1.25, 6), output)


BUILTIN: Mapping[str, ModelPrice] = {
    # OpenAI: cached input at its listed price, no charge for writing the cache
    "gpt-5": _openai(1.25, 0.125, 10.0),
    "gpt-5-mini": _openai(0.25, 0.025, 2.0),
    "gpt-5-nano": _openai(0.05, 0.005, 0.40),
    "gpt-4.1": _openai(2.0, 0.50, 8.0),
    "gpt-4.1-mini": _openai(0.40, 0.10, 1.60),
    "gpt-4.1-nano": _openai(0.10, 0.025, 0.40),
    "gpt-4o": _openai(2.50, 1.25, 10.0),
    "gpt-4o-mini": _openai(0.15, 0.075, 0.60),
    "o1": _openai(15.0, 7.50, 60.0),
    "o3": _openai(2.0, 0.50, 8.0),
    "o3-mini": _openai(1.10, 0.55, 4.40),
    "o4-mini": _openai(1.10, 0.275, 4.40),
    "text-embedding-3-small": _openai(0.02, 0.02, 0.0),
    "text-embedding-3-large": _openai(0.13, 0.13, 0.0),
    # Anthropic: cache reads 0.1x input, 5-minute cache writes 1.25x input
    "claude-opus-4-5": _anthropic(5.0, 25.0),
    "claude-opus-4-1": _anthropic(15.0, 75.0),
    "claude-opus-4": _anthropic(15.0, 75.0),
    "claude-sonnet-4-5": _anthropic(3.0, 15.0),
    "claude-sonnet-4": _anthropic(3.0, 15.0),
    "claude-3-7-sonnet": _anthropic(3.0, 15.0),
    "claude-3-5-sonnet": _anthropic(3.0, 15.0),
    "claude-haiku-4-5": _anthropic(1.0, 5.0),
    "claude-3-5-haiku": _anthropic(0.80, 4.0),
    "claude-3-haiku": _anthropic(0.25, 1.25),
    # anything not listed (the stand-in answers any name): gpt-4o-mini's prices
    "default": _openai(0.15, 0.075, 0.60),
}


class PriceTable:
    """The built-in table with the operator's entries on top (a field left out keeps the built-in value)."""

    def __init__(self, overrides: Mapping[str, Mapping[str, float | None]] | None = None) -> None:
        table = dict(BUILTIN)
        for name, fields in (overrides or {}).items():
            base = table.get(name) or table["default"]
            values = {k: v for k, v in fields.items() if v is not None and k in ModelPrice.__dataclass_fields__}
            new = name not in BUILTIN
            if "input" in values and "cache_write" not in values and (new or base.cache_write == base.input):
                values["cache_write"] = values["input"]  # writes cost what input costs (OpenAI's rule, a new model's)
            if "input" in values and "cached_input" not in values and new:
                values["cached_input"] = values["input"]  # a new model gets no cache discount unless one is given
            table[name] = ModelPrice(**{**base.__dict__, **values})
        self.table = table
        self._names = sorted((n for n in table if n != "default"), key=len, reverse=True)

    def name_for(self, model: str | None) -> str:
        """Which entry prices `model`: its own, the longest known prefix, else 'default'."""
        if not model:
            return "default"
        name = model.split("/", 1)[1] if "/" in model else model
        if name in self.table:
            return name
        lowered = name.lower()
        return next((n for n in self._names if lowered.startswith(n.lower())), "default")

    def price(self, model: str | None) -> ModelPrice:
        return self.table[self.name_for(model)]
