"""What Keel stores per conversation: bytes per new conversation in a SQLite file.

    python bench/state.py [--conversations N]

N new conversations (default 1,000), each one user turn and one answer, all under one ~17 KB
system prompt with a ticking clock (a support app's: instructions, policies, a memory section).
Each configuration gets a fresh Keel and stand-in; the store's growth is measured after the
first conversation (which stores what they share), as the file's size after a WAL checkpoint
and as the bytes of its rows (keys and values).
"""

from __future__ import annotations

import argparse
import sqlite3
from pathlib import Path
from typing import Any

import httpx
from cache import INSTRUCTIONS, tools_for
from common import KEY, start_keel, start_standin
from overhead import table

SYSTEM = "\n\n".join([
    "Current date and time: 2026-11-30 10:{minute:02d}:{second:02d}",
    "You are Acme's support assistant.\n\n" + INSTRUCTIONS,
    "## Policies\n" + "\n".join(f"Policy {i}: refunds for plan {i} follow section {i} of the terms; "
                                f"escalate disputes over {i * 50} dollars to a human agent." for i in range(100)),
    "<memory>\nThe user prefers short answers.\n</memory>",
])
CONFIGS = {
    "context + cache": {"context": {"stable": True}, "cache": {"breakpoints": "auto", "prompt_cache_key": "auto"}},
    "+ tools (dispatch, 200 tools)": {"context": {"stable": True},
                                      "cache": {"breakpoints": "auto", "prompt_cache_key": "auto"},
                                      "tools": {"enabled": True, "stability": "dispatch"}},
}
QUESTIONS = ("How do I get a refund for plan {i}?", "Read the file notes_{i}.txt and summarize it.",
             "What time is it in Tokyo? Ticket {i}.", "Fetch https://example.com/{i} and tell me what it says.")


def stored(db: Path) -> tuple[int, int]:
    """The file's size after a checkpoint, and the bytes of every row's key and value."""
    with sqlite3.connect(db) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        rows = conn.execute("SELECT COALESCE(SUM(LENGTH(key) + LENGTH(value)), 0) FROM kv").fetchone()[0]
    return db.stat().st_size, int(rows)


def run(extra: dict[str, Any], conversations: int) -> dict[str, float]:
    standin, standin_url = start_standin(rules="none")
    keel, url, tmp = start_keel(standin_url, extra)
    db = tmp / "keel.db"
    tools = tools_for(with_catalog=True) if "tools" in extra else None
    try:
        with httpx.Client(timeout=60, headers={"authorization": f"Bearer {KEY}"}) as client:
            def converse(i: int) -> None:
                system = SYSTEM.format(minute=i // 60 % 60, second=i % 60)
                question = QUESTIONS[i % len(QUESTIONS)].format(i=i)
                body: dict[str, Any] = {"model": "gpt-4o-mini", "user": f"user-{i}", "messages": [
                    {"role": "system", "content": system}, {"role": "user", "content": question}]}
                if tools:
                    body["tools"] = tools
                reply = client.post(url + "/v1/chat/completions", json=body)
                assert reply.status_code == 200, reply.text

            converse(0)
            file0, rows0 = stored(db)
            for i in range(1, conversations + 1):
                converse(i)
            file1, rows1 = stored(db)
    finally:
        keel.stop()
        standin.stop()
    return {"file": (file1 - file0) / conversations, "rows": (rows1 - rows0) / conversations, "total": file1}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--conversations", type=int, default=1000)
    n = parser.parse_args().conversations
    rows = []
    for name, extra in CONFIGS.items():
        r = run(extra, n)
        rows.append([name, n, f"{len(SYSTEM) / 1024:.1f} KB", f"{r['file'] / 1024:.2f}", f"{r['rows'] / 1024:.2f}",
                     f"{r['total'] / 1024 / 1024:.1f}"])
    print(__doc__.split("\n\n")[2])
    table(["features", "conversations", "system prompt", "KB per conversation (file)", "KB per conversation (rows)",
           "file MB"], rows)


if __name__ == "__main__":
    main()
