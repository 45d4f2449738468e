"""The stand-in's other API shapes (OpenAI Responses, Anthropic Messages), driven through HTTP by the real SDKs:
the same script directives, tool_search for a deferred tool, errors in each provider's shape, each provider's cache rules."""

from __future__ import annotations

from typing import Any, cast

import anthropic
import httpx
import openai
import orjson
import pytest
from conftest import ServerThread, large_catalog

WEATHER_PARAMS = {"type": "object", "properties": {"city": {"type": "string"}}}
CALL_WEATHER = '[[call get_weather {"city": "Paris"}]]'


def catalog(n: int) -> list[dict[str, Any]]:
    """The first n tools of a real catalog, as chat tools."""
    tools: list[dict[str, Any]] = large_catalog()[:n]
    return tools


def flat_tool(name: str, parameters: dict[str, Any] | None = None) -> Any:
    """A Responses API function tool (flat: no `function` wrapper)."""
    return {"type": "function", "name": name, "description": f"the {name} tool", "parameters": parameters or {"type": "object"}}


@pytest.fixture
def client(standin: ServerThread) -> openai.OpenAI:
    return openai.OpenAI(base_url=standin.url + "/v1", api_key="unused", max_retries=0)


# --- OpenAI Responses API ---


def test_responses_tool_call_round_trip(client: openai.OpenAI) -> None:
    """A [[call]] directive becomes a function_call item; sending its output back (as full input, or after
    previous_response_id) gets a text answer about the result."""
    tools: Any = [flat_tool("get_weather", WEATHER_PARAMS), {"type": "web_search"}]
    first = client.responses.create(model="gpt-5", instructions="be brief", input=f"weather? {CALL_WEATHER}", tools=tools)
    assert first.status == "completed" and first.id.startswith("resp_")
    call = first.output[0]
    assert call.type == "function_call" and call.name == "get_weather" and orjson.loads(call.arguments) == {"city": "Paris"}
    assert call.call_id.startswith("call_") and call.id and call.id.startswith("fc_")
    result: Any = {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}
    full: Any = [{"role": "user", "content": f"weather? {CALL_WEATHER}"}, call.model_dump(exclude_none=True), result]
    again = client.responses.create(model="gpt-5", input=full, tools=tools)
    assert again.output_text == "The get_weather tool returned: sunny"
    chained = client.responses.create(model="gpt-5", previous_response_id=first.id, input=[result], tools=tools)
    assert chained.output_text == "The get_weather tool returned: sunny"


def test_responses_custom_tool_call(client: openai.OpenAI) -> None:
    """A custom (free-form) tool is called with a custom_tool_call item carrying its input as text."""
    tools: Any = [{"type": "custom", "name": "run_sql", "description": "run SQL"}]
    answer = client.responses.create(model="gpt-5", input='[[call run_sql {"q": 1}]]', tools=tools)
    item = answer.output[0]
    assert item.type == "custom_tool_call" and item.name == "run_sql" and item.input == '{"q": 1}'


def test_responses_additional_tools_offered(client: openai.OpenAI) -> None:
    """Tools sent in an `additional_tools` input item (Codex's newer models), namespaced or not, are offered."""
    extra = {"type": "additional_tools", "role": "developer", "tools": [
        {"type": "namespace", "name": "functions", "description": "", "tools": [
            {"type": "custom", "name": "exec", "description": "run JavaScript"}]}]}
    line = {"role": "user", "content": "[[call exec text(1)]]"}
    answer = client.responses.create(model="gpt-6", input=cast(Any, [extra, line]))
    item = answer.output[0]
    assert item.type == "custom_tool_call" and item.name == "exec" and item.input == "text(1)"


