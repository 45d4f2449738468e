"""A day's top list of conversations the store holds in a form Keel cannot read (corrupted, or
another Keel's): the savings of each turn are still recorded whole, and the page still answers."""

from __future__ import annotations

import hashlib
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from conftest import KEY, ServerThread, eventually, keel_config, tenant

from proxy.savings.ledger import day_of
from proxy.stores import key

ADMIN = "keel-admin-top-list"


@pytest.mark.parametrize("stored", [b"{}", b"not json at all", b"[1, 2, 3]"], ids=["control", "garbage", "list"])
def test_an_unreadable_top_list_costs_no_turn_its_savings(standin: ServerThread, start_keel: Callable[..., ServerThread],
                                                          tmp_path: Path, stored: bytes) -> None:
    """Before: the ledger's second batch (the turn's detail row, the meter's own writes) was never
    sent, for every turn of that day (the list could not be read to rank the turn in); the
    conversation inspector showed no turns. `{}` is the control."""
    db = tmp_path / "keel.db"
    config = tenant(standin.url + "/v1", context={"stable": True})
    config["auth"]["admin_keys"] = [f"sha256:{hashlib.sha256(ADMIN.encode()).hexdigest()}"]
    keel = start_keel(keel_config(config, store={"url": f"sqlite:///{db}"}))
    top = key("savings:acme", "top", day_of(time.time()))
    with sqlite3.connect(db) as conn:
        conn.execute("INSERT OR REPLACE INTO kv (key, value, expires) VALUES (?, ?, NULL)", (top, stored))
    conn.close()
    headers = {"authorization": f"Bearer {KEY}", "x-keel-conversation": "conv-top"}
    history: list[dict[str, str]] = []
    for text in ("hello", "again"):
        history.append({"role": "user", "content": text})
        reply = httpx.post(keel.url + "/v1/chat/completions", headers=headers, timeout=10,
                           json={"model": "gpt-4o", "messages": history})
        assert reply.status_code == 200
        history.append({"role": "assistant", "content": reply.json()["choices"][0]["message"]["content"]})
    admin = {"authorization": f"Bearer {ADMIN}"}

    def turns() -> int:
        answer = httpx.get(keel.url + "/keel/api/conversation", params={"id": "conv-top"}, headers=admin)
        return len(answer.json()["turns"]) if answer.status_code == 200 else -1

    assert eventually(lambda: turns() == 2), turns()
    summary = httpx.get(keel.url + "/keel/api/summary", headers=admin)
    assert summary.status_code == 200 and summary.json()["turns"] == 2
    assert any(c["conversation"] == "conv-top" for c in summary.json()["top_conversations"])
