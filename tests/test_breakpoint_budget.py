"""The breakpoint budget (issue: Claude Code got a 400 from five cache breakpoints): every
request Keel changes carries at most the provider's 4 `cache_control` marks, the client's own
first. The stand-in refuses a fifth as Anthropic does; the anthropic SDK is the client."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anthropic
from conftest import KEY, ServerThread, keel_config, tenant
from test_shapes_e2e import ON, WANTED, messages_tools

from proxy.breakpoints import marks, within_budget

CC = {"type": "ephemeral"}
RULES = "You run a help desk. " + "Answer with care and cite the ticket. " * 300


def _marks_upstream(standin: ServerThread) -> list[list[Any]]:
    return [[path for path, _ in marks(body)] for body in standin.app.state.standin.requests]


def client(keel: ServerThread) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=keel.url, api_key=KEY, max_retries=0)


def test_a_tool_result_turn_like_claude_codes_stays_within_four(standin: ServerThread,
                                                                 start_keel: Callable[..., ServerThread]) -> None:
    """Claude Code marks its system prompt, an earlier turn and the newest block (here a
    tool_result); Keel defers the catalog and would add its own marks: the provider still gets
    at most 4, all 3 of the client's among them, and answers 200 (it was a 400 before)."""
    keel = start_keel(keel_config(tenant(standin.url + "/v1", **ON)))
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": [{"type": "text", "text": "hello, I need help " * 200, "cache_control": CC}]},
        {"role": "assistant", "content": [{"type": "text", "text": "Sure, which ticket?"}]},
        {"role": "user", "content": f"archive ticket 7 with {WANTED}"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_01", "name": WANTED, "input": {"id": "7"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_01", "content": "archived",
                                      "cache_control": CC}]},
    ]
    reply = client(keel).messages.create(model="claude-sonnet-4-5", max_tokens=100, tools=messages_tools(),
                                         system=[{"type": "text", "text": RULES, "cache_control": CC}],
                                         messages=messages)
    assert reply.content, "answered (the provider took the request)"
    sent = _marks_upstream(standin)[-1]
    assert len(sent) <= 4
    assert ("system", 0) in sent and ("messages", 0, "content", 0) in sent and ("messages", 4, "content", 0) in sent


def test_marks_the_client_moved_are_not_added_to_a_frozen_system_prompt(
        standin: ServerThread, start_keel: Callable[..., ServerThread]) -> None:
    """Turn 1 marks both system blocks; turn 2 marks four messages and none of the system. The
    frozen system prompt keeps turn 1's bytes, but the client's 4 new marks come first: 4 go up."""
    keel = start_keel(keel_config(tenant(standin.url + "/v1", **ON)))
    system = [{"type": "text", "text": RULES}, {"type": "text", "text": "More rules. " * 300}]
    marked = [{**block, "cache_control": CC} for block in system]
    first = [{"role": "user", "content": [{"type": "text", "text": "hello " * 300}]}]
    anthropic_client = client(keel)
    answer = anthropic_client.messages.create(model="claude-sonnet-4-5", max_tokens=50, system=marked, messages=first)
    said = answer.content[0].text  # type: ignore[union-attr]

    def block(text: str) -> dict[str, Any]:
        return {"type": "text", "text": text, "cache_control": CC}

    second = [{"role": "user", "content": [block("hello " * 300)]}, {"role": "assistant", "content": [block(said)]},
              {"role": "user", "content": [block("second " * 300)]}, {"role": "assistant", "content": [block("ok")]},
              {"role": "user", "content": "third"}]
    anthropic_client.messages.create(model="claude-sonnet-4-5", max_tokens=50, system=system, messages=second)
    sent = _marks_upstream(standin)[-1]
    assert sent == [("messages", i, "content", 0) for i in range(4)]


def test_the_budget_keeps_the_clients_marks_then_the_latest_others() -> None:
    """Unit: within the limit the body is returned as is (the same object); over it, marks the
    client's request does not carry go first, earliest first; the client's own stay."""
    mine = {"type": "text", "text": "mine", "cache_control": CC}
    body = {"system": [{"type": "text", "text": "s1", "cache_control": CC}, {"type": "text", "text": "s2", "cache_control": CC}],
            "tools": [{"name": "t", "cache_control": CC}],
            "messages": [{"role": "user", "content": [mine, {"type": "text", "text": "keel", "cache_control": CC}]},
                         {"role": "user", "content": [{"type": "tool_result", "content": [
                             {"type": "text", "text": "nested", "cache_control": CC}]}]}]}
    client_body = {"messages": [{"role": "user", "content": [mine]}]}
    out = within_budget(body, client_body)
    kept = [path for path, _ in marks(out)]
    assert len(kept) == 4 and ("messages", 0, "content", 0) in kept
    assert ("tools", 0) not in kept and ("system", 0) not in kept, "the earliest of Keel's went first"
    assert len(list(marks(body))) == 6, "the input was not changed in place"
    small = {"messages": [{"role": "user", "content": [mine]}]}
    assert within_budget(small, client_body) is small


def test_a_block_marked_again_counts_as_the_clients_only_once() -> None:
    """A frozen system block whose text equals a block the client marks now: the client's one
    mark is its own, the frozen copy's is Keel's to drop (it was counted twice, and 5 went up)."""
    same = {"type": "text", "text": "Rules.", "cache_control": CC}
    body = {"system": [dict(same)], "messages": [
        {"role": "user", "content": [{"type": "text", "text": t, "cache_control": CC} for t in ("a", "b", "c")]},
        {"role": "user", "content": [dict(same)]}]}
    client = {"system": [{"type": "text", "text": "Rules."}], "messages": body["messages"]}
    out = within_budget(body, client)
    assert [path for path, _ in marks(out)] == [("messages", 0, "content", i) for i in range(3)] + [
        ("messages", 1, "content", 0)]


def test_marks_nested_anywhere_count() -> None:
    """A document's nested content blocks can carry marks too: they count toward the limit."""
    doc = {"type": "document", "source": {"type": "content", "content": [
        {"type": "text", "text": "p1", "cache_control": CC}, {"type": "text", "text": "p2", "cache_control": CC}]}}
    body = {"messages": [{"role": "user", "content": [doc, {"type": "text", "text": "q", "cache_control": CC}]},
                         {"role": "user", "content": [{"type": "text", "text": "k1", "cache_control": CC},
                                                      {"type": "text", "text": "k2", "cache_control": CC}]}]}
    client = {"messages": [body["messages"][0]]}
    assert len(list(marks(body))) == 5
    out = within_budget(body, client)
    assert len(list(marks(out))) == 4 and len(list(marks(client))) == 3
