"""Context state and the `<context_update>` block: what changed since the model last heard.

A state is plain data (stored on turn records and anchors): the system prompt's sections
by key, and the local date. `diff` compares the state the model knows with the state sampled
now and renders only the net difference, so a value flipped and flipped back between two
sends leaves no trace.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from proxy.context.sections import mask, split_sections
from proxy.turn import Turn

State = dict[str, Any]

PREAMBLE = (
    "These are changes to your instructions since earlier in this conversation. "
    "Where they differ from what you were told before, the newest value wins."
)


def sample(system_text: str, date: str | None, memory: dict[str, str] | None = None) -> State:
    sections = split_sections(system_text)
    return {
        "sections": {s.key: s.text for s in sections},
        "order": [s.key for s in sections],
        "date": date,
        "memory": dict(memory or {}),
    }


def diff(known: State, now: State, sent_at: str | None = None) -> str | None:
    """The `<context_update>` block taking the model from `known` to `now`, or None."""
    lines: list[str] = []
    old, new = known.get("sections", {}), now.get("sections", {})
    for key in now.get("order", []):
        if key not in old:
            lines.append(f'Added section "{key}":\n{new[key]}')
        elif mask(old[key]) != mask(new[key]):
            lines.append(f'Changed section "{key}", now:\n{new[key]}')
    for key in known.get("order", []):
        if key not in new:
            lines.append(f'Removed section "{key}": disregard it.')
    old_memory, new_memory = known.get("memory") or {}, now.get("memory") or {}
    for key in sorted(new_memory):
        if key not in old_memory:
            lines.append(f"Memory entry added: {key}: {new_memory[key]}")
        elif old_memory[key] != new_memory[key]:
            lines.append(f"Memory entry changed: {key}: {new_memory[key]}")
    for key in sorted(set(old_memory) - set(new_memory)):
        lines.append(f"Memory entry removed: {key} (forget it).")
    if now.get("date") and now.get("date") != known.get("date"):
        lines.append(f"The current date is now {now['date']}.")
    if sent_at:
        lines.append(f"This message was sent at {sent_at}.")
    if not lines:
        return None
    return "<context_update>\n" + PREAMBLE + "\n\n" + "\n\n".join(lines) + "\n</context_update>"


def prepend_updates(request: Turn, messages: list[dict[str, Any]],
                    updates: dict[str, str]) -> tuple[list[dict[str, Any]], Turn]:
    """Put each stored update (by the user message's chain hash) at the start of its message.

    Client messages are found by identity (`request.client_messages`), so earlier planners
    may have inserted messages around them; the returned request knows the rewritten objects,
    so a later planner still recognises the client's messages."""
    assert request.location is not None
    client = list(request.client_messages)
    by_object: dict[int, tuple[int, str]] = {}
    for link in request.location.chain.user_links:
        if link.hash in updates and link.index < len(client):
            by_object[id(client[link.index])] = (link.index, updates[link.hash])
    rendered = []
    for message in messages:
        hit = by_object.get(id(message))
        if hit is not None:
            message = with_update(message, hit[1])
            client[hit[0]] = message
        rendered.append(message)
    return rendered, replace(request, client_messages=tuple(client))


def with_update(message: dict[str, Any], update: str) -> dict[str, Any]:
    """The user message with the update block at the start of its content (a new dict)."""
    content = message.get("content")
    if isinstance(content, list):
        return {**message, "content": [{"type": "text", "text": update}, *content]}
    text = content if isinstance(content, str) else ""
    return {**message, "content": update + "\n\n" + text}

