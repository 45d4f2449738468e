"""A conversation stored by a Keel of another format version, met through HTTP on all three API
shapes: every record, anchor and frozen tool block of it reads as absent, so the next turn is
answered as a new conversation would be (a cache miss), never a failed turn or a planner failure."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import KEY, ServerThread, keel_config, tenant
from test_writer_invariants import PATHS, SHAPES, catalog

from proxy.records import FORMAT

AUTH = {"authorization": f"Bearer {KEY}"}
FEATURES: dict[str, Any] = {"tools": {"enabled": True, "select": {"timeout_ms": 100}}, "context": {"stable": True}}
SYSTEM = "You run a help desk."


def turn(shape: str, history: list[dict[str, Any]]) -> dict[str, Any]:
    if shape == "chat":
        return {"model": "m", "tools": catalog(shape), "messages": [{"role": "system", "content": SYSTEM}, *history]}
    if shape == "responses":
        return {"model": "m", "tools": catalog(shape), "instructions": SYSTEM, "input": history, "store": False}
    return {"model": "c", "max_tokens": 64, "tools": catalog(shape), "system": SYSTEM, "messages": history}


def answer(shape: str, reply: httpx.Response) -> str:
    data = reply.json()
    if shape == "chat":
        return str(data["choices"][0]["message"]["content"])
    if shape == "responses":
        return "".join(part["text"] for item in data["output"] if item["type"] == "message"
                       for part in item["content"] if part["type"] == "output_text")
    return "".join(block["text"] for block in data["content"] if block["type"] == "text")


def reversion(db: Path, to: int) -> int:
    """Every stored value of this format rewritten as of format `to`: how many there were."""
    conn = sqlite3.connect(db)
    try:
        rows = [(k, v) for k, v in conn.execute("SELECT key, value FROM kv")
                if isinstance(v, bytes) and v.startswith(b'{"v":%d,' % FORMAT)]
        with conn:
            conn.executemany("UPDATE kv SET value = ? WHERE key = ?",
                             [(b'{"v":%d,' % to + v[len(b'{"v":%d,' % FORMAT):], k) for k, v in rows])
        return len(rows)
    finally:
        conn.close()


def failures(keel: ServerThread) -> float:
    registry = keel.app.state.keel.metrics.registry
    return sum(s.value for metric in registry.collect() for s in metric.samples
               if s.name == "keel_planner_failures_total")


@pytest.mark.parametrize("version", [FORMAT, FORMAT + 1], ids=["same", "another"])
@pytest.mark.parametrize("shape", SHAPES)
def test_a_conversation_of_another_format_version_goes_on_as_a_new_one(
        standin: ServerThread, start_keel: Callable[..., ServerThread], tmp_path: Path, shape: str,
        version: int) -> None:
    """Rewritten as of its own format, the conversation goes on (the same id); as of another, the
    next turn is a new conversation's."""
    db = tmp_path / "keel.db"
    keel = start_keel(keel_config(tenant(standin.url + "/v1", **FEATURES), store={"url": f"sqlite:///{db}"}))
    history: list[dict[str, Any]] = []
    for text in ("hello there", "and one more thing"):
        history.append({"role": "user", "content": text})
        reply = httpx.post(keel.url + PATHS[shape], json=turn(shape, history), headers=AUTH, timeout=20)
        assert reply.status_code == 200, reply.text
        history.append({"role": "assistant", "content": answer(shape, reply)})
    assert reply.headers["x-keel-conversation"]
    assert reversion(db, version) >= 2, "records and anchors were stored in this format"
    history.append({"role": "user", "content": "a third question"})
    later = httpx.post(keel.url + PATHS[shape], json=turn(shape, history), headers=AUTH, timeout=20)
    assert later.status_code == 200, later.text
    assert "a third question" in answer(shape, later)
    assert failures(keel) == 0
    same = later.headers["x-keel-conversation"] == reply.headers["x-keel-conversation"]
    assert same is (version == FORMAT)
