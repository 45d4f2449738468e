"""Proof of continuity: a request continues a stored conversation when its history carries
something Keel relayed to the same caller in that conversation, that only a participant holds.

When Keel relays an answer it records a digest of each fragment of it (its text and each tool
call's id), per tenant, with the caller it was relayed to (tenant, credential, end user, the ids
the client sent, shape) and the conversation's namespace. A later request of the same caller
whose history holds one of those fragments is placed in that conversation's namespace, whatever
its system prompt says now (the change becomes a context update). A request's claims (an id, a
header) are never proof; only what Keel itself relayed, compared by meaning (whitespace and
transport form aside).

What proves nothing, and why (guessability: an adversary who shares the credential knows the
app's template, the victim's opening message and the app's canned replies, and can send the
same requests):
- a first turn: there is no answer in it to hold;
- a short text (under `MIN_SECRET_CHARS`): greetings and refusals repeat across users; a sampled
  answer of 160 characters (some 40 tokens) is not guessed;
- an answer the same request would get again (`sampled` is False): a low temperature, a
  narrow top_p or top_k, a seed, or one of n > 1 choices; anyone replaying the visible
  opening would hold it too;
- a fragment relayed to two callers of the tenant, or in two conversations: it is canned or
  reproducible, and belongs to no one (`SHARED`), whoever got it first;
- a tool call id that is not random: providers draw theirs at random whatever the temperature
  (`call_…`, `toolu_…`), but some models number them (`functions.lookup:0`, a counter), so an
  id proves only when, less its prefix and the tool's name, it has `MIN_RANDOM_CHARS`
  characters of `MIN_DISTINCT_CHARS` kinds or more.
A weak fragment is still recorded as seen (`~`), so that a strong copy of it relayed to another
caller or conversation, before or after, is known to be shared.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass

from proxy.background import Background
from proxy.jsontext import Json, JsonObject
from proxy.messages import message_text, tool_calls
from proxy.stores import KeyValue, key

log = logging.getLogger("keel.proofs")
MIN_SECRET_CHARS = 160
MIN_RANDOM_CHARS = 16
MIN_DISTINCT_CHARS = 8
LOW_TEMPERATURE = 0.3  # at or below it a long answer mostly comes out the same again
NARROW_TOP_P = 0.2
RECORD_WAIT = 0.5  # seconds an answer's last bytes wait for its record (a slow store delays, never stalls)
NEWEST_ANSWERS = 8  # assistant messages of a history looked at, newest first
SHARED = "*"
SEEN = "~"
_SPACE = re.compile(r"\s+")
_ID_PREFIX = re.compile(r"^(?:call_|toolu_(?:01)?|fc_|functions\.)")
_ALNUM = re.compile(r"[^0-9A-Za-z]")


@dataclass(frozen=True)
class Fragment:
    digest: str
    strong: bool


def random_id(call_id: str, name: str = "") -> bool:
    """Is this tool call id drawn at random (not a name, an index or a counter)?"""
    rest = _ID_PREFIX.sub("", call_id)
    if name:
        rest = rest.replace(name, "")
    rest = _ALNUM.sub("", rest)
    return len(rest) >= MIN_RANDOM_CHARS and len(set(rest)) >= MIN_DISTINCT_CHARS


def fragments(message: JsonObject, sampled: bool = True) -> list[Fragment]:
    """The fragments of one assistant message (view form); `sampled`: the request that made it
    would not make it again (see the module docstring)."""
    out = []
    text = _SPACE.sub(" ", message_text(message)).strip()
    if text:
        digest = hashlib.blake2b(b"text\0" + text.encode(errors="surrogatepass"), digest_size=16).hexdigest()
        out.append(Fragment(digest, sampled and len(text) >= MIN_SECRET_CHARS))
    for call in tool_calls(message):
        call_id = call.get("id")
        if isinstance(call_id, str) and call_id:
            function = call.get("function")
            name = function.get("name") if isinstance(function, dict) else None
            digest = hashlib.blake2b(b"call\0" + call_id.encode(errors="surrogatepass"), digest_size=16).hexdigest()
            out.append(Fragment(digest, random_id(call_id, name if isinstance(name, str) else "")))
    return out


def _number(value: Json) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def sampled(body: JsonObject) -> bool:
    """Would the same request get a different answer (so nobody can make this one again)?"""
    temperature, top_p, top_k = _number(body.get("temperature")), _number(body.get("top_p")), _number(body.get("top_k"))
    n = body.get("n")
    return not ((temperature is not None and temperature <= LOW_TEMPERATURE)
                or (top_p is not None and top_p <= NARROW_TOP_P) or (top_k is not None and top_k <= 1)
                or body.get("seed") is not None or (isinstance(n, int) and not isinstance(n, bool) and n > 1))


def history_fragments(messages: Sequence[JsonObject]) -> list[list[Fragment]]:
    """The fragments of the newest assistant messages of a history, newest first."""
    answers = [m for m in messages if m.get("role") == "assistant"][-NEWEST_ANSWERS:]
    return [fragments(m) for m in reversed(answers)]


class Proofs:
    """The record of what Keel relayed to whom: per tenant, fragment digest → the caller it went to
    and the conversation's namespace (`<caller> <namespace>`, `~` first when weak, or `*`)."""

    def __init__(self, store: KeyValue, ttl_seconds: float) -> None:
        self.store = store
        self.ttl = ttl_seconds
        self.background = Background("proof_not_recorded", log)

    def spawn(self, tenant: str, caller: str, namespace: str, relayed: Sequence[Fragment]) -> asyncio.Task[None]:
        """`record` in the background (a failure costs the next turn's proof, logged). The relay
        waits for it (`CacheAccounting.settled`, at most `RECORD_WAIT`) before the answer's last
        bytes, so a client's next request cannot overtake the record of the answer it holds."""
        return self.background.spawn(self.record(tenant, caller, namespace, relayed))

    async def drain(self) -> None:
        await self.background.drain()

    @staticmethod
    def _key(tenant: str, digest: str) -> str:
        return key(f"proofs:{tenant}", digest)

    def keys(self, tenant: str, answers: Sequence[Sequence[Fragment]]) -> list[str]:
        return [self._key(tenant, f.digest) for frags in answers for f in frags]

    @staticmethod
    def proven(caller: str, answers: Sequence[Sequence[Fragment]], values: Sequence[bytes | None]) -> str | None:
        """The namespace the newest answer with a strong, unshared fragment relayed to `caller`
        proves (`values`: what `keys` read, in order), else None."""
        found = iter(values)
        for frags in answers:
            proof = None
            for _ in frags:
                value = next(found, None)
                text = value.decode() if value else ""
                to, _, namespace = text.partition(" ")
                if namespace and to == caller:
                    proof = proof or namespace
            if proof is not None:
                return proof
        return None

    async def record(self, tenant: str, caller: str, namespace: str, relayed: Sequence[Fragment]) -> None:
        """Remember what was relayed to `caller` in `namespace`; a fragment already relayed to
        another caller or in another conversation is shared."""
        if not relayed:
            return
        keys = [self._key(tenant, f.digest) for f in relayed]
        old = await self.store.get_many(keys)
        writes: dict[str, bytes] = {}
        for name, fragment, value in zip(keys, relayed, old, strict=True):
            before = value.decode() if value else None
            mine = f"{caller} {namespace}"
            if before is None:
                writes[name] = (mine if fragment.strong else SEEN + mine).encode()
            elif before != SHARED and before.removeprefix(SEEN) != mine:
                writes[name] = SHARED.encode()
            elif before.startswith(SEEN) and fragment.strong:
                writes[name] = mine.encode()
        for name, value in writes.items():
            await self.store.set(name, value, self.ttl)


def relayed_fragments(answers: Sequence[Json], request_body: JsonObject) -> list[Fragment]:
    """The fragments of the assistant messages Keel relayed for a request."""
    strong = sampled(request_body)
    out: list[Fragment] = []
    for message in answers:
        if isinstance(message, dict):
            out += fragments(message, strong)
    return out
