"""Invariant 4 on /v1/responses and /v1/messages: a failing planner, ranker or store (by
exception and by timeout), streamed and not, still ends the turn with the client's own call."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest
from conftest import KEY, ServerThread, keel_config, small_catalog, tenant

from proxy.standin.script import hidden_call
from proxy.stores.sqlite import SqliteStore
from proxy.testing import FailingPlanner, FakeRanker, FaultyStore

WANTED = "archive_ticket"
TEXT = "tidy up the queue " + hidden_call(WANTED, '{"id": "7"}')
FEATURES: dict[str, Any] = {"tools": {"enabled": True, "select": {"timeout_ms": 100}}, "context": {"stable": True},
                            "cache": {"prompt_cache_key": "auto", "breakpoints": "auto"}}


def called(keel: ServerThread, shape: str, stream: bool) -> list[str]:
    """One turn with the shape's real SDK: the names of the tools the client is asked to call."""
    if shape == "responses":
        client = openai.OpenAI(base_url=keel.url + "/v1", api_key=KEY, max_retries=0, timeout=8)
        tools: Any = [{"type": "function", "name": t["function"]["name"], "description": t["function"]["description"],
                       "parameters": t["function"]["parameters"]} for t in small_catalog()]
        kwargs: dict[str, Any] = dict(model="m", instructions="You run a help desk.", input=TEXT, tools=tools,
                                      store=False)
        if stream:
            with client.responses.stream(**kwargs) as events:
                for _ in events:
                    pass
                final = events.get_final_response()
        else:
            final = client.responses.create(**kwargs)
        return [item.name for item in final.output if item.type == "function_call"]
    messages_client = anthropic.Anthropic(base_url=keel.url, api_key=KEY, max_retries=0, timeout=8)
    request: dict[str, Any] = dict(model="c", max_tokens=100, system="You run a help desk.", tools=[
        {"name": t["function"]["name"], "description": t["function"]["description"],
         "input_schema": t["function"]["parameters"]} for t in small_catalog()],
        messages=[{"role": "user", "content": TEXT}])
    if stream:
        with messages_client.messages.stream(**request) as events:
            for _ in events:
                pass
            message = events.get_final_message()
    else:
        message = messages_client.messages.create(**request)
    return [b.name for b in message.content if b.type == "tool_use"]


SHAPES = pytest.mark.parametrize("shape", ["responses", "messages"])
STREAMS = pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
MODES = pytest.mark.parametrize("mode", ["raise", "hang"])


@SHAPES
@STREAMS
@MODES
def test_failing_planner(standin: ServerThread, start_keel: Callable[..., ServerThread], shape: str, stream: bool,
                         mode: str) -> None:
    def with_failing(defaults: list[Any]) -> Sequence[Any]:
        return [FailingPlanner(mode), *defaults]

    keel = start_keel(keel_config(tenant(standin.url + "/v1", **FEATURES)), planners=with_failing, stage_deadline=0.3)
    assert called(keel, shape, stream) == [WANTED]


@SHAPES
@STREAMS
@MODES
def test_failing_ranker(standin: ServerThread, start_keel: Callable[..., ServerThread], shape: str, stream: bool,
                        mode: str) -> None:
    ranker = FakeRanker(best=["close_ticket"], error=RuntimeError("down") if mode == "raise" else None,
                        delay=5.0 if mode == "hang" else 0.0)
    keel = start_keel(keel_config(tenant(standin.url + "/v1", **FEATURES)), ranker=ranker)
    assert called(keel, shape, stream) == [WANTED]
    assert ranker.calls >= 2, "the planner and Keel's search answer both asked the ranker"


@SHAPES
@STREAMS
@MODES
def test_failing_store(standin: ServerThread, start_keel: Callable[..., ServerThread], tmp_path: Path, shape: str,
                       stream: bool, mode: str) -> None:
    store = FaultyStore(SqliteStore(str(tmp_path / "k.db")), mode)
    keel = start_keel(keel_config(tenant(standin.url + "/v1", **FEATURES)), store=store)
    assert called(keel, shape, stream) == [WANTED]