def test_responses_stream_events_in_order(client: openai.OpenAI) -> None:
    """Streamed text and function calls come as OpenAI's event sequence, numbered; the SDK rebuilds the response."""
    with client.responses.stream(model="gpt-5", input="hello [[words 5]]") as stream:
        events = list(stream)
        final = stream.get_final_response()
    assert [e.type for e in events] == [
        "response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
        *["response.output_text.delta"] * 5, "response.output_text.done", "response.content_part.done",
        "response.output_item.done", "response.completed"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert final.output_text == "word0 word1 word2 word3 word4" and final.usage and final.usage.output_tokens > 0
    with client.responses.stream(model="gpt-5", input=CALL_WEATHER, tools=[flat_tool("get_weather")]) as stream:
        kinds = [e.type for e in stream]
        call = stream.get_final_response().output[0]
    assert kinds == ["response.created", "response.in_progress", "response.output_item.added",
                     *["response.function_call_arguments.delta"] * 2, "response.function_call_arguments.done",
                     "response.output_item.done", "response.completed"]
    assert call.type == "function_call" and orjson.loads(call.arguments) == {"city": "Paris"}


def test_responses_sse_is_named_events_without_done(standin: ServerThread) -> None:
    """Each data line repeats its `event:` name as `type`; the stream ends with response.completed, no [DONE]."""
    with httpx.stream("POST", standin.url + "/v1/responses", json={"model": "m", "input": "hi", "stream": True}) as r:
        lines = [line for line in r.iter_lines() if line]
    names = [line[7:] for line in lines if line.startswith("event: ")]
    data = [orjson.loads(line[6:]) for line in lines if line.startswith("data: ")]
    assert names == [d["type"] for d in data] and names[-1] == "response.completed"
    assert not any("[DONE]" in line for line in lines)


def test_responses_tool_search_for_a_deferred_tool(client: openai.OpenAI) -> None:
    """A named tool that is not offered is searched for with tool_search, as a function_call."""
    answer = client.responses.create(model="gpt-5", input="[[call get_weather]]", tools=[flat_tool("tool_search")])
    call = answer.output[0]
    assert call.type == "function_call" and call.name == "tool_search"
    assert orjson.loads(call.arguments)["names"] == ["get_weather"]


def test_responses_error_directive(client: openai.OpenAI) -> None:
    """[[error 503]] answers with that status and an OpenAI error body."""
    with pytest.raises(openai.APIStatusError) as caught:
        client.responses.create(model="gpt-5", input="[[error 503]]")
    assert caught.value.status_code == 503
    assert isinstance(caught.value.body, dict) and caught.value.body["type"] == "api_error"


RESPONSES_USAGE_KEYS = {"input_tokens", "input_tokens_details", "output_tokens", "output_tokens_details", "total_tokens"}


def test_responses_cache_reports_cached_tokens(client: openai.OpenAI) -> None:
    """OpenAI's rules over tools, instructions, input: a repeated long prefix is read in whole 128-token blocks;
    usage has the standard fields only, the ceiling comes in x-standin-prefix-ceiling."""
    tools: Any = [flat_tool(t["function"]["name"], t["function"].get("parameters")) for t in catalog(40)]
    request: Any = {"model": "gpt-5", "instructions": "be brief", "input": "hi", "tools": tools, "prompt_cache_key": "k"}
    first = client.responses.with_raw_response.create(**request)
    again = client.responses.with_raw_response.create(**{**request, "input": [{"role": "user", "content": "hi"}]})
    cold, warm = first.parse().usage, again.parse().usage
    assert cold and warm and cold.input_tokens > 2000
    assert cold.input_tokens_details.cached_tokens == 0 and first.headers["x-standin-prefix-ceiling"] == "0"
    assert warm.input_tokens_details.cached_tokens >= 1024 and warm.input_tokens_details.cached_tokens % 128 == 0
    assert set(orjson.loads(again.content)["usage"]) == RESPONSES_USAGE_KEYS
    assert int(again.headers["x-standin-prefix-ceiling"]) == warm.input_tokens


# --- Anthropic Messages API ---


@pytest.fixture
def claude(standin: ServerThread) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=standin.url, api_key="sk-ant-unused", max_retries=0,
                               default_headers={"x-api-key": "sk-ant-unused"})


def claude_tool(name: str, **extra: Any) -> Any:
    return {"name": name, "description": f"the {name} tool", "input_schema": WEATHER_PARAMS, **extra}


def test_messages_tool_use_round_trip(claude: anthropic.Anthropic) -> None:
    """A [[call]] directive becomes a tool_use block (stop_reason tool_use); a tool_result, even beside a harness's
    reminder text and after a role=system entry in messages, gets a text answer about it."""
    tools: Any = [claude_tool("get_weather"), {"type": "web_search_20250305", "name": "web_search"}]
    asked: Any = {"role": "user", "content": f"weather? {CALL_WEATHER}"}
    first = claude.messages.create(model="standin", max_tokens=100, system="be brief", tools=tools,
                                   messages=[{"role": "system", "content": "reminders"}, asked])  # Claude Code does this
    assert first.stop_reason == "tool_use" and first.id.startswith("msg_")
    use = first.content[0]
    assert use.type == "tool_use" and use.name == "get_weather" and use.input == {"city": "Paris"}
    assert use.id.startswith("toolu_")
    output = [{"type": "text", "text": "sunny"}]
    result: Any = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": output},
                                               {"type": "text", "text": "<system-reminder>keep going</system-reminder>"}]}
    second = claude.messages.create(model="standin", max_tokens=100, tools=tools,
                                    messages=[asked, {"role": "assistant", "content": first.content}, result])
    assert second.stop_reason == "end_turn"
    assert second.content[0].type == "text" and second.content[0].text == "The get_weather tool returned: sunny"


