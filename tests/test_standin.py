"""The stand-in provider: OpenAI and Anthropic prefix-cache rules, tool reports, streaming shape."""

from __future__ import annotations

from typing import Any

import httpx
import orjson
import pytest
from conftest import ServerThread, large_catalog

from proxy.standin.caching import PrefixCache, TooManyBreakpointsError, prompt_blocks
from proxy.tokens import TokenCounter


def catalog_tools(n: int) -> list[dict[str, Any]]:
    return large_catalog()[:n]


def body(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"model": "m", "messages": messages, **({"tools": tools} if tools else {})}


def test_openai_rules_cache_whole_blocks_over_1024(token_counter: TokenCounter) -> None:
    """A repeated long prefix is read in whole 128-token blocks; short prompts never cache."""
    cache = PrefixCache(token_counter)
    tools = catalog_tools(30)
    first = cache.openai(prompt_blocks(body([{"role": "user", "content": "hi"}], tools)))
    assert first.cached_tokens == 0 and first.prompt_tokens > 2000
    second = cache.openai(prompt_blocks(body([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"},
                                              {"role": "user", "content": "more"}], tools)))
    assert second.cached_tokens % 128 == 0 and second.cached_tokens >= 1024
    assert first.prompt_tokens - 128 < second.cached_tokens <= first.prompt_tokens
    short = PrefixCache(token_counter)
    for _ in range(2):
        usage = short.openai(prompt_blocks(body([{"role": "user", "content": "tiny"}])))
    assert usage.cached_tokens == 0


def test_openai_rules_miss_when_front_changes(token_counter: TokenCounter) -> None:
    """A changed first message (a clock line) throws the whole cache away."""
    cache = PrefixCache(token_counter)
    tools = catalog_tools(30)
    cache.openai(prompt_blocks(body([{"role": "system", "content": "time 12:00:01"}], tools)))
    # the tools come first, so they still hit: the change sits after them
    hit = cache.openai(prompt_blocks(body([{"role": "system", "content": "time 12:00:02"}], tools)))
    assert hit.cached_tokens > 0
    cache2 = PrefixCache(token_counter)
    long = "context " * 1500
    cache2.openai(prompt_blocks(body([{"role": "system", "content": "time 12:00:01\n" + long}])))
    miss = cache2.openai(prompt_blocks(body([{"role": "system", "content": "time 12:00:02\n" + long}])))
    assert miss.cached_tokens == 0


def _marked(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text, "cache_control": {"type": "ephemeral"}}


def test_anthropic_rules_write_then_read(token_counter: TokenCounter) -> None:
    """A breakpoint writes its prefix; the next request reads it and writes the new tail."""
    cache = PrefixCache(token_counter)
    system = {"role": "system", "content": [_marked("rules " * 1200)]}
    first = cache.anthropic(prompt_blocks(body([system, {"role": "user", "content": [_marked("q1")]}])))
    assert first.cached_tokens == 0 and first.cache_write_tokens == first.prompt_tokens
    second = cache.anthropic(prompt_blocks(body([system, {"role": "user", "content": "q1"},
                                                 {"role": "assistant", "content": "a1"},
                                                 {"role": "user", "content": [_marked("q2")]}])))
    assert second.cached_tokens == first.prompt_tokens
    assert second.cache_write_tokens == second.prompt_tokens - first.prompt_tokens


def test_anthropic_minimum_length(token_counter: TokenCounter) -> None:
    cache = PrefixCache(token_counter)
    for _ in range(2):
        usage = cache.anthropic(prompt_blocks(body([{"role": "user", "content": [_marked("short")]}])))
    assert usage.cached_tokens == 0 and usage.cache_write_tokens == 0


def test_anthropic_lookback_is_20_blocks(token_counter: TokenCounter) -> None:
    """A breakpoint finds an earlier cached prefix only within 20 blocks before it."""
    rules = {"type": "text", "text": "rules " * 1200}

    def conversation(extra_blocks: int) -> list[dict[str, Any]]:
        tail = [{"role": "user", "content": f"m{i}"} for i in range(extra_blocks - 1)]
        return [{"role": "system", "content": [rules]}, *tail,
                {"role": "user", "content": [_marked(f"m{extra_blocks - 1}")]}]

    for extra, expect_hit in ((20, True), (21, False)):
        cache = PrefixCache(token_counter)
        written = cache.anthropic(prompt_blocks(body([{"role": "system", "content": [{**rules, "cache_control": {"type": "ephemeral"}}]}])))
        assert written.cache_write_tokens > 0
        usage = cache.anthropic(prompt_blocks(body(conversation(extra))))
        assert (usage.cached_tokens == written.prompt_tokens) is expect_hit, extra


