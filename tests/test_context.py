"""Context updates and cache hints: sections, timestamps, the update block, breakpoints, cache keys."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import orjson
import pytest
from conftest import KEY, ServerThread, keel_config, tenant

from proxy.context.cache import MAX_BREAKPOINTS, CachePlanner
from proxy.context.sections import mask, split_sections
from proxy.context.update import diff, sample
from proxy.conversations import Conversations
from proxy.pipeline import locate
from proxy.stores.sqlite import SqliteStore
from proxy.turn import Turn
from proxy.updates import with_update

SYSTEM = """Current time: 2026-11-30 10:00:01

You are helpful.

<memory>
likes tea
</memory>

## Tools
Use them wisely."""


def test_sections_by_tag_heading_and_block() -> None:
    keys = [s.key for s in split_sections(SYSTEM)]
    assert keys == ["block: Current time: <time>", "block: You are helpful.", "<memory>", "## Tools"]


@pytest.mark.parametrize("stamp", ["2026-11-30T10:00:01Z", "2026-11-30 10:00:01", "Mon, 30 Nov 2026 10:00:01 +0000",
                                   "Monday, November 30, 2026 at 10:00 AM", "11/30/2026, 10:00:01", "10:00:01",
                                   "1796033401"])
def test_timestamps_masked(stamp: str) -> None:
    """ISO 8601, RFC 2822, common and locale forms, epoch: a ticking clock is no change."""
    assert "<time>" in mask(f"Now: {stamp}.") and not any(c.isdigit() for c in mask(f"Now: {stamp}."))


def test_update_added_changed_removed_and_date() -> None:
    known = sample(SYSTEM, "2026-11-30 (Monday)")
    now_text = SYSTEM.replace("likes tea", "likes coffee").replace("## Tools\nUse them wisely.", "## Beta\nOn.")
    update = diff(known, sample(now_text.replace("10:00:01", "23:59:59"), "2026-12-01 (Tuesday)"))
    assert update is not None and update.startswith("<context_update>") and "newest value wins" in update
    assert 'Changed section "<memory>", now:\n<memory>\nlikes coffee' in update
    assert 'Added section "## Beta"' in update and 'Removed section "## Tools"' in update
    assert update.count("The current date is now 2026-12-01 (Tuesday).") == 1
    assert "Current time" not in update  # the clock ticked: not a change


def test_flip_flop_leaves_no_trace() -> None:
    known = sample(SYSTEM, "2026-11-30")
    assert diff(known, sample(SYSTEM.replace("10:00:01", "10:05:00"), "2026-11-30")) is None


def test_update_goes_first_in_string_and_parts_content() -> None:
    assert with_update({"role": "user", "content": "hi"}, "U")["content"] == "U\n\nhi"
    image = {"type": "image_url", "image_url": {"url": "data:x"}}
    parts = with_update({"role": "user", "content": [{"type": "text", "text": "hi"}, image]}, "U")["content"]
    assert parts == [{"type": "text", "text": "U"}, {"type": "text", "text": "hi"}, image]


def chat(tenant_cfg: dict[str, Any], body: dict[str, Any]) -> Turn:
    config = keel_config(tenant_cfg)
    return Turn(config.tenants[0], b"", body, {}, "rid", client_messages=tuple(body["messages"]))


async def located(request: Turn, tmp_path: Any) -> Turn:
    return await locate(Conversations(SqliteStore(str(tmp_path / "c.db")), 3600), request)


async def test_prompt_cache_key_per_segment(tmp_path: Any) -> None:
    """OpenAI-kind upstreams get a prompt_cache_key derived from the segment, unless the client sent one."""
    cfg = tenant("http://up/v1", cache={"prompt_cache_key": "auto"})
    one = await located(chat(cfg, {"model": "m", "messages": [{"role": "user", "content": "a"}]}), tmp_path)
    two = await located(chat(cfg, {"model": "m", "messages": [{"role": "user", "content": "b"}]}), tmp_path)
    k1 = (await CachePlanner().plan(one)).body["prompt_cache_key"]
    k2 = (await CachePlanner().plan(two)).body["prompt_cache_key"]
    assert k1.startswith("keel-") and k1 != k2
    assert (await CachePlanner().plan(one)).body["prompt_cache_key"] == k1  # deterministic
    own = await located(chat(cfg, {"model": "m", "prompt_cache_key": "mine", "messages": [
        {"role": "user", "content": "a"}]}), tmp_path)
    assert (await CachePlanner().plan(own)).body["prompt_cache_key"] == "mine"


def long_conversation(turns: int) -> dict[str, Any]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "rules " * 2000}]
    for i in range(turns):
        messages += [{"role": "user", "content": f"question {i} " * 50}, {"role": "assistant", "content": f"a{i}"}]
    messages.append({"role": "user", "content": "newest"})
    tools = [{"type": "function", "function": {"name": f"t{i}", "description": "d" * 1000}} for i in range(5)]
    return {"model": "claude-sonnet", "tools": tools, "messages": messages}


def breakpoints(body: dict[str, Any]) -> list[str]:
    where = [f"tool {i}" for i, t in enumerate(body.get("tools", [])) if "cache_control" in t]
    for i, message in enumerate(body["messages"]):
        content = message.get("content")
        if isinstance(content, list) and any("cache_control" in p for p in content):
            where.append(f"message {i}")
    return where


async def test_breakpoints_where_the_stable_prefix_ends() -> None:
    """After the tools, after the system prompt, at the end of the previous turn, at this turn's end."""
    cfg = tenant("http://up/v1", cache={"breakpoints": "auto"}, upstream={"base_url": "http://up/v1",
                                                                          "kind": "anthropic-compatible"})
    body = long_conversation(3)
    planned = await CachePlanner().plan(chat(cfg, body))
    n = len(body["messages"])
    assert breakpoints(planned.body) == ["tool 4", "message 0", f"message {n - 2}", f"message {n - 1}"]
    assert len(breakpoints(planned.body)) <= MAX_BREAKPOINTS


