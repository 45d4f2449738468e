"""A conversation's turns settle in the order they started (issue 21, item 11): however the
background work is timed, one turn's direct estimate reads the previous turn's request, and the
page lists the turns in order."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from conftest import KEY, ServerThread, eventually, keel_config, tenant

from proxy.stores.sqlite import SqliteStore

ADMIN = "keel-admin-order"


class SlowFirstPrefix:
    """A real store whose first read of a client's previous request (the savings estimate's) is slow."""

    def __init__(self, inner: SqliteStore) -> None:
        self.inner = inner
        self.slowed = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def get(self, key: str) -> bytes | None:
        if "savings-prefix" in key and not self.slowed:
            self.slowed = True
            await asyncio.sleep(0.8)
        return await self.inner.get(key)


def test_turns_settle_in_order_when_the_first_is_slow(standin: ServerThread, start_keel: Callable[..., ServerThread],
                                                     tmp_path: Path) -> None:
    config = keel_config(tenant(standin.url + "/v1", context={"stable": True}, auth={
        "keys": [f"sha256:{hashlib.sha256(KEY.encode()).hexdigest()}"],
        "admin_keys": [f"sha256:{hashlib.sha256(ADMIN.encode()).hexdigest()}"]}))
    keel = start_keel(config, store=SlowFirstPrefix(SqliteStore(str(tmp_path / "k.db"))))
    system = {"role": "system", "content": "Policy. " * 1500}  # a long shared prefix: direct would read it from cache
    history: list[dict[str, Any]] = [system, {"role": "user", "content": "first [[ramble 40]]"}]
    headers = {"authorization": f"Bearer {KEY}"}
    for text in ("second", "third"):
        reply = httpx.post(keel.url + "/v1/chat/completions", headers=headers, json={"model": "gpt-4o", "messages": history})
        conversation = reply.headers["x-keel-conversation"]
        history += [reply.json()["choices"][0]["message"], {"role": "user", "content": text}]
    httpx.post(keel.url + "/v1/chat/completions", headers=headers, json={"model": "gpt-4o", "messages": history})

    def turns() -> list[dict[str, Any]]:
        response = httpx.get(keel.url + "/keel/api/conversation", params={"id": conversation},
                             headers={"authorization": f"Bearer {ADMIN}"})
        return response.json()["turns"]  # type: ignore[no-any-return]

    assert eventually(lambda: len(turns()) == 3, 10)
    listed = turns()
    assert [t["at"] for t in listed] == sorted(t["at"] for t in listed), "listed in the order they started"
    assert listed[1]["direct_cached"] > 0 and listed[2]["direct_cached"] > 0, "each read the request before it"
