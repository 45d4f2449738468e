"""Before the turn: whose memory applies, and the after-turn job for the newest user message."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace

from proxy.codecs import strip_keel
from proxy.config import TenantConfig
from proxy.conversations import Conversations, TurnKind
from proxy.jsontext import JsonObject
from proxy.memory.intake import MemoryIntake
from proxy.memory.jobs import MemoryJob
from proxy.pipeline import unstored
from proxy.turn import Turn

CHAT_ROLES = ("system", "developer", "user", "assistant", "tool")


def memory_user(request: Turn) -> str | None:
    """Whose memory applies, or None (no user, memory off, or switched off per request).

    For a passthrough tenant the owner is the end user *under the caller's credential*: a
    provider key proves nothing about who the user is, so another key never reaches it. A
    caller with no credential at all (a keyless upstream) proves nothing about anyone: no
    memory, unless the tenant says its keyless callers share memory by user name."""
    if not request.tenant.memory.enabled or request.headers.get("x-keel-memory", "").lower() == "off":
        return None
    user = request.end_user
    if user is None:
        return None
    scope = request.memory_scope
    if scope is None:
        if not request.tenant.memory.keyless:
            return None
        scope = "keyless"
    return f"{scope}/{user}" if scope else user


def job_window(messages: Sequence[JsonObject]) -> list[JsonObject]:
    """The messages a job keeps, as the memory model (a Chat Completions call) may get them.

    They are the planners' view of the turn, whatever its shape: without Keel's own bookkeeping
    (`_keel`, and the wrappers of parts a codec keeps as sent) and without items that are no chat
    message. Nothing internal ever goes upstream."""
    window: list[JsonObject] = []
    for message in messages:
        plain = strip_keel(message)
        if not isinstance(plain, dict) or plain.get("role") not in CHAT_ROLES:
            continue
        content = plain.get("content")
        if isinstance(content, list):
            plain["content"] = [p for p in content if not (isinstance(p, dict) and p.get("type") == "opaque")]
        window.append(plain)
    return window


class MemoryPlanner:
    name = "memory"
    after: tuple[str, ...] = ("tools",)  # the job holds the messages as the client sent them, hidden exchanges spliced

    def __init__(self, intake: MemoryIntake, conversations: Conversations) -> None:
        self.intake, self.conversations = intake, conversations

    def applies(self, request: Turn) -> bool:
        return memory_user(request) is not None

    def for_tenant(self, tenant: TenantConfig) -> bool:
        return tenant.memory.enabled

    async def plan(self, request: Turn) -> Turn:
        location, user = request.location, memory_user(request)
        newest = location.chain.newest_user if location else None
        if location is None or newest is None or user is None or location.kind is TurnKind.REGENERATED:
            return request
        cfg = request.tenant.memory.gate
        window = job_window(request.client_messages[max(0, newest.index - cfg.context_messages) : newest.index + 1])
        job = MemoryJob(request.tenant.id, user, newest.hash, window, time.time())
        return request.with_on_accepted(lambda: self.intake.submit(job))  # a turn the upstream refuses queues nothing

    async def afresh(self, request: Turn) -> Turn:
        """Without stored state (the store slow or down): the job all the same, on the place the
        turn has without it, and the turn otherwise as it was; a memory ask never depends on a read."""
        planned = await self.plan(unstored(self.conversations, request))
        return replace(request, on_accepted=planned.on_accepted)
