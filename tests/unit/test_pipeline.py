"""proxy/pipeline.py on its own: the planner loop's order, its guard (a failing or overrunning
stage is skipped and counted), and the stateless path (an unproven caller, an open breaker):
only the planners that plan from the request alone, and no conversation read."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from proxy.config import parse_config
from proxy.metrics import Metrics
from proxy.pipeline import Pipeline, check_order
from proxy.turn import Turn


def turn() -> Turn:
    config = parse_config({"store": {"url": "sqlite:///:memory:"}, "tenants": [
        {"id": "acme", "auth": {"passthrough": True}, "upstream": {"base_url": "http://up/v1"}}]}, "test")
    return Turn(config.tenants[0], b"{}", {"messages": [{"role": "user", "content": "hi"}]}, {}, "rid")


class Stage:
    """A planner that notes each call in `log`; `fail` raises, `hang` overruns any deadline."""

    def __init__(self, name: str, log: list[str], after: tuple[str, ...] = (), fail: bool = False,
                 hang: bool = False) -> None:
        self.name, self.after, self.log, self.fail, self.hang = name, after, log, fail, hang

    def applies(self, request: Turn) -> bool:
        return True

    async def plan(self, request: Turn) -> Turn:
        self.log.append(self.name)
        if self.hang:
            await asyncio.sleep(3600)
        if self.fail:
            raise RuntimeError("broken stage")
        return replace(request, notes={**request.notes, self.name: True})


class Afresh(Stage):
    async def afresh(self, request: Turn) -> Turn:
        self.log.append(self.name + ".afresh")
        return replace(request, notes={**request.notes, self.name + "_afresh": True})


class NoConversations:
    """Stored conversations that must not be read: each attempt is noted in `read` (and fails)."""

    def __init__(self) -> None:
        self.read: list[str] = []

    def __getattr__(self, name: str) -> object:
        self.read.append(name)
        raise AssertionError(f"the conversation store was read ({name})")


def pipeline(*stages: Stage, healthy: bool = True, deadline: float = 1.0) -> tuple[Pipeline, Metrics]:
    metrics = Metrics()
    return Pipeline(stages, metrics, NoConversations(), store_healthy=lambda: healthy,  # type: ignore[arg-type]
                    deadline=deadline), metrics


def reads(p: Pipeline) -> list[str]:
    conversations: NoConversations = p.conversations  # type: ignore[assignment]
    return conversations.read


def failures(metrics: Metrics, stage: str) -> float:
    return metrics.registry.get_sample_value("keel_planner_failures_total", {"tenant": "acme", "planner": stage}) or 0


async def test_stateless_runs_only_the_planners_that_plan_from_the_request_alone() -> None:
    log: list[str] = []
    p, metrics = pipeline(Afresh("tools", log), Stage("context", log))
    planned = await p.run(turn(), stateless=True)
    assert log == ["tools.afresh"] and planned.notes == {"tools_afresh": True}
    assert reads(p) == [] and failures(metrics, "locate") == 0, "nothing stored is read for an unproven caller"


async def test_an_open_breaker_plans_afresh_without_reading_the_store() -> None:
    log: list[str] = []
    p, metrics = pipeline(Afresh("tools", log), Stage("context", log), healthy=False)
    assert (await p.run(turn())).notes == {"tools_afresh": True} and log == ["tools.afresh"]
    assert failures(metrics, "store_unavailable") == 1 and reads(p) == []


@pytest.mark.parametrize("fault", ["fail", "hang"])
async def test_a_stage_that_fails_or_overruns_comes_to_nothing_and_is_counted(fault: str) -> None:
    broken = Stage("broken", [], fail=fault == "fail", hang=fault == "hang")
    p, metrics = pipeline(deadline=0.05)
    assert await p.guard("broken", turn(), broken.plan(turn())) is None
    assert failures(metrics, "broken") == 1


def test_a_planner_before_one_it_must_follow_is_refused() -> None:
    log: list[str] = []
    check_order([Stage("a", log), Stage("b", log, after=("a",))])
    check_order([Stage("b", log, after=("absent",))])  # a planner that is not there imposes nothing
    with pytest.raises(ValueError, match="'b' must run after a"):
        check_order([Stage("b", log, after=("a",)), Stage("a", log)])