def test_messages_stream_events(claude: anthropic.Anthropic, standin: ServerThread) -> None:
    """Streamed text and tool_use come as Anthropic's events (input as input_json_delta pieces); the SDK rebuilds them."""
    with claude.messages.stream(model="standin", max_tokens=100, messages=[{"role": "user", "content": "hi [[words 3]]"}]) as stream:
        kinds = [e.type for e in stream if e.type != "text"]
        final = stream.get_final_message()
    assert kinds == ["message_start", "content_block_start", *["content_block_delta"] * 3, "content_block_stop",
                     "message_delta", "message_stop"]
    assert final.content[0].type == "text" and final.content[0].text == "word0 word1 word2"
    assert final.usage.output_tokens > 1 and final.stop_reason == "end_turn"
    with claude.beta.messages.stream(model="standin", max_tokens=100, tools=[claude_tool("get_weather")],
                                     messages=[{"role": "user", "content": CALL_WEATHER}], betas=["some-beta-2025-01-01"]) as beta:
        deltas = [e.delta.type for e in beta if e.type == "content_block_delta"]
        block = beta.get_final_message().content[0]
    assert deltas == ["input_json_delta"] and block.type == "tool_use" and block.input == {"city": "Paris"}
    headers = standin.app.state.standin.headers[-1]
    assert headers["x-api-key"] == "sk-ant-unused" and headers["anthropic-beta"] == "some-beta-2025-01-01"
    assert headers["anthropic-version"]


def test_messages_tool_search_for_a_deferred_tool(claude: anthropic.Anthropic) -> None:
    """A named tool that is not offered is searched for with tool_search, as a tool_use block; server tools are not offered tools."""
    tools: Any = [claude_tool("tool_search"), {"type": "tool_search_tool_regex_20251119", "name": "tool_search_tool_regex"}]
    answer = claude.messages.create(model="standin", max_tokens=100, tools=tools,
                                    messages=[{"role": "user", "content": "[[call get_weather]]"}])
    use = answer.content[0]
    assert use.type == "tool_use" and use.name == "tool_search" and use.input["names"] == ["get_weather"]


def test_messages_errors_in_anthropic_shape(claude: anthropic.Anthropic) -> None:
    """[[error 529]] and five cache_control breakpoints answer with Anthropic's error body."""
    with pytest.raises(anthropic.APIStatusError) as caught:
        claude.messages.create(model="standin", max_tokens=100, messages=[{"role": "user", "content": "[[error 529]]"}])
    assert caught.value.status_code == 529
    assert caught.value.body == {"type": "error", "error": {"type": "overloaded_error", "message": "stand-in error 529"}}
    marked: Any = [{"type": "text", "text": f"p{i}", "cache_control": {"type": "ephemeral"}} for i in range(5)]
    with pytest.raises(anthropic.BadRequestError) as bad:
        claude.messages.create(model="standin", max_tokens=100, messages=[{"role": "user", "content": marked}])
    assert isinstance(bad.value.body, dict) and bad.value.body["error"]["type"] == "invalid_request_error"


MESSAGES_USAGE_KEYS = {"input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens", "output_tokens"}


def test_messages_cache_breakpoints(claude: anthropic.Anthropic) -> None:
    """Anthropic's rules over tools, system, messages: a cache_control breakpoint writes its prefix, the next turn
    reads it; input_tokens is the uncached rest; usage has Anthropic's fields only, the ceiling in a header."""
    tools: Any = [claude_tool(t["function"]["name"]) for t in catalog(30)]
    system: Any = [{"type": "text", "text": "be brief"},
                   {"type": "text", "text": "rules " * 600, "cache_control": {"type": "ephemeral"}}]
    turn: Any = {"role": "user", "content": "q1"}
    first = claude.messages.with_raw_response.create(model="standin", max_tokens=100, tools=tools, system=system, messages=[turn])
    later: Any = [turn, {"role": "assistant", "content": "a1"}, {"role": "user", "content": "q2"}]
    second = claude.messages.with_raw_response.create(model="standin", max_tokens=100, tools=tools, system=system, messages=later)
    cold, warm = first.parse().usage, second.parse().usage
    assert cold.cache_read_input_tokens == 0 and cold.cache_creation_input_tokens and cold.cache_creation_input_tokens > 1024
    assert warm.cache_read_input_tokens == cold.cache_creation_input_tokens and warm.cache_creation_input_tokens == 0
    assert 0 < cold.input_tokens < warm.input_tokens < 30  # the messages after the breakpoint
    assert set(orjson.loads(second.http_response.content)["usage"]) == MESSAGES_USAGE_KEYS
    total = warm.input_tokens + warm.cache_read_input_tokens
    assert first.headers["x-standin-prefix-ceiling"] == "0" and 0 < int(second.headers["x-standin-prefix-ceiling"]) < total
