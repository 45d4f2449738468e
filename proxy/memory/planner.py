"""Before the turn: whose memory applies, and the after-turn job for the newest user message."""

from __future__ import annotations

import time

from proxy.conversations import TurnKind
from proxy.memory.jobs import MemoryJob, MemoryJobs
from proxy.turn import Turn


def memory_user(request: Turn) -> str | None:
    """Whose memory applies, or None (no user, memory off, or switched off per request).

    For a passthrough tenant the owner is the end user *under the caller's credential*: a
    provider key proves nothing about who the user is, so another key never reaches it."""
    if not request.tenant.memory.enabled or request.headers.get("x-keel-memory", "").lower() == "off":
        return None
    user = request.end_user
    if user is None:
        return None
    return f"{request.memory_scope}/{user}" if request.memory_scope else user


class MemoryPlanner:
    name = "memory"
    after: tuple[str, ...] = ("tools",)  # the job holds the messages as the client sent them, hidden exchanges spliced

    def __init__(self, jobs: MemoryJobs) -> None:
        self.jobs = jobs

    def applies(self, request: Turn) -> bool:
        return memory_user(request) is not None

    async def plan(self, request: Turn) -> Turn:
        location, user = request.location, memory_user(request)
        newest = location.chain.newest_user if location else None
        if location is None or newest is None or user is None or location.kind is TurnKind.REGENERATED:
            return request
        cfg = request.tenant.memory.gate
        window = list(request.client_messages[max(0, newest.index - cfg.context_messages) : newest.index + 1])
        await self.jobs.enqueue(MemoryJob(request.tenant.id, user, newest.hash, window, time.time()))
        return request
