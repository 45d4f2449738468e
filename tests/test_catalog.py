"""The catalog cache: one hash per request, and per-tool derived data reused across catalogs."""

from __future__ import annotations

import time

from conftest import tool

from proxy.tokens import TokenCounter
from proxy.tools.catalog import CatalogCache


class CountingTokens(TokenCounter):
    def __init__(self) -> None:
        super().__init__()
        self.counted: list[str] = []

    def count(self, text: str) -> int:
        self.counted.append(text)
        return super().count(text)


def wait_for_counts(catalog: object) -> None:
    for _ in range(200):
        if len(catalog.tokens) == len(catalog.entries):  # type: ignore[attr-defined]
            return
        time.sleep(0.01)
    raise AssertionError("token counts never arrived")


def test_same_array_is_one_lookup() -> None:
    cache = CatalogCache(TokenCounter())
    tools = [tool(f"t{i}", f"does thing {i}", x="string") for i in range(20)]
    assert cache.get(tools) is cache.get([dict(t) for t in tools])  # equal content, new objects


def test_a_changed_tool_is_the_only_one_re_derived() -> None:
    """Adding or changing one tool re-derives (and re-counts) that tool; the others are reused."""
    tokens = CountingTokens()
    cache = CatalogCache(tokens)
    tools = [tool(f"t{i}", f"does thing {i}", x="string") for i in range(20)]
    first = cache.get(tools)
    wait_for_counts(first)
    changed = [*tools[:-1], tool("t19", "does something else now", x="string"), tool("t20", "brand new")]
    second = cache.get(changed)
    wait_for_counts(second)
    assert second is not first
    assert all(a is b for a, b in zip(first.entries[:19], second.entries[:19], strict=True))
    assert second.entries[19] is not first.entries[19]
    assert len(tokens.counted) == 20 + 2  # the first catalog, then only the changed and the new tool
    assert second.index.scores("something else")[19] > 0  # the index sees the new description
    assert 19 not in first.index.scores("something else")
