"""Proof of continuity: a request continues a stored conversation when its history carries
something Keel relayed to the same caller in that conversation, that only a participant holds.

When Keel relays an answer it records, under the caller's seed (tenant, credential, end
user, the ids the client sent, shape), a digest of each fragment of it: its text and each tool
call's id. A later request of the same caller whose history holds one of those fragments is
placed in that conversation's namespace, whatever its system prompt says now (the change
becomes a context update). A request's claims (an id, a header) are never proof; only what
Keel itself relayed, compared by meaning (whitespace and transport form aside).

What proves nothing, and why (guessability: an adversary who shares the credential knows the
app's template, the victim's opening message and the app's canned replies):
- a first turn: there is no answer in it to hold;
- a short text (under `MIN_SECRET_CHARS`): greetings and refusals repeat across users; a sampled
  answer of 160 characters (some 40 tokens) is not guessed;
- an answer the caller could have made again: a request near-greedy (temperature at most
  `GREEDY_TEMPERATURE`) gets the same text for the same history, so anyone replaying the
  visible opening would hold it too; likewise one of n > 1 choices (chosen by the client,
  not known to Keel);
- a fragment relayed in two conversations: it belongs to neither (`SHARED`).
A weak fragment is still recorded as seen (`~` + namespace), so that a strong copy of it relayed
in another conversation, before or after, is known to be shared. A tool call id is strong on
its own when it is long enough to be random (`MIN_CALL_ID_CHARS`): providers draw them at
random whatever the temperature.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass

from proxy.jsontext import Json, JsonObject
from proxy.messages import tool_calls
from proxy.stores import Store, key

log = logging.getLogger("keel.proofs")
MIN_SECRET_CHARS = 160
MIN_CALL_ID_CHARS = 20
GREEDY_TEMPERATURE = 0.05
RECORD_WAIT = 0.5  # seconds an answer's last bytes wait for its record (a slow store delays, never stalls)
NEWEST_ANSWERS = 8  # assistant messages of a history looked at, newest first
SHARED = "*"
SEEN = "~"
_SPACE = re.compile(r"\s+")


@dataclass(frozen=True)
class Fragment:
    digest: str
    strong: bool


def _text(message: JsonObject) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p["text"] for p in content
                       if isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str))
    return ""


def fragments(message: JsonObject, sampled: bool = True) -> list[Fragment]:
    """The fragments of one assistant message (view form); `sampled`: the request that made it
    was neither near-greedy nor one of several choices (see the module docstring)."""
    out = []
    text = _SPACE.sub(" ", _text(message)).strip()
    if text:
        digest = hashlib.blake2b(b"text\0" + text.encode(errors="surrogatepass"), digest_size=16).hexdigest()
        out.append(Fragment(digest, sampled and len(text) >= MIN_SECRET_CHARS))
    for call in tool_calls(message):
        call_id = call.get("id")
        if isinstance(call_id, str) and call_id:
            digest = hashlib.blake2b(b"call\0" + call_id.encode(errors="surrogatepass"), digest_size=16).hexdigest()
            out.append(Fragment(digest, len(call_id) >= MIN_CALL_ID_CHARS))
    return out


def sampled(body: JsonObject) -> bool:
    """Was the answer to this request drawn at random (so nobody can make it again)?"""
    temperature = body.get("temperature")
    greedy = isinstance(temperature, (int, float)) and not isinstance(temperature, bool) and (
        temperature <= GREEDY_TEMPERATURE)
    n = body.get("n")
    return not greedy and not (isinstance(n, int) and n > 1)


def history_fragments(messages: Sequence[JsonObject]) -> list[list[Fragment]]:
    """The fragments of the newest assistant messages of a history, newest first."""
    answers = [m for m in messages if m.get("role") == "assistant"][-NEWEST_ANSWERS:]
    return [fragments(m) for m in reversed(answers)]


class Proofs:
    """The record of what Keel relayed to whom: fragment digest → the conversation's namespace."""

    def __init__(self, store: Store, ttl_seconds: float) -> None:
        self.store = store
        self.ttl = ttl_seconds
        self._tasks: set[asyncio.Task[None]] = set()

    def spawn(self, caller: str, namespace: str, relayed: Sequence[Fragment]) -> asyncio.Task[None]:
        """`record` in the background (a failure costs the next turn's proof, logged). The relay
        waits for it (`CacheAccounting.settled`, at most `RECORD_WAIT`) before the answer's last
        bytes, so a client's next request cannot overtake the record of the answer it holds."""

        async def guarded() -> None:
            try:
                await self.record(caller, namespace, relayed)
            except Exception as exc:
                log.warning("proof_not_recorded", extra={"error": repr(exc)})

        task = asyncio.get_running_loop().create_task(guarded())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def drain(self) -> None:
        """Wait for the records in flight (shutdown, tests)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    @staticmethod
    def _key(caller: str, digest: str) -> str:
        return key(caller, "proof", digest)

    def keys(self, caller: str, answers: Sequence[Sequence[Fragment]]) -> list[str]:
        return [self._key(caller, f.digest) for frags in answers for f in frags]

    @staticmethod
    def proven(answers: Sequence[Sequence[Fragment]], values: Sequence[bytes | None]) -> str | None:
        """The namespace the newest answer with a strong, unshared fragment proves (`values`:
        what `keys` read, in order), else None."""
        found = iter(values)
        for frags in answers:
            proof = None
            for _ in frags:
                value = next(found, None)
                text = value.decode() if value else ""
                if text and text != SHARED and not text.startswith(SEEN):
                    proof = proof or text
            if proof is not None:
                return proof
        return None

    async def record(self, caller: str, namespace: str, relayed: Sequence[Fragment]) -> None:
        """Remember what was relayed in `namespace`; a fragment already known elsewhere is shared."""
        if not relayed:
            return
        keys = [self._key(caller, f.digest) for f in relayed]
        old = await self.store.get_many(keys)
        writes: dict[str, bytes] = {}
        for name, fragment, value in zip(keys, relayed, old, strict=True):
            before = value.decode() if value else None
            mine = namespace if fragment.strong else SEEN + namespace
            if before is None:
                writes[name] = mine.encode()
            elif before != SHARED and before.removeprefix(SEEN) != namespace:
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