async def test_breakpoints_skip_short_prefixes_and_respect_client_marks() -> None:
    cfg = tenant("http://up/v1", cache={"breakpoints": "auto"}, upstream={"base_url": "http://up/v1",
                                                                          "kind": "anthropic-compatible"})
    short = {"model": "m", "messages": [{"role": "system", "content": "hi"}, {"role": "user", "content": "yo"}]}
    assert breakpoints((await CachePlanner().plan(chat(cfg, short))).body) == []
    marked = long_conversation(1)
    marked["messages"][-1] = {"role": "user", "content": [{"type": "text", "text": "x", "cache_control": {}}]}
    planned = (await CachePlanner().plan(chat(cfg, marked))).body
    assert planned["messages"][-1] is marked["messages"][-1], "the client's own breakpoint, kept as sent"
    assert 1 < orjson.dumps(planned).count(b'"cache_control"') <= 4, "Keel's added up to the limit"
    full = long_conversation(1)
    full["messages"] = [{**m, "content": [{"type": "text", "text": str(m["content"]), "cache_control": {}}]}
                        for m in full["messages"]][:4]
    assert (await CachePlanner().plan(chat(cfg, full))).body is full, "four of the client's: none added"


async def test_openai_kind_gets_no_breakpoints() -> None:
    cfg = tenant("http://up/v1", cache={"breakpoints": "auto"})
    body = long_conversation(2)
    assert (await CachePlanner().plan(chat(cfg, body))).body is body


