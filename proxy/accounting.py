"""Cache accounting: what the upstream says it served from its prompt cache, per request,
and what the client was answered.

Read from a whole JSON body or watched on an SSE stream (the usage chunk; Responses' and
Messages' usage inside their events), normalized once (`proxy.usage`), counted per tenant in
/metrics, logged per conversation, explained when a turn Keel expected to hit the cache did
not (at info when Keel planned the miss and a note says why), and handed to the turn's
savings meter. The answer the client got is recorded as relayed to this caller in this
conversation (`proxy.proofs`): what a later request proves its continuity with.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Mapping, Sequence

import orjson

from proxy.conversations import TurnKind
from proxy.jsontext import Json, JsonObject
from proxy.messages import Message
from proxy.metrics import Metrics
from proxy.proofs import RECORD_WAIT, Proofs, relayed_fragments
from proxy.rounds.readers import AnswerReader
from proxy.savings.meter import TurnMeter
from proxy.sse import EventParser
from proxy.turn import Turn

log = logging.getLogger("keel.cache")
_LAST_EVENT = re.compile(rb'"type": ?"(?:response\.(?:completed|failed|incomplete)|message_stop)"')
MIN_CACHEABLE = 1024  # below this no provider caches anything: a miss is no news
# Notes of a prefix Keel changed on purpose (the tool planner's): a miss they explain was planned.
# Other notes (anchor_lost: the store lost state) explain a miss Keel did not want.
PLANNED_NOTES = frozenset({"tool_block_grew", "tool_block_rechosen", "tool_block_chosen_per_turn", "context_edited"})


class CacheAccounting:
    """One turn's usage: `record` runs once, with the usage of every round summed."""

    def __init__(self, metrics: Metrics, request: Turn, meter: TurnMeter | None = None,
                 proofs: Proofs | None = None) -> None:
        self.metrics = metrics
        self.request = request
        self.meter = meter
        self.proofs = proofs if request.location is not None and request.location.caller else None
        self._parser: EventParser | None = None
        self._usage: JsonObject | None = None
        self._answer = AnswerReader(request.shape.framings()) if self.proofs is not None else None
        self._recording: asyncio.Task[None] | None = None
        self._finished = False
        self.ended = False  # the stream's last event was read (see `watch`)

    def from_body(self, body: bytes) -> Mapping[str, str]:
        try:
            usage = orjson.loads(body).get("usage")
        except (orjson.JSONDecodeError, AttributeError):
            return {}
        return self.record(usage, shown=self._read_answer(body))

    def _read_answer(self, body: bytes) -> Message | None:
        if self._answer is None:
            return None
        try:
            return self._answer.body(body)
        except Exception as exc:  # an answer Keel misreads is not recorded: the next turn proves nothing by it
            log.warning("answer_unread", extra={"error": repr(exc)})
            return None

    def watch(self, chunk: bytes) -> None:
        """Feed a streamed chunk; the usage seen is recorded by `finish`. A Messages stream
        reports input in `message_start` and output in `message_delta`: merged. `ended` turns
        true once the stream's last event has been read whole (its usage with it)."""
        if self._parser is None:
            self._parser = EventParser()
        for event in self._parser.feed(chunk):
            if event.done or (event.data and _LAST_EVENT.search(event.data[:200])):
                self.ended = True
            if self._answer is not None:
                try:
                    self._answer.feed(event)
                except Exception as exc:  # as above
                    log.warning("answer_unread", extra={"error": repr(exc)})
                    self._answer = None
            if event.data and b'"usage":{' in event.data:
                data = event.json()
                if not isinstance(data, dict):
                    continue
                for holder in (data, data.get("message"), data.get("response")):
                    if isinstance(holder, dict) and isinstance(holder.get("usage"), dict):
                        self._usage = {**(self._usage or {}), **holder["usage"]}

    async def settled(self) -> None:
        """Wait (briefly) for the record of what was relayed: called before the answer's last bytes."""
        if self._recording is not None and not self._recording.done():
            await asyncio.wait({self._recording}, timeout=RECORD_WAIT)

    def finish(self) -> None:
        if self._finished:
            return
        self._finished = True
        shown = None
        if self._answer is not None:
            try:
                shown = self._answer.shown()
            except Exception as exc:  # as above
                log.warning("answer_unread", extra={"error": repr(exc)})
        if self._usage is not None:
            self.record(self._usage, shown=shown)
            self._usage = None
        elif shown is not None:
            self.relayed(shown)

    def relayed(self, shown: Message | None) -> None:
        """Record the answer the client got as relayed to this caller in this conversation."""
        location = self.request.location
        if self.proofs is None or shown is None or location is None:
            return
        fragments = relayed_fragments([shown], self.request.body)
        if fragments:
            self._recording = self.proofs.spawn(self.request.tenant.id, location.caller, location.chain.seed,
                                                fragments)
        self.proofs = None  # once per turn

    def record(self, usage: Json, rounds: int = 0, first: Json = None, calls: Sequence[Json] = (),
               found: Sequence[str] = (), shown: Message | None = None) -> Mapping[str, str]:
        """`usage`: summed over every upstream call of the turn; `first`: the first call's alone
        (when Keel answered tool_search, `rounds` times); `calls`: the client's own tool calls
        in the answer; `found`: tools the searches surfaced; `shown`: the answer the client got."""
        self.relayed(shown)
        shape = self.request.shape
        read = shape.usage(usage)
        if read is None:
            return {}
        tenant = self.request.tenant.id
        headers = self.metrics.observe_usage(tenant, read)
        if self.meter is not None:
            self.meter.finish(read, shape.usage(first) if first is not None else None, rounds, calls, found)
        location = self.request.location
        fields = {"tenant": tenant, "request_id": self.request.request_id,
                  "conversation": location.conversation if location else None,
                  "segment": location.segment if location else None, "prompt_tokens": read.input,
                  "cached_tokens": read.cached}
        log.info("cache_usage", extra=fields)
        if location is not None and location.kind is not TurnKind.NEW and read.cached == 0 and read.input >= MIN_CACHEABLE:
            reasons = [k for k, v in self.request.notes.items() if v] or ["none Keel can see (evicted upstream?)"]
            planned = all(r in PLANNED_NOTES for r in reasons)
            log.log(logging.INFO if planned else logging.WARNING, "cache_miss",
                    extra={**fields, "reasons": reasons, "planned": planned})
        return headers
