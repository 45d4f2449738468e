"""Each shape's answers in both forms: a provider's stream read into the body its JSON answer
has, a body written as a stream that reads back into the same body, what counts as whole, and
what the policy looks up, keeps or passes by."""

from __future__ import annotations

from typing import Any

import httpx
import orjson
import pytest

from proxy.config import CacheConfig
from proxy.respcache.policy import decide
from proxy.shapes.chat import CHAT
from proxy.shapes.messages import MESSAGES
from proxy.shapes.responses import RESPONSES
from proxy.sse import EventParser
from proxy.standin.app import create_standin_app
from proxy.standin.script import hidden_call

SHAPES = {s.name: s.answers for s in (CHAT, RESPONSES, MESSAGES)}

TEXT = "look it up " + hidden_call("get_weather", '{"city": "Oslo"}') + " and tell me"
REQUESTS: dict[str, tuple[str, dict[str, Any]]] = {
    "chat": ("/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": TEXT}],
                                      "tools": [{"type": "function", "function": {"name": "get_weather"}}],
                                      "stream_options": {"include_usage": True}}),
    "responses": ("/v1/responses", {"model": "m", "input": TEXT, "store": False,
                                    "tools": [{"type": "function", "name": "get_weather"}]}),
    "messages": ("/v1/messages", {"model": "c", "max_tokens": 50, "messages": [{"role": "user", "content": TEXT}],
                                  "tools": [{"name": "get_weather", "input_schema": {"type": "object"}}]}),
}
MOVING = {"id", "created", "created_at"}  # what differs between two answers of the stand-in


def events(raw: bytes) -> list[Any]:
    parser = EventParser()
    return list(parser.feed(raw))


def steady(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: steady(v) for k, v in value.items() if k not in MOVING}
    if isinstance(value, list):
        return [steady(v) for v in value]
    return value


@pytest.mark.parametrize("shape", list(REQUESTS))
async def test_a_providers_stream_adds_up_to_its_json_answer(shape: str) -> None:
    """The stand-in streams as each provider does (word deltas, argument pieces): read whole, the
    stream is the JSON answer to the same request, tool call and usage included."""
    path, body = REQUESTS[shape]
    async with httpx.AsyncClient(transport=httpx.ASGITransport(create_standin_app()), base_url="http://s") as client:
        whole = (await client.post(path, json=body)).json()
        streamed = (await client.post(path, json={**body, "stream": True})).content
    answers = SHAPES[shape]
    assembled = answers.assemble(events(streamed))
    assert assembled is not None and answers.whole(assembled, body)
    if shape == "responses":
        whole.pop("store"), assembled.pop("store")  # the stand-in echoes the request's own
    assert steady(assembled) == steady(whole)


