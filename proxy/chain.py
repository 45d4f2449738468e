"""Conversation identity by content: chain hashes over the client's messages.

Each user, assistant and tool message, in canonical JSON, extends `H_k = hash(H_{k-1}, m_k)`,
seeded by tenant, end user and (when sent) a client conversation id. System and developer
messages are context, not links. Because the seed carries tenant and user, two users whose
chats both start with "hi" never produce the same hash (invariant 5).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

CONTEXT_ROLES = frozenset({"system", "developer"})


def canonical_json(value: Any) -> bytes:
    """Stable bytes for a JSON value: sorted keys, no whitespace, null-valued keys dropped."""
    return orjson.dumps(_drop_nulls(value), option=orjson.OPT_SORT_KEYS)


def _drop_nulls(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _drop_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_drop_nulls(v) for v in value]
    return value


def _digest(*parts: bytes) -> str:
    h = hashlib.blake2b(digest_size=16)
    for part in parts:
        h.update(len(part).to_bytes(8, "little"))
        h.update(part)
    return h.hexdigest()


def chain_seed(tenant: str, user: str | None, conversation: str | None) -> str:
    return _digest(b"keel-chain-v1", tenant.encode(), (user or "").encode(), (conversation or "").encode())


@dataclass(frozen=True)
class Link:
    """One message of the chain: its index in `messages`, role, and chain hash so far."""

    index: int
    role: str
    hash: str


@dataclass(frozen=True)
class Chain:
    seed: str
    links: tuple[Link, ...]

    @property
    def user_links(self) -> tuple[Link, ...]:
        return tuple(link for link in self.links if link.role == "user")

    @property
    def newest_user(self) -> Link | None:
        users = self.user_links
        return users[-1] if users else None


def build_chain(seed: str, messages: Sequence[Mapping[str, Any]]) -> Chain:
    links = []
    current = seed
    for index, message in enumerate(messages):
        role = message.get("role")
        if not isinstance(role, str) or role in CONTEXT_ROLES:
            continue
        current = _digest(current.encode(), canonical_json(message))
        links.append(Link(index, role, current))
    return Chain(seed, tuple(links))
