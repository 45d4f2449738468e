"""The planner pipeline: an explicit ordered list of stages, each allowed to fail.

A planner returns a new `Turn` or the same object. Every stage, and the steps around
them (finding the turn in its conversation, writing its record), runs through one guard:
a stage that raises or overruns its deadline is logged with its name, counted, and
skipped, so its part of the request stays as the client sent it (invariant 4: no feature
failure fails a turn). A planner for which "as the client sent it" would cost far more than
planning (the tool planner: a whole catalog instead of a few tools) also plans `afresh`, from
the request alone: after its stage failed, and whenever the conversation cannot be read (the
store down or slow, a body the chain cannot hash), when every other planner is skipped. The
memory planner does too: its job waits for the store after the answer, so a slow store loses
no memory ask.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from typing import Protocol, TypeVar, runtime_checkable

from proxy.chain import ContextDigests, Meanings, namespace
from proxy.config import STAGE_DEADLINE, TenantConfig
from proxy.conversations import Conversations, TurnKind
from proxy.metrics import Metrics
from proxy.proofs import history_fragments
from proxy.turn import Turn

log = logging.getLogger("keel.pipeline")
T = TypeVar("T")


class Planner(Protocol):
    name: str
    # Planners this one must run after, when present: the order is data the pipeline checks.
    after: tuple[str, ...]

    def applies(self, request: Turn) -> bool:
        """Whether this planner has anything to do for the request's tenant (cheap, no I/O)."""
        ...

    async def plan(self, request: Turn) -> Turn: ...


@runtime_checkable
class ForTenant(Planner, Protocol):
    """A planner that can tell from the tenant alone that it never applies (its feature is off),
    so a tenant with every feature off is read without building anything the planners need."""

    def for_tenant(self, tenant: TenantConfig) -> bool:
        """False when no request of this tenant can ever need this planner."""
        ...


@runtime_checkable
class PlansAfresh(Planner, Protocol):
    """A planner that can plan without stored state, so a store outage or its own stage's
    failure never sends the client's much larger request instead."""

    async def afresh(self, request: Turn) -> Turn:
        """Planned from the request alone: no store call, nothing slow."""
        ...


def check_order(planners: Sequence[Planner]) -> None:
    """Refuse a planner list in which a planner comes before one it must run after."""
    seen: set[str] = set()
    names = {p.name for p in planners}
    for planner in planners:
        missing = [n for n in planner.after if n in names and n not in seen]
        if missing:
            raise ValueError(f"planner {planner.name!r} must run after {', '.join(missing)}")
        seen.add(planner.name)


