"""The savings meter's token counts: a resent tools array (the same list object) is dumped and
hashed once, and counts what its text counts."""

from __future__ import annotations

import orjson
import pytest

from proxy.savings import meter
from proxy.savings.meter import TokenCache
from proxy.tokens import TokenCounter


async def test_a_list_counted_again_is_not_dumped_again(monkeypatch: pytest.MonkeyPatch) -> None:
    cache = TokenCache(TokenCounter())
    tools = [{"type": "function", "function": {"name": f"tool_{i}", "description": "does a thing " * 20}}
             for i in range(50)]
    message = {"role": "user", "content": "hello there"}
    expected = await cache.counts([orjson.dumps(tools), orjson.dumps(message)])
    dumped: list[object] = []
    real = orjson.dumps

    def dumps(value: object) -> bytes:
        dumped.append(value)
        return real(value)

    monkeypatch.setattr(meter.orjson, "dumps", dumps)
    assert await cache.counted([tools, message]) == expected
    assert await cache.counted([tools, message]) == expected
    assert dumped.count(tools) == 1 and dumped.count(message) == 2  # a message is dumped each time
    copy = orjson.loads(real(tools))  # equal, but another list: dumped again
    assert await cache.counted([copy]) == expected[:1] and dumped.count(tools) == 2
