"""Conversation identity by content: chain hashes over what the client's messages mean.

Each user, assistant and tool message extends `H_k = hash(H_{k-1}, meaning(m_k))`. System and
developer messages are context, not links. A message's meaning is what survives the ways
clients re-serialize what they received: cache markers, a one-text-block list or a string,
null and empty fields an SDK adds or drops, a call's arguments by value (52.0 is 52) — so a
Claude Code session whose client moves its cache marks every turn stays one chain.

The seed says whose conversation it is (invariant 5). The caller's seed: the tenant, a digest
of the credential, the end user, a conversation id and cache key the client sent, the shape.
A conversation lives in a namespace: the caller's seed and the exact system prompt it began
with. A request with no proof of continuity (see `proxy.proofs`) is located in the namespace of
its own exact system prompt; a proof moves it into the namespace of the conversation it proves.
Two users whose chats both start with "hi" never share a hash; one user's second chat under
another system prompt shares nothing without proof.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import orjson

from proxy.codecs import KEEL
from proxy.context.sections import mask_clock
from proxy.jsontext import Json, canonical

CONTEXT_ROLES = frozenset({"system", "developer"})
canonical_json = canonical
_TRANSPORT = frozenset({"cache_control", KEEL, "index"})  # how a message travelled, not what it says


def _digest(*parts: bytes) -> str:
    h = hashlib.blake2b(digest_size=16)
    for part in parts:
        h.update(len(part).to_bytes(8, "little"))
        h.update(part)
    return h.hexdigest()


def caller_seed(tenant: str, user: str | None, conversation: str | None, *, scope: str = "",
                cache_key: str | None = None, tag: bytes = b"") -> str:
    """Who is asking: `scope` is the caller's credential digest; `tag` the API shape's
    (`Shape.chain_tag`: a conversation is rendered in one shape, never another's)."""
    parts = [b"keel-chain-v3", tenant.encode(), scope.encode(), (user or "").encode(), (conversation or "").encode(),
             (cache_key or "").encode(), tag]
    return _digest(*parts)


def context_digest(text: str) -> str:
    """The exact system prompt's digest: a namespace is as specific as what the caller sent."""
    return hashlib.blake2b(text.encode(errors="surrogatepass"), digest_size=16).hexdigest() if text else ""


def namespace(caller: str, context: str) -> str:
    """A conversation's namespace: the caller and the exact system prompt it began with."""
    return _digest(b"namespace", caller.encode(), context.encode())


def chain_seed(tenant: str, user: str | None, conversation: str | None, *, scope: str = "",
               cache_key: str | None = None, context: str = "", tag: bytes = b"") -> str:
    """The namespace of a conversation that began with the system prompt whose digest is `context`."""
    return namespace(caller_seed(tenant, user, conversation, scope=scope, cache_key=cache_key, tag=tag), context)


def _plain(value: Json) -> Json:
    """A JSON value less transport: no cache marks or Keel keys, no null or empty members, whole
    floats as integers, a list of text parts as one string."""
    if isinstance(value, dict):
        if value.get("type") == "opaque" and KEEL in value:  # a codec's wrapper of a block it keeps as sent
            return _plain(value.get("part"))
        out = {k: _plain(v) for k, v in value.items() if k not in _TRANSPORT}
        return {k: v for k, v in out.items() if v is not None and v != [] and v != {}}
    if isinstance(value, list):
        items = [_plain(v) for v in value]
        if items and all(isinstance(i, dict) and set(i) == {"type", "text"} and i["type"] == "text" for i in items):
            return "".join(str(i["text"]) for i in items if isinstance(i, dict))
        return items
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return int(value)
    return value


def _call(call: Json) -> Json:
    """A tool call by what it does: id, name and arguments by value (not their JSON text)."""
    if not isinstance(call, dict):
        return _plain(call)
    function = call.get("function")
    if not isinstance(function, dict):
        return _plain(call)
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        with contextlib.suppress(orjson.JSONDecodeError):  # not JSON: compared as the text it is
            arguments = orjson.loads(arguments)
    return _plain({"id": call.get("id"), "name": function.get("name"), "arguments": arguments})


def meaning(message: Mapping[str, Json]) -> bytes:
    """What a message says, whatever form it travelled in, as canonical JSON."""
    out: dict[str, Json] = {}
    for name, value in message.items():
        if name in _TRANSPORT:
            continue
        if name == "tool_calls" and isinstance(value, list):
            plain: Json = [_call(c) for c in value]
        else:
            plain = _plain(value)
        if plain is None or plain == [] or plain == {} or plain == "":
            continue
        out[name] = plain
    return canonical_json(out)


class ContextDigests:
    """A system prompt's digest for its namespace, computed once per distinct prompt: exact, or
    with its clock readings masked for a client that names the conversation (its id, within its
    credential, says a ticking clock is the same conversation; without one a clock-shaped value
    may be the only thing telling two callers apart). Masking a long prompt costs milliseconds."""

    def __init__(self, size: int = 4096) -> None:
        self._size = size
        self._known: dict[tuple[str, bool], str] = {}

    def digest(self, text: str, masked: bool = False) -> str:
        found = self._known.get((text, masked))
        if found is None:
            found = context_digest(mask_clock(text) if masked else text)
            if len(self._known) >= self._size:
                self._known.pop(next(iter(self._known)))
            self._known[(text, masked)] = found
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


@dataclass(frozen=True)
class Meanings:
    """The links' message meanings, computed once per request: a chain in any namespace is then
    a few hashes (the locate step may try two)."""

    links: tuple[tuple[int, str, bytes], ...]  # index, role, meaning

    @classmethod
    def of(cls, messages: Sequence[Mapping[str, Json]]) -> Meanings:
        links = []
        for index, message in enumerate(messages):
            role = message.get("role")
            if not isinstance(role, str) or role in CONTEXT_ROLES:
                continue
            links.append((index, role, meaning(message)))
        return cls(tuple(links))

    def chain(self, seed: str) -> Chain:
        out = []
        current = seed
        for index, role, said in self.links:
            current = _digest(current.encode(), said)
            out.append(Link(index, role, current))
        return Chain(seed, tuple(out))


def build_chain(seed: str, messages: Sequence[Mapping[str, Json]]) -> Chain:
    return Meanings.of(messages).chain(seed)