class Pipeline:
    def __init__(self, planners: Sequence[Planner], metrics: Metrics, conversations: Conversations,
                 store_healthy: Callable[[], bool] = lambda: True, deadline: float = STAGE_DEADLINE) -> None:
        check_order(planners)
        self.planners = tuple(planners)
        self.metrics = metrics
        self.conversations = conversations
        self.store_healthy = store_healthy
        self.deadline = deadline
        self.digests = ContextDigests()
        self._might: dict[str, bool] = {}

    def plans(self, request: Turn) -> bool:
        """Would any planner act on this turn? (None: it goes upstream as the client sent it.)"""
        return any(p.applies(request) for p in self.planners)

    def might_plan(self, tenant: TenantConfig) -> bool:
        """Could any planner act on some request of this tenant? (Config is fixed: asked once.)"""
        found = self._might.get(tenant.id)
        if found is None:
            found = self._might[tenant.id] = any(not isinstance(p, ForTenant) or p.for_tenant(tenant)
                                                 for p in self.planners)
        return found

    async def run(self, request: Turn, stateless: bool = False) -> Turn:
        """Plan the turn; `stateless`: with nothing read or written to the store (a caller Keel
        stores nothing for yet), only the planners that plan from the request alone."""
        active = [p for p in self.planners if p.applies(request)]
        if not active or not request.plannable:
            return request
        if stateless:
            return await self._afresh(active, request)
        located = None
        if self.store_healthy():
            located = await self.guard("locate", request, self._locate(request))
        else:  # the breaker is open: nothing stored is read until the store recovers
            self.metrics.planner_failures.labels(request.tenant.id, "store_unavailable").inc()
        if located is None:
            return await self._afresh(active, request)
        request = located
        for planner in active:
            planned = await self.guard(planner.name, request, planner.plan(request))
            if planned is None and isinstance(planner, PlansAfresh):
                planned = await self.guard(planner.name + "_afresh", request, planner.afresh(request))
            if planned is not None:
                request = planned
        await self.guard("record", request, self._record(request))
        return request

    async def _afresh(self, active: Sequence[Planner], request: Turn) -> Turn:
        """Without the conversation: only the planners that plan from the request alone."""
        for planner in active:
            if isinstance(planner, PlansAfresh):
                planned = await self.guard(planner.name + "_afresh", request, planner.afresh(request))
                request = planned if planned is not None else request
        return request

    def guarded(self, stage: str, request: Turn, work: Callable[[], Awaitable[T]]) -> Callable[[], Awaitable[T | None]]:
        """`work`, to be run later under `guard` (work that waits for the upstream's acceptance)."""
        return lambda: self.guard(stage, request, work())

    async def guard(self, stage: str, request: Turn, work: Awaitable[T]) -> T | None:
        """Run one stage hook within the deadline; on failure log, count, and return None."""
        try:
            async with asyncio.timeout(self.deadline):  # no task per stage, unlike wait_for
                return await work
        except Exception as exc:
            log.warning("stage_failed", exc_info=not isinstance(exc, TimeoutError),
                        extra={"stage": stage, "tenant": request.tenant.id, "request_id": request.request_id,
                               "error": repr(exc)})
            self.metrics.planner_failures.labels(request.tenant.id, stage).inc()
            return None

    async def _record(self, request: Turn) -> None:
        """Write the newest turn's record with what the planners decided (on a regeneration only
        when the client edited its context since and proved the conversation: the new update
        replaces the old; an unproven regeneration, a first turn's, writes nothing)."""
        location = request.location
        if location is None or not request.record:
            return
        if location.kind in (TurnKind.NEW, TurnKind.CONTINUED):
            record = self.conversations.new_record(location, request.record)
        elif location.newest_record is not None and request.notes.get("context_edited") and location.proven:
            # a regeneration after an edit, by a requester who proved the conversation is theirs
            record = request.record.applied(location.newest_record)
        else:
            return
        await self.conversations.write_turn(location.chain, record)

    async def _locate(self, request: Turn) -> Turn:
        """Find the turn in its conversation once, for every planner."""
        return await locate(self.conversations, request, self.digests)


async def locate(conversations: Conversations, request: Turn, digests: ContextDigests | None = None) -> Turn:
    """The turn with its location: the caller, its system prompt (exact; clock-masked when the
    client names the conversation), the meaning of each message and the proofs its history holds."""
    text = request.context_text
    masked = request.conversation_id is not None
    context = digests.digest(text, masked) if digests is not None else ContextDigests().digest(text, masked)
    location = await conversations.locate(Meanings.of(request.messages), request.caller_seed, context,
                                          history_fragments(request.messages), request.conversation_label,
                                          request.tenant.id)
    return replace(request, location=location)


def unstored(conversations: Conversations, request: Turn, digests: ContextDigests | None = None) -> Turn:
    """The turn with the location it has when no stored state can be read: its own namespace,
    a new segment (what `locate` finds for a conversation the store has never seen)."""
    context = (digests or ContextDigests(1)).digest(request.context_text, request.conversation_id is not None)
    chain = Meanings.of(request.messages).chain(namespace(request.caller_seed, context))
    return replace(request, location=conversations.unknown(chain, request.conversation_label, request.caller_seed,
                                                           context))
