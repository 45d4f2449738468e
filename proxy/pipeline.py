"""The planner pipeline: an explicit ordered list of stages, each allowed to fail.

A planner returns a new `ChatRequest` or the same object. A planner that raises is logged
with its name, counted, and skipped: its part of the request stays as the client sent it
(invariant 4: no feature failure fails a turn).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Protocol

from proxy.ingress import ChatRequest
from proxy.metrics import Metrics

log = logging.getLogger("keel.pipeline")


class Planner(Protocol):
    name: str

    async def plan(self, request: ChatRequest) -> ChatRequest: ...


class Pipeline:
    def __init__(self, planners: Sequence[Planner], metrics: Metrics) -> None:
        self.planners = tuple(planners)
        self.metrics = metrics

    async def run(self, request: ChatRequest) -> ChatRequest:
        for planner in self.planners:
            try:
                request = await planner.plan(request)
            except Exception:
                log.exception(
                    "planner_failed",
                    extra={"planner": planner.name, "tenant": request.tenant.id, "request_id": request.request_id},
                )
                self.metrics.planner_failures.labels(request.tenant.id, planner.name).inc()
        return request
