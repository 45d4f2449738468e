"""Clients that search their own deferred tools (issue 21, findings 3 and 4), as the agent CLIs send
them, through the anthropic and openai SDKs with every feature on: Claude Code's ToolSearch with
its `DeferredToolPlaceholder`, Codex's client-run `tool_search` (`"execution": "client"`). Keel adds
no tool_search of its own, defers nothing the client loaded, drops none of the client's tools,
and keeps their order, Codex's developer-message ids and its `additional_tools` item as sent."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anthropic
import openai
from conftest import KEY, ServerThread, keel_config, small_catalog, tenant

from proxy.server import QUICKSTART_FEATURES


def schema(words: str) -> dict[str, Any]:
    return {"type": "object", "properties": {
        "target": {"type": "string", "description": f"what to {words}, as a path, id or name"},
        "options": {"type": "string", "description": "extra settings, comma separated"}}, "required": ["target"]}


def claude_code_tools() -> list[dict[str, Any]]:
    """Claude Code's request with MCP servers and tool search on: its built-in tools loaded, its own
    ToolSearch, MCP tools deferred, and the placeholder it adds to the deferred set."""
    builtins = [{"name": t["function"]["name"], "description": t["function"]["description"],
                 "input_schema": t["function"]["parameters"]} for t in small_catalog()[:14]]
    return [*builtins,
            {"name": "ToolSearch", "description": "Search for or select deferred tools to make them available.",
             "input_schema": {"type": "object", "properties": {"query": {"type": "string"},
                                                               "max_results": {"type": "number"}},
                              "required": ["query"]}},
            {"name": "mcp__tracker__archive_ticket", "description": "Archive a ticket.",
             "input_schema": schema("archive"), "defer_loading": True},
            {"name": "DeferredToolPlaceholder", "description": "Placeholder for deferred tools. Never call this tool.",
             "input_schema": {"type": "object", "properties": {}}, "defer_loading": True}]


def test_claude_code_tool_search_is_left_to_claude_code(standin: ServerThread,
                                                        start_keel: Callable[..., ServerThread]) -> None:
    """Finding 3: Keel added a tool_search whose only entry was the placeholder, beside Claude Code's
    own ToolSearch (tool tokens up, a session 39% dearer). The client searches: its tools go as sent."""
    config = tenant(standin.url + "/v1", tools={"enabled": True})
    config["upstream"]["kind"] = "anthropic-compatible"
    keel = start_keel(keel_config(config))
    client = anthropic.Anthropic(base_url=keel.url, api_key=KEY, max_retries=0)
    tools = claude_code_tools()
    client.messages.create(model="claude", max_tokens=50, tools=tools,  # type: ignore[arg-type]
                           messages=[{"role": "user", "content": "archive the stale ticket 7"}])
    sent = standin.app.state.standin.requests[-1]
    assert sent["tools"] == tools


def codex_tools() -> list[dict[str, Any]]:
    def function(name: str) -> dict[str, Any]:
        return {"type": "function", "name": name, "description": f"Codex's {name.replace('_', ' ')} tool.",
                "strict": False, "parameters": schema(name.replace("_", " "))}

    return [function("shell"), function("update_plan"),
            {"type": "tool_search", "execution": "client", "description": "Search the MCP tools for ones to load.",
             "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}},
            {"type": "custom", "name": "apply_patch", "description": "Apply a patch.",
             "format": {"type": "grammar", "syntax": "lark", "definition": "start: /.+/"}},
            function("view_image"), {"type": "web_search"},
            *(function(f"exec_step_{i}") for i in range(10))]


def test_codex_client_search_ids_and_order_pass_as_sent(standin: ServerThread,
                                                        start_keel: Callable[..., ServerThread]) -> None:
    """Finding 4: Keel dropped Codex's client-run tool_search as if it were the provider's hosted
    one (13 → 12 tools), moved its hosted and custom tools first, and lost the id of a developer
    message it had added the date to. Now: every tool in the client's order, the developer
    message's own fields kept, and the `additional_tools` item untouched."""
    keel = start_keel(keel_config(tenant(standin.url + "/v1", **QUICKSTART_FEATURES)))
    client = openai.OpenAI(base_url=keel.url + "/v1", api_key=KEY, max_retries=0)
    developer = {"type": "message", "id": "msg_dev_1", "role": "developer",
                 "content": [{"type": "input_text", "text": "<permissions>workspace-write</permissions>"}]}
    additional = {"type": "additional_tools", "tools": [{"type": "namespace", "name": "mcp__tracker", "tools": [
        {"type": "function", "name": "archive_ticket", "parameters": schema("archive")}]}]}
    ask = {"type": "message", "role": "user",  # it speaks of time: Keel tells the model the date, in the developer message
           "content": [{"type": "input_text", "text": "list the files I changed today"}]}
    tools = codex_tools()
    client.responses.create(model="gpt-5-codex", instructions="You are Codex.", tools=tools,  # type: ignore[arg-type]
                            input=[developer, additional, ask], store=False)  # type: ignore[list-item]
    sent = standin.app.state.standin.requests[-1]
    assert sent["tools"] == tools
    items = sent["input"]
    assert [i.get("type") for i in items] == ["message", "additional_tools", "message"]
    assert items[0]["content"] != developer["content"]  # Keel changed the message (the date) ...
    assert items[0]["id"] == "msg_dev_1" and list(items[0]) == list(developer)  # ... and kept its own fields
    assert items[1] == additional


def test_tools_keep_their_order_when_keel_marks_one(standin: ServerThread,
                                                    start_keel: Callable[..., ServerThread]) -> None:
    """Keel changing a tool in place (the cache planner's breakpoint on the last one) keeps every tool
    where the client put it: a server tool between two function tools stays between them."""
    config = tenant(standin.url + "/v1", cache={"breakpoints": "auto"})
    config["upstream"]["kind"] = "anthropic-compatible"
    keel = start_keel(keel_config(config))
    tools: list[dict[str, Any]] = [
        {"name": "read_file", "description": "Read a file. " * 300, "input_schema": schema("read")},
        {"type": "web_search_20250305", "name": "web_search", "max_uses": 2},
        {"name": "write_file", "description": "Write a file. " * 300, "input_schema": schema("write")}]
    client = anthropic.Anthropic(base_url=keel.url, api_key=KEY, max_retries=0)
    client.messages.create(model="claude-sonnet-4-5", max_tokens=50, tools=tools,  # type: ignore[arg-type]
                           messages=[{"role": "user", "content": "hi"}])
    sent = standin.app.state.standin.requests[-1]["tools"]
    assert [t["name"] for t in sent] == ["read_file", "web_search", "write_file"]
    assert "cache_control" in sent[-1]  # Keel did change a tool
