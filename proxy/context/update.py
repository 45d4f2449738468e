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
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from proxy import jsontext
from proxy.blobs import Blobs
from proxy.context.sections import split_sections
from proxy.records import StoredState

PREAMBLE = (
    "These are changes to your instructions since earlier in this conversation. "
    "Where they differ from what you were told before, the newest value wins."
)


@dataclass(frozen=True)
class State:
    """What the model knows, or what the context says now: the system prompt's sections by key
    in their order, each also masked (what comparisons read), the local date, the user's memory."""

    sections: Mapping[str, str]
    order: tuple[str, ...]
    masked: Mapping[str, str]
    date: str | None = None
    memory: Mapping[str, str] = field(default_factory=dict)
    blob: bytes | None = field(default=None, compare=False)  # the sections' stored form, when already built


def sample(system_text: str, date: str | None, memory: Mapping[str, str] | None = None) -> State:
    sections = split_sections(system_text)
    return State({s.key: s.text for s in sections}, tuple(s.key for s in sections),
                 {s.key: s.masked for s in sections}, date, dict(memory or {}))


def diff(known: State, now: State, sent_at: str | None = None) -> str | None:
    """The `<context_update>` block taking the model from `known` to `now`, or None."""
    lines: list[str] = []
    old, new = known.sections, now.sections
    for key in now.order:
        if key not in old:
            lines.append(f'Added section "{key}":\n{new[key]}')
        elif known.masked[key] != now.masked[key]:
            lines.append(f'Changed section "{key}", now:\n{new[key]}')
    for key in known.order:
        if key not in new:
            lines.append(f'Removed section "{key}": disregard it.')
    old_memory, new_memory = known.memory, now.memory
    for key in sorted(new_memory):
        if key not in old_memory:
            lines.append(f"Memory entry added: {key}: {new_memory[key]}")
        elif old_memory[key] != new_memory[key]:
            lines.append(f"Memory entry changed: {key}: {new_memory[key]}")
    for key in sorted(set(old_memory) - set(new_memory)):
        lines.append(f"Memory entry removed: {key} (forget it).")
    if now.date and now.date != known.date:
        lines.append(f"The current date is now {now.date}.")
    if sent_at:
        lines.append(f"This message was sent at {sent_at}.")
    if not lines:
        return None
    return "<context_update>\n" + PREAMBLE + "\n\n" + "\n\n".join(lines) + "\n</context_update>"


class Sampler:
    """States sampled from system prompts, each distinct prompt split and masked once (by its
    hash), and stored by reference: `stored` keeps a state's sections (masked: all a comparison
    reads) and memory in `blobs` and returns a `StoredState` of their refs; `known` reads one back."""

    def __init__(self, blobs: Blobs, size: int = 256) -> None:
        self.blobs = blobs
        self._size = size
        self._prompts: OrderedDict[bytes, State] = OrderedDict()  # text digest -> its sections, blob built

    def _sections(self, text: str) -> State:
        digest = hashlib.blake2b(text.encode(), digest_size=16).digest()
        found = self._prompts.get(digest)
        if found is None:
            part = sample(text, None)
            found = self._prompts[digest] = replace(part, blob=_sections_blob(part.order, part.masked))
            if len(self._prompts) > self._size:
                self._prompts.popitem(last=False)
        else:
            self._prompts.move_to_end(digest)
        return found

    def sample(self, system_text: str, date: str | None, memory: Mapping[str, str] | None = None) -> State:
        return replace(self._sections(system_text), date=date, memory=dict(memory or {}))

    async def stored(self, scope: str, state: State) -> StoredState:
        masked = {k: state.masked[k] for k in state.order}
        blob = state.blob or _sections_blob(state.order, masked)
        system = await self.blobs.put(scope, blob, State(masked, state.order, masked))  # as `_known_sections` reads it
        memory_ref = await self.blobs.put(scope, jsontext.canonical(dict(state.memory))) if state.memory else None
        return StoredState(system, state.date, memory_ref)

    async def known(self, scope: str, stored: StoredState) -> State | None:
        """A stored state as `diff` reads it; None when content it refers to is gone."""
        part = await self.blobs.load(scope, stored.system, _known_sections)
        memory = await self.blobs.load(scope, stored.memory, jsontext.loads) if stored.memory else {}
        if part is None or memory is None:
            return None
        return replace(part, date=stored.date, memory=memory)


def _sections_blob(order: tuple[str, ...], masked: Mapping[str, str]) -> bytes:
    return jsontext.dumps({"order": list(order), "masked": dict(masked)})


def _known_sections(blob: bytes) -> State:
    data = jsontext.loads(blob)
    return State(data["masked"], tuple(data["order"]), data["masked"])
