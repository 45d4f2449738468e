"""The llm ranking backend: numbered candidates in batches at the option ceiling, P(yes) from logprobs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
from conftest import KEY, ServerThread, keel_config, tenant, tool

PARAMS = {f"p{i}": "string" for i in range(10)}
VERBS = ["create", "delete", "list", "get", "update"]
TOOLS = [tool(f"{VERBS[i % 5]}_thing_{i}", f"Handles thing {i}.", **PARAMS) for i in range(25)]


def llm_tenant(url: str, **select: Any) -> dict[str, Any]:
    return tenant(url, tools={"enabled": True, "stability": "per_turn", "defer": {"min_tools": 5},
                              "select": {"backend": "llm", "model": "judge", "timeout_ms": 1500, **select}})


def picks(standin: ServerThread) -> list[dict[str, Any]]:
    return [r for r in standin.app.state.standin.requests if r.get("logprobs")]


def test_batches_at_the_option_ceiling(standin: ServerThread, start_keel: Callable[..., ServerThread]) -> None:
    """25 candidates with a ceiling of 10: two requests of at most 10 numbered options each."""
    keel = start_keel(keel_config(llm_tenant(standin.url + "/v1", max_catalog_tools=10)))
    r = httpx.post(keel.url + "/v1/chat/completions", headers={"authorization": f"Bearer {KEY}"},
                   json={"model": "m", "tools": TOOLS, "messages": [{"role": "user", "content": "I need to create"}]})
    asked = picks(standin)
    assert r.status_code == 200 and len(asked) == 2
    for request in asked:
        options = request["messages"][-1]["content"].split("</tools>")[0].count("\n") - 1
        assert 0 < options <= 10
    shipped = [t["function"]["name"] for t in standin.app.state.standin.requests[-1]["tools"]]
    assert shipped[-1] == "tool_search" and all(n.startswith("create_") for n in shipped[:-1]) and len(shipped) > 1
    assert 'judgment="tool_ranking"' in httpx.get(keel.url + "/metrics").text


def test_no_tool_needed_and_unparseable(standin: ServerThread, start_keel: Callable[..., ServerThread]) -> None:
    """A 'no' surfaces nothing ranked; an unparseable answer is a failed judgment, never a failed turn."""
    keel = start_keel(keel_config(llm_tenant(standin.url + "/v1")))
    headers = {"authorization": f"Bearer {KEY}"}
    r = httpx.post(keel.url + "/v1/chat/completions", headers=headers,
                   json={"model": "m", "tools": TOOLS, "messages": [{"role": "user", "content": "hello"}]})
    assert r.headers["x-keel-tools"] == "0/25"
    r = httpx.post(keel.url + "/v1/chat/completions", headers=headers, json={
        "model": "m", "tools": TOOLS, "messages": [{"role": "user", "content": "create [[judge garbage]]"}]})
    assert r.status_code == 200 and r.headers["x-keel-tools"] == "0/25"
    assert 'keel_judgment_failures_total{judgment="tool_ranking",tenant="acme"} 1.0' in httpx.get(
        keel.url + "/metrics").text