RICH: dict[str, dict[str, Any]] = {
    "chat": {"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "gpt-4o", "system_fingerprint": "fp",
             "choices": [
                 {"index": 0, "message": {"role": "assistant", "content": "Two calls.", "refusal": None,
                                          "tool_calls": [{"id": "c1", "type": "function",
                                                          "function": {"name": "a", "arguments": "{\"x\": 1}"}},
                                                         {"id": "c2", "type": "function",
                                                          "function": {"name": "b", "arguments": "{}"}}]},
                  "logprobs": {"content": [{"token": "Two", "logprob": -0.1}]}, "finish_reason": "tool_calls"},
                 {"index": 1, "message": {"role": "assistant", "content": None, "refusal": "I can't."},
                  "logprobs": None, "finish_reason": "stop"}],
             "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}},
    "responses": {"id": "resp_1", "object": "response", "created_at": 1, "status": "completed", "model": "gpt-4o",
                  "output": [{"type": "reasoning", "id": "rs_1", "summary": []},
                             {"type": "message", "id": "msg_1", "status": "completed", "role": "assistant",
                              "content": [{"type": "output_text", "text": "Hello", "annotations": [], "logprobs": []},
                                          {"type": "refusal", "refusal": "no"}]},
                             {"type": "function_call", "id": "fc_1", "call_id": "c1", "name": "a",
                              "arguments": "{\"x\": 1}", "status": "completed"}],
                  "usage": {"input_tokens": 10, "output_tokens": 5, "total_tokens": 15}},
    "messages": {"id": "msg_1", "type": "message", "role": "assistant", "model": "claude-sonnet-4-5",
                 "content": [{"type": "thinking", "thinking": "hmm", "signature": "sig"},
                             {"type": "text", "text": "Calling."},
                             {"type": "tool_use", "id": "toolu_1", "name": "a", "input": {"x": 1, "y": [1, 2]}}],
                 "stop_reason": "tool_use", "stop_sequence": None,
                 "usage": {"input_tokens": 10, "cache_read_input_tokens": 0, "output_tokens": 5}},
}


@pytest.mark.parametrize("shape", list(RICH))
def test_an_answer_written_as_a_stream_reads_back_whole(shape: str) -> None:
    """Several choices, calls, refusals, logprobs, reasoning and thinking: the stream Keel writes
    for a kept answer adds up to that very answer."""
    answers = SHAPES[shape]
    stream = answers.events(RICH[shape], {"include_usage": True})
    assert answers.assemble(events(stream)) == RICH[shape]


def test_a_chat_stream_carries_usage_only_when_asked() -> None:
    answers = SHAPES["chat"]
    without = events(answers.events(RICH["chat"], None))
    assert all(b'"usage"' not in e.raw for e in without) and without[-1].done
    assert answers.assemble(without) == {k: v for k, v in RICH["chat"].items() if k != "usage"}


@pytest.mark.parametrize(("shape", "answer", "request_body", "whole"), [
    ("chat", {"choices": [{"finish_reason": "length"}]}, {}, False),
    ("chat", {"choices": [{"finish_reason": "length"}]}, {"max_tokens": 5}, True),
    ("chat", {"choices": [{"finish_reason": "content_filter"}]}, {}, False),
    ("chat", {"error": {"message": "x"}, "choices": [{"finish_reason": "stop"}]}, {}, False),
    ("responses", {"status": "incomplete", "output": [], "incomplete_details": {"reason": "max_output_tokens"}},
     {"max_output_tokens": 5}, True),
    ("responses", {"status": "incomplete", "output": [], "incomplete_details": {"reason": "max_output_tokens"}},
     {}, False),
    ("responses", {"status": "failed", "output": []}, {}, False),
    ("messages", {"type": "message", "content": [], "stop_reason": "max_tokens"}, {"max_tokens": 5}, True),
    ("messages", {"type": "message", "content": [], "stop_reason": "refusal"}, {"max_tokens": 5}, False),
    ("messages", {"type": "message", "content": [], "stop_reason": "pause_turn"}, {"max_tokens": 5}, False),
])
def test_only_whole_answers_are_kept(shape: str, answer: dict[str, Any], request_body: dict[str, Any],
                                     whole: bool) -> None:
    """A cut at the token limit counts as whole only when the request set that limit itself."""
    assert SHAPES[shape].whole(answer, request_body) is whole


def test_a_stream_that_never_ended_is_not_whole() -> None:
    stream = SHAPES["chat"].events(RICH["chat"], None)
    assert SHAPES["chat"].assemble(events(stream.removesuffix(b"data: [DONE]\n\n"))) is None
    cut = SHAPES["messages"].events(RICH["messages"], None).rsplit(b"event: message_stop", 1)[0]
    assert SHAPES["messages"].assemble(events(cut)) is None
    failed = orjson.dumps({"type": "response.failed", "response": RICH["responses"]})
    assert SHAPES["responses"].assemble(events(b"data: " + failed + b"\n\n")) is None


@pytest.mark.parametrize(("wire", "headers", "mode", "state", "reason"), [
    ({"temperature": 0}, {}, "on", "lookup", ""),
    ({"seed": 3}, {}, "on", "lookup", ""),
    ({"temperature": 0.7}, {}, "on", "bypass", "not-deterministic"),
    ({}, {}, "always", "lookup", ""),
    ({"temperature": 0}, {"cache-control": "no-store"}, "on", "bypass", "no-store"),
    ({"temperature": 0}, {"cache-control": "no-cache"}, "on", "refresh", "no-cache"),
    ({"temperature": 0}, {"cache-control": "max-age=0"}, "on", "refresh", "no-cache"),
])
def test_the_policy(wire: dict[str, Any], headers: dict[str, str], mode: str, state: str, reason: str) -> None:
    decision = decide(wire, headers, CacheConfig(responses=mode), None)  # type: ignore[arg-type]
    assert (decision.state, decision.reason) == (state, reason)


def test_the_ttl_header_is_capped_and_zero_keeps_nothing() -> None:
    config = CacheConfig(responses="on")
    assert decide({"seed": 1}, {"x-keel-cache-ttl": "99999999"}, config, None).ttl == config.stored.max_ttl_seconds
    assert not decide({"seed": 1}, {"x-keel-cache-ttl": "0"}, config, None).keeps


@pytest.mark.parametrize(("wire", "reason"), [
    ({"store": True}, "store"), ({}, "store"), ({"store": False, "previous_response_id": "r"}, "previous-response-id"),
    ({"store": False, "conversation": "c"}, "conversation"), ({"store": False, "background": True}, "background"),
    ({"store": False}, None)])
def test_responses_that_keep_state_upstream_are_never_cached(wire: dict[str, Any], reason: str | None) -> None:
    assert SHAPES["responses"].never(wire) == reason
