"""Context state and the `<context_update>` block: what changed since the model last heard.

A state is plain data: the system prompt's sections by key (with their masked texts, what
comparisons read), the local date and the user's memory. `diff` compares the state the model
knows with the state sampled now and renders only the net difference, so a value flipped and
flipped back between two sends leaves no trace. A state is stored by reference (`Sampler.stored`):
its sections, masked, and its memory are content many turns and conversations share, kept once
each in `Blobs`, so a turn record holds a few hashes, not a copy of the system prompt.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import replace

from proxy import jsontext
from proxy.blobs import Blobs
from proxy.context.sections import mask, split_sections
from proxy.jsontext import JsonObject
from proxy.turn import Turn

State = JsonObject

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


def _masked(state: State, key: str) -> str:
    masked = state.get("masked")
    return masked[key] if masked is not None else mask(state["sections"][key])


def diff(known: State, now: State, sent_at: str | None = None) -> str | None:
    """The `<context_update>` block taking the model from `known` to `now`, or None."""
    lines: list[str] = []
    old, new = known.get("sections", {}), now.get("sections", {})
    for key in now.get("order", []):
        if key not in old:
            lines.append(f'Added section "{key}":\n{new[key]}')
        elif _masked(known, key) != _masked(now, key):
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


class Sampler:
    """States sampled from system prompts, each distinct prompt split and masked once (by its
    hash), and stored by reference: `stored` keeps a state's sections (masked: all a comparison
    reads) and memory in `blobs` and returns `{"system": ref, "date", "memory": ref}`; `known`
    reads one back (a state stored whole by an older Keel is read as it is)."""

    def __init__(self, blobs: Blobs, size: int = 256) -> None:
        self.blobs = blobs
        self._size = size
        self._prompts: OrderedDict[bytes, tuple[State, bytes]] = OrderedDict()  # text digest -> sections, blob

    def _sections(self, text: str) -> tuple[State, bytes]:
        digest = hashlib.blake2b(text.encode(), digest_size=16).digest()
        found = self._prompts.get(digest)
        if found is None:
            sections = split_sections(text)
            order, masked = [s.key for s in sections], {s.key: s.masked for s in sections}
            part = {"sections": {s.key: s.text for s in sections}, "order": order, "masked": masked}
            found = self._prompts[digest] = (part, _sections_blob(order, masked))
            if len(self._prompts) > self._size:
                self._prompts.popitem(last=False)
        else:
            self._prompts.move_to_end(digest)
        return found

    def sample(self, system_text: str, date: str | None, memory: dict[str, str] | None = None) -> State:
        part, blob = self._sections(system_text)
        return {**part, "date": date, "memory": dict(memory or {}), "_blob": blob}

    async def stored(self, scope: str, state: State) -> State:
        blob = state.get("_blob") or _sections_blob(state.get("order", []),
                                                    {k: _masked(state, k) for k in state.get("order", [])})
        order = state.get("order", [])
        masked = {k: _masked(state, k) for k in order}
        system = await self.blobs.put(scope, blob, {"sections": masked, "masked": masked, "order": order})
        memory = state.get("memory") or {}
        memory_ref = await self.blobs.put(scope, jsontext.canonical(memory)) if memory else None
        return {"system": system, "date": state.get("date"), "memory": memory_ref}

    async def known(self, scope: str, stored: State) -> State | None:
        """A stored state as `diff` reads it; None when content it refers to is gone."""
        if "system" not in stored:
            return stored
        part = await self.blobs.load(scope, stored["system"], _known_sections)
        memory = await self.blobs.load(scope, stored["memory"], jsontext.loads) if stored.get("memory") else {}
        if part is None or memory is None:
            return None
        return {**part, "date": stored.get("date"), "memory": memory}


def _sections_blob(order: list[str], masked: dict[str, str]) -> bytes:
    return jsontext.dumps({"order": order, "masked": masked})


def _known_sections(blob: bytes) -> State:
    data = jsontext.loads(blob)
    return {"sections": data["masked"], "masked": data["masked"], "order": data["order"]}


def prepend_updates(request: Turn, messages: list[JsonObject],
                    updates: dict[str, str]) -> tuple[list[JsonObject], Turn]:
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


def with_update(message: JsonObject, update: str) -> JsonObject:
    """The user message with the update block at the start of its content (a new dict)."""
    content = message.get("content")
    if isinstance(content, list):
        return {**message, "content": [{"type": "text", "text": update}, *content]}
    text = content if isinstance(content, str) else ""
    return {**message, "content": update + "\n\n" + text}

