"""proxy/breakpoints.py on its own: a planned body never carries more cache marks than the
provider allows; the client's own marks stay, the earliest of the others go."""

from __future__ import annotations

from typing import Any

from proxy.breakpoints import MAX_BREAKPOINTS, marks, within_budget

MARK = {"type": "ephemeral"}


def block(text: str, marked: bool = True) -> dict[str, Any]:
    return {"type": "text", "text": text, **({"cache_control": MARK} if marked else {})}


def body(*texts: str, marked: bool = True) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": [block(t, marked) for t in texts]}]}


def marked_texts(planned: dict[str, Any]) -> list[str]:
    return [value["text"] for _, value in marks(planned)]


def test_within_the_limit_the_body_is_the_same_object() -> None:
    planned = body("a", "b", "c", "d")
    assert within_budget(planned, body("a", "b", "c", "d")) is planned


def test_over_the_limit_the_clients_marks_stay_and_the_earliest_others_go() -> None:
    planned = body("k1", "k2", "c1", "k3", "c2", "k4")  # k: marks Keel (or a stored turn) added
    client = {"messages": [{"role": "user", "content": [block("c1"), block("c2")]}]}
    kept = within_budget(planned, client)
    assert marked_texts(kept) == ["c1", "k3", "c2", "k4"] and MAX_BREAKPOINTS == 4
    assert [b["text"] for b in kept["messages"][0]["content"]] == ["k1", "k2", "c1", "k3", "c2", "k4"], "text kept"
    assert marked_texts(planned) == ["k1", "k2", "c1", "k3", "c2", "k4"], "the planned body is not changed in place"


def test_a_block_the_client_marks_once_counts_as_its_own_once() -> None:
    planned = body("same", "same", "x", "y", "z")
    client = body("same")
    kept = within_budget(planned, client, limit=2)
    assert marked_texts(kept) == ["same", "z"]
    assert "cache_control" not in kept["messages"][0]["content"][0], "the earlier copy was Keel's: it goes"


def test_marks_in_system_blocks_and_tool_results_count() -> None:
    planned = {"system": [block("s1"), block("s2")], "messages": [
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": [block("r1")],
                                      "cache_control": MARK}, block("u1")]}]}
    kept = within_budget(planned, {}, limit=2)
    assert len(list(marks(kept))) == 2