def test_cache_header_and_anthropic_hits_through_keel(standin: ServerThread,
                                                      start_keel: Callable[..., ServerThread]) -> None:
    """Through Keel to an Anthropic-rules upstream: the second turn reads what the first wrote."""
    cfg = tenant(standin.url + "/v1", context={"stable": True}, cache={"breakpoints": "auto"},
                 upstream={"base_url": standin.url + "/v1", "kind": "anthropic-compatible"})
    keel = start_keel(keel_config(cfg))
    headers = {"authorization": f"Bearer {KEY}"}
    history = [{"role": "user", "content": "first question [[ramble 40]]"}]  # a long answer: proof of continuity
    first = httpx.post(keel.url + "/v1/chat/completions", headers=headers, json={
        "model": "claude", "messages": [{"role": "system", "content": "Time: 10:00:01\n\n" + "rules " * 2000},
                                        *history]})
    history += [first.json()["choices"][0]["message"], {"role": "user", "content": "second"}]
    second = httpx.post(keel.url + "/v1/chat/completions", headers=headers, json={
        "model": "claude", "messages": [{"role": "system", "content": "Time: 10:00:59\n\n" + "rules " * 2000},
                                        *history]})
    cached, prompt = map(int, second.headers["x-keel-cache"].split("/"))
    assert prompt > 2000 and cached / prompt > 0.9
    assert int(first.headers["x-keel-cache"].split("/")[0]) == 0
    metrics = httpx.get(keel.url + "/metrics").text
    assert f'keel_cached_tokens_total{{tenant="acme"}} {float(cached)}' in metrics


def test_streamed_usage_is_counted(standin: ServerThread, start_keel: Callable[..., ServerThread]) -> None:
    """The usage chunk of a stream is read as it passes and counted per tenant."""
    keel = start_keel(keel_config(tenant(standin.url + "/v1", context={"stable": True})))
    with httpx.stream("POST", keel.url + "/v1/chat/completions", headers={"authorization": f"Bearer {KEY}"}, json={
            "model": "m", "stream": True, "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": "[[words 5]]"}]}) as r:
        body = b"".join(r.iter_raw())
    assert b"[DONE]" in body
    metrics = httpx.get(keel.url + "/metrics").text
    line = next(x for x in metrics.splitlines() if x.startswith('keel_prompt_tokens_total{tenant="acme"}'))
    assert float(line.split()[-1]) > 0


def test_lost_anchor_is_a_logged_miss(standin: ServerThread, start_keel: Callable[..., ServerThread],
                                      tmp_path: Any, caplog: pytest.LogCaptureFixture) -> None:
    """With its anchor gone the turn is re-anchored (still answered) and the miss names why."""
    import logging
    import sqlite3

    db = tmp_path / "k.db"
    keel = start_keel(keel_config(tenant(standin.url + "/v1", context={"stable": True}),
                                  store={"url": f"sqlite:///{db}"}))
    headers = {"authorization": f"Bearer {KEY}"}
    system = {"role": "system", "content": "Time 10:00:01\n\n" + "policy " * 1500}
    first = httpx.post(keel.url + "/v1/chat/completions", headers=headers,
                       json={"model": "m", "messages": [system, {"role": "user", "content": "one [[ramble 40]]"}]}).json()
    with sqlite3.connect(db) as conn:
        conn.execute("DELETE FROM kv WHERE key LIKE '%:anchor:%'")
    history = [system, {"role": "user", "content": "one [[ramble 40]]"}, first["choices"][0]["message"],
               {"role": "user", "content": "two"}]
    history[0] = {"role": "system", "content": "Time 10:00:59\n\n" + "policy " * 1500}
    with caplog.at_level(logging.WARNING, logger="keel.cache"):
        second = httpx.post(keel.url + "/v1/chat/completions", headers=headers, json={"model": "m", "messages": history})
    assert second.status_code == 200 and second.json()["choices"][0]["message"]["content"] == "You said: two"
    misses = [r for r in caplog.records if r.getMessage() == "cache_miss"]
    assert misses and misses[0].reasons == ["anchor_lost"]  # type: ignore[attr-defined]


