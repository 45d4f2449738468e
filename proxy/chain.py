"""Conversation identity by content: chain hashes over the client's messages.

Each user, assistant and tool message, in canonical JSON, extends `H_k = hash(H_{k-1}, m_k)`.
System and developer messages are context, not links. The seed says whose conversation it
is, so that stored state is reused only by a request that proves it belongs there
(invariant 5): the tenant; for a passthrough tenant, a digest of the caller's credential;
the end user; the client's conversation id; and, unless the client names the conversation
explicitly, the system prompt with its timestamps masked. Two users whose chats both start
with "hi" never share a hash, and neither does one user's second chat under another
system prompt: without proof, Keel starts a new conversation (a cache miss, never a leak).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from proxy.context.sections import mask_clock
from proxy.jsontext import Json, canonical

CONTEXT_ROLES = frozenset({"system", "developer"})
canonical_json = canonical


def _digest(*parts: bytes) -> str:
    h = hashlib.blake2b(digest_size=16)
    for part in parts:
        h.update(len(part).to_bytes(8, "little"))
        h.update(part)
    return h.hexdigest()


def chain_seed(tenant: str, user: str | None, conversation: str | None, *, scope: str = "",
               cache_key: str | None = None, context: str | None = None, shape: str = "chat") -> str:
    """`scope`: the caller's credential digest; `context`: the masked system prompt's digest
    (`ContextDigests`), part of the seed unless `conversation` is given; `shape`: the API shape
    (a conversation is rendered in one shape, never another's)."""
    parts = [b"keel-chain-v2", tenant.encode(), scope.encode(), (user or "").encode(), (conversation or "").encode(),
             (cache_key or "").encode(), b"" if conversation else (context or "").encode(),
             b"" if shape == "chat" else shape.encode()]
    return _digest(*parts)


class ContextDigests:
    """The digest of a system prompt with its clock readings masked, computed once per distinct
    prompt (masking a long prompt costs milliseconds; hashing it, microseconds). Only a ticking
    clock is masked: anything else that differs (a date of birth, a phone number) is another
    conversation."""

    def __init__(self, size: int = 4096) -> None:
        self._size = size
        self._known: OrderedDict[bytes, str] = OrderedDict()

    def digest(self, text: str) -> str:
        if not text:
            return ""
        exact = hashlib.blake2b(text.encode(), digest_size=16).digest()
        found = self._known.get(exact)
        if found is None:
            found = self._known[exact] = _digest(b"context", mask_clock(text).encode())
            if len(self._known) > self._size:
                self._known.popitem(last=False)
        return found


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


def build_chain(seed: str, messages: Sequence[Mapping[str, Json]]) -> Chain:
    links = []
    current = seed
    for index, message in enumerate(messages):
        role = message.get("role")
        if not isinstance(role, str) or role in CONTEXT_ROLES:
            continue
        current = _digest(current.encode(), canonical_json(message))
        links.append(Link(index, role, current))
    return Chain(seed, tuple(links))