def test_anthropic_at_most_four_breakpoints(token_counter: TokenCounter) -> None:
    cache = PrefixCache(token_counter)
    with pytest.raises(TooManyBreakpointsError):
        cache.anthropic(prompt_blocks(body([{"role": "user", "content": [_marked(f"p{i}") for i in range(5)]}])))


def test_http_reports_tools_and_cached_usage(standin: ServerThread) -> None:
    """Over HTTP: the tool block report header, and cached_tokens on a repeated prefix."""
    tools = catalog_tools(40)
    payload = body([{"role": "user", "content": "hi"}], tools)
    first = httpx.post(standin.url + "/v1/chat/completions", json=payload).json()
    r = httpx.post(standin.url + "/v1/chat/completions", json=payload)
    assert r.headers["x-standin-tools"].startswith("count=40; chars=")
    assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] >= 1024


def test_too_many_breakpoints_is_400(standin: ServerThread) -> None:
    payload = body([{"role": "user", "content": [_marked(f"p{i}") for i in range(5)]}])
    r = httpx.post(standin.url + "/v1/chat/completions", json=payload)
    assert r.status_code == 400 and "maximum of 4" in r.json()["error"]["message"]


def test_tool_search_called_when_tool_not_offered(standin: ServerThread) -> None:
    """The [[call]] directive falls back to tool_search when the named tool is deferred."""
    tools = [{"type": "function", "function": {"name": "tool_search", "parameters": {}}}]
    r = httpx.post(standin.url + "/v1/chat/completions",
                   json=body([{"role": "user", "content": "[[call get_weather]]"}], tools)).json()
    call = r["choices"][0]["message"]["tool_calls"][0]["function"]
    assert call["name"] == "tool_search" and orjson.loads(call["arguments"])["names"] == ["get_weather"]


def test_deterministic(standin: ServerThread) -> None:
    payload = body([{"role": "user", "content": "[[call x]] same"}])
    one = httpx.post(standin.url + "/v1/chat/completions", json=payload).json()
    two = httpx.post(standin.url + "/v1/chat/completions", json=payload).json()
    assert one["id"] == two["id"] and one["choices"] == two["choices"]


def test_token_counter_falls_back_without_encodings(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where tiktoken cannot load an encoding, counts are estimated instead of failing."""
    counter = TokenCounter(encoding="no_such_encoding")
    assert counter.exact is False
    assert counter.count("x" * 400) == 100


OPENAI_USAGE_KEYS = {"prompt_tokens", "completion_tokens", "total_tokens", "prompt_tokens_details"}


def test_usage_has_only_standard_fields_ceiling_in_a_header(standin: ServerThread) -> None:
    """The usage object carries OpenAI's fields only; the prefix ceiling comes in x-standin-prefix-ceiling,
    on plain and streamed replies alike."""
    payload = body([{"role": "user", "content": "hi"}], catalog_tools(40))
    first = httpx.post(standin.url + "/v1/chat/completions", json=payload)
    again = httpx.post(standin.url + "/v1/chat/completions", json=payload)
    assert set(first.json()["usage"]) == set(again.json()["usage"]) == OPENAI_USAGE_KEYS
    assert first.headers["x-standin-prefix-ceiling"] == "0"
    assert int(again.headers["x-standin-prefix-ceiling"]) == again.json()["usage"]["prompt_tokens"]
    streamed = {**payload, "stream": True, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", standin.url + "/v1/chat/completions", json=streamed) as r:
        events = [orjson.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    assert int(r.headers["x-standin-prefix-ceiling"]) == again.json()["usage"]["prompt_tokens"]
    assert set(events[-1]["usage"]) == OPENAI_USAGE_KEYS


def test_embeddings_base64_like_openai(standin: ServerThread) -> None:
    """encoding_format base64: the same vector as the float list, as little-endian float32 in base64;
    the openai SDK (which asks for base64 by default) decodes it to the same floats."""
    import base64
    import struct

    from openai import OpenAI

    url = standin.url + "/v1/embeddings"
    floats = httpx.post(url, json={"model": "e", "input": ["a tool", "another"]}).json()["data"]
    encoded = httpx.post(url, json={"model": "e", "input": ["a tool", "another"], "encoding_format": "base64"}).json()
    for plain, packed in zip(floats, encoded["data"], strict=True):
        raw = base64.b64decode(packed["embedding"])
        assert list(struct.unpack(f"<{len(raw) // 4}f", raw)) == plain["embedding"]
    sdk = OpenAI(base_url=standin.url + "/v1", api_key="unused").embeddings.create(model="e", input=["a tool"])
    assert sdk.data[0].embedding == floats[0]["embedding"]
