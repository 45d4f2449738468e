"""The planner pipeline: an explicit ordered list of stages, each allowed to fail.

A planner returns a new `ChatRequest` or the same object. A planner that raises is logged
with its name, counted, and skipped: its part of the request stays as the client sent it
(invariant 4: no feature failure fails a turn).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from starlette.responses import Response

from proxy.chain import build_chain
from proxy.conversations import Conversations, TurnKind
from proxy.ingress import ChatRequest
from proxy.metrics import Metrics
from proxy.relay import Outcome
from proxy.stores import StoreError
from proxy.upstream import UpstreamResponse

log = logging.getLogger("keel.pipeline")


class Planner(Protocol):
    name: str

    def applies(self, request: ChatRequest) -> bool:
        """Whether this planner has anything to do for the request's tenant (cheap, no I/O)."""
        ...

    async def plan(self, request: ChatRequest) -> ChatRequest: ...


@dataclass(frozen=True)
class Exchange:
    """What a responder needs from the app: a way to call the upstream, and to report the outcome."""

    send: Callable[[bytes], Awaitable[UpstreamResponse]]
    request_id: str
    done: Callable[[Outcome], None]


class Responder(Protocol):
    """A planner's hand on the response: it calls the upstream (maybe several times) and
    builds what the client gets."""

    async def respond(self, request: ChatRequest, exchange: Exchange) -> Response: ...


class Pipeline:
    def __init__(self, planners: Sequence[Planner], metrics: Metrics, conversations: Conversations) -> None:
        self.planners = tuple(planners)
        self.metrics = metrics
        self.conversations = conversations

    async def run(self, request: ChatRequest) -> ChatRequest:
        active = [p for p in self.planners if p.applies(request)]
        if not active:
            return request
        request = await self._locate(request)
        for planner in active:
            try:
                request = await planner.plan(request)
            except Exception:
                log.exception(
                    "planner_failed",
                    extra={"planner": planner.name, "tenant": request.tenant.id, "request_id": request.request_id},
                )
                self.metrics.planner_failures.labels(request.tenant.id, planner.name).inc()
        await self._record(request)
        return request

    async def _record(self, request: ChatRequest) -> None:
        """Write the newest turn's record with what the planners decided (never on a regeneration)."""
        location = request.location
        if location is None or not request.record_fields or location.kind not in (TurnKind.NEW, TurnKind.CONTINUED):
            return
        try:
            record = self.conversations.new_record(location, **request.record_fields)
            await self.conversations.write_turn(location.chain, record)
        except StoreError:
            log.warning("turn_record_not_stored", extra={"tenant": request.tenant.id, "request_id": request.request_id})
            self.metrics.planner_failures.labels(request.tenant.id, "record").inc()

    async def _locate(self, request: ChatRequest) -> ChatRequest:
        """Find the turn in its conversation once, for every planner; a store failure only
        costs the planners their history (the turn is treated as new)."""
        chain = build_chain(request.chain_seed, request.messages)
        try:
            location = await self.conversations.locate(chain, request.conversation_id)
        except StoreError:
            log.warning("store_unavailable", extra={"tenant": request.tenant.id, "request_id": request.request_id})
            self.metrics.planner_failures.labels(request.tenant.id, "locate").inc()
            location = self.conversations.unknown(chain, request.conversation_id)
        return replace(request, location=location)
