"""Hidden exchanges: what Keel said to the model on the client's behalf, spliced back later.

When Keel answers a `tool_search` call itself, the provider's history holds an assistant
call and a tool result that the client never saw. The next request from the client lacks
them; Keel puts them back at the same place so the provider sees exactly the history it
produced (and its prompt cache still matches). An exchange is stored on the turn record of
the user message it followed, with a fingerprint of the visible answer it led to, so a
regenerated answer never inherits another answer's exchange.
"""

from __future__ import annotations

from collections.abc import Sequence

from proxy.chain import canonical_json
from proxy.messages import Message, tool_calls
from proxy.records import HiddenExchange, TurnRecord

__all__ = ["HiddenExchange", "fingerprint", "found_tools", "splice"]


def fingerprint(message: Message) -> str:
    """What identifies an assistant message as the client resends it: text and call ids."""
    calls = [c.get("id") for c in tool_calls(message)]
    content = message.get("content")
    return canonical_json({"content": content if isinstance(content, str) else None, "calls": calls}).decode()


def _visible_answer(messages: Sequence[Message], user_index: int) -> int | None:
    for i in range(user_index + 1, len(messages)):
        role = messages[i].get("role")
        if role == "assistant":
            return i
        if role == "user":
            return None
    return None


def splice(messages: Sequence[Message], records: Sequence[TurnRecord], catalog: str = "") -> list[Message]:
    """The client's messages with every stored hidden exchange put back in its place (only an
    exchange answered from this request's tool catalog: another catalog's schemas never return)."""
    out = list(messages)
    for record in sorted(records, key=lambda r: r.position, reverse=True):
        if not record.hidden_exchanges or record.position >= len(out):
            continue
        answer = _visible_answer(out, record.position)
        if answer is None:
            continue  # the turn is being (re)generated: its exchanges belong to an answer not sent
        shown = fingerprint(out[answer])
        exchange = next((x for x in record.hidden_exchanges if x.answer == shown and x.catalog == catalog), None)
        if exchange is None:
            continue
        visible = exchange.visible if exchange.visible is not None else out[answer]
        out[answer : answer + 1] = [*exchange.before, visible, *exchange.after]
    return out


def found_tools(records: Sequence[TurnRecord]) -> list[str]:
    """Tools that Keel's searches surfaced along the chain, in the order they were found."""
    names: list[str] = []
    for record in records:
        for exchange in record.hidden_exchanges:
            names += [n for n in exchange.found if n not in names]
    return names