def test_records_of_another_format_version_start_a_new_conversation(standin: ServerThread,
                                                                     start_keel: Callable[..., ServerThread],
                                                                     tmp_path: Any) -> None:
    """Turn records written in another format (here: before records carried a version) are not read
    in their old shape: the next turn is answered as a new conversation (a cache miss, never an error)."""
    import sqlite3

    db = tmp_path / "k.db"
    keel = start_keel(keel_config(tenant(standin.url + "/v1", context={"stable": True}),
                                  store={"url": f"sqlite:///{db}"}))
    headers = {"authorization": f"Bearer {KEY}"}
    history: list[dict[str, Any]] = [{"role": "system", "content": "You are terse."}]

    def ask(text: str) -> httpx.Response:
        history.append({"role": "user", "content": text})
        reply = httpx.post(keel.url + "/v1/chat/completions", headers=headers, json={"model": "m", "messages": history})
        assert reply.status_code == 200 and reply.json()["choices"][0]["message"]["content"] == f"You said: {text}"
        history.append(reply.json()["choices"][0]["message"])
        return reply

    started = ask("one").headers["x-keel-conversation"]
    assert ask("two").headers["x-keel-conversation"] == started, "read in its own format, it continues"
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT key, value FROM kv WHERE key LIKE '%:turn:%'").fetchall()
        assert rows
        for turn_key, value in rows:
            record = orjson.loads(value)
            assert record.pop("v") == 1
            conn.execute("UPDATE kv SET value = ? WHERE key = ?", (orjson.dumps(record), turn_key))
    assert ask("three").headers["x-keel-conversation"] != started, "its records absent: a new conversation"


def test_a_new_conversation_under_a_known_prompt_stores_little(standin: ServerThread,
                                                                start_keel: Callable[..., ServerThread],
                                                                tmp_path: Any) -> None:
    """Conversations sharing a 17 KB system prompt (its clock ticking) store it once: each new one
    adds at most 3 KB (an anchor and a turn record referring to it by hash)."""
    import sqlite3

    db = tmp_path / "k.db"
    keel = start_keel(keel_config(tenant(standin.url + "/v1", context={"stable": True}),
                                  store={"url": f"sqlite:///{db}"}))
    prompt = "Current time: 2026-11-30 10:00:{second:02d}\n\n" + "\n".join(
        f"Rule {i}: answer questions about topic {i} precisely and cite the policy." for i in range(250))
    assert len(prompt) > 17_000

    def converse(i: int) -> None:
        messages = [{"role": "system", "content": prompt.format(second=i % 60)}, {"role": "user", "content": f"hi {i}"}]
        reply = httpx.post(keel.url + "/v1/chat/completions", headers={"authorization": f"Bearer {KEY}"},
                           json={"model": "m", "user": f"user-{i}", "messages": messages})
        assert reply.status_code == 200

    def stored() -> int:
        with sqlite3.connect(db) as conn:
            return int(conn.execute("SELECT SUM(LENGTH(key) + LENGTH(value)) FROM kv").fetchone()[0])

    converse(0)
    before = stored()
    for i in range(1, 21):
        converse(i)
    assert (stored() - before) / 20 <= 3 * 1024


def test_lost_shared_content_is_a_logged_miss(standin: ServerThread, start_keel: Callable[..., ServerThread],
                                              tmp_path: Any) -> None:
    """With the content an anchor refers to gone (the store emptied of it), the next turn, on a
    replica that never read it, re-anchors and is answered; the one after finds its context again."""
    import sqlite3

    db = tmp_path / "k.db"
    config = keel_config(tenant(standin.url + "/v1", context={"stable": True}), store={"url": f"sqlite:///{db}"})
    replicas = [start_keel(config), start_keel(config)]
    headers = {"authorization": f"Bearer {KEY}"}
    system = {"role": "system", "content": "Time 10:00:01\n\n" + "policy " * 1500}
    history: list[dict[str, Any]] = [system]
    seen = []
    for turn in range(3):
        history.append({"role": "user", "content": f"turn {turn}"})
        url = replicas[min(turn, 1)].url
        reply = httpx.post(url + "/v1/chat/completions", headers=headers, json={"model": "m", "messages": history})
        assert reply.status_code == 200
        history.append(reply.json()["choices"][0]["message"])
        seen.append(standin.app.state.standin.requests[-1]["messages"][0])
        if turn == 0:
            with sqlite3.connect(db) as conn:
                conn.execute("DELETE FROM kv WHERE key LIKE '%:blob:%'")
    assert seen[1] == seen[2]  # re-anchored once, then stable again
