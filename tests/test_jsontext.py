"""Faithful JSON reading: a resent tools array is parsed once and reads exactly as a whole parse."""

from __future__ import annotations

import json
from typing import Any

import orjson

from proxy import jsontext


def catalog(n: int = 60) -> list[dict[str, Any]]:
    return [{"type": "function", "function": {"name": f"tool_{i}", "description": "does a thing " * 8,
                                              "parameters": {"type": "object", "properties": {"x": {"type": "string"}}}}}
            for i in range(n)]


def body(text: str, tools: list[dict[str, Any]], **extra: Any) -> bytes:
    return orjson.dumps({"model": "m", "messages": [{"role": "user", "content": text}], "tools": tools, **extra})


def test_resent_tools_read_as_a_whole_parse_would() -> None:
    """The second body reuses the first's tools value (the same object) and reads equal to a whole parse."""
    resent, tools = jsontext.Resent(), catalog()
    first = resent.loads(body("one", tools))
    second = resent.loads(body("two", tools, temperature=1.5))
    assert second == jsontext.loads(body("two", tools, temperature=1.5))
    assert second["tools"] is first["tools"]
    assert list(second) == ["model", "messages", "tools", "temperature"]  # key order kept


def test_other_tools_or_other_places_are_parsed_whole() -> None:
    """A changed array, a nested `tools` key first, duplicate keys: each reads exactly as a whole parse."""
    resent, tools = jsontext.Resent(), catalog()
    resent.loads(body("one", tools))
    changed = [*tools[:-1], {**tools[-1], "function": {"name": "other"}}]
    nested = orjson.dumps({"metadata": {"tools": tools}, "model": "m", "messages": [], "tools": []})
    duplicate = b'{"tools":' + orjson.dumps(tools) + b',"messages":[],"tools":[]}'
    for raw in (body("two", changed), nested, duplicate):
        assert resent.loads(raw) == json.loads(raw)


def test_numbers_in_a_resent_array_keep_their_text() -> None:
    """A tools array with `1.50` in it is never taken from memory: its number text is kept."""
    resent = jsontext.Resent()
    tools = catalog()
    raw = body("one", tools).replace(b'"type":"string"}', b'"type":"number","default":1.50}', 1)
    for _ in range(2):
        assert b"1.50" in jsontext.dumps(resent.loads(raw))


def test_spaced_json_is_read_correctly() -> None:
    """A client that writes spaces is parsed whole each time, correctly."""
    resent, tools = jsontext.Resent(), catalog()
    raw = json.dumps({"model": "m", "messages": [], "tools": tools}).encode()
    assert resent.loads(raw) == resent.loads(raw) == json.loads(raw)


def test_a_spaced_tools_array_resent_is_parsed_once() -> None:
    """A client that indents its JSON resends its tools array byte for byte too: the second body
    gets the remembered value (the same object), the rest read afresh."""
    import json

    from proxy.jsontext import Resent

    tools = [{"type": "function", "function": {"name": f"t{i}", "description": "d ] } \" [" * 20,
                                               "parameters": {"type": "object", "minimum": 1.25}}} for i in range(40)]
    resent = Resent()
    first = json.dumps({"model": "m", "tools": tools, "messages": []}, indent=1).encode()
    second = first.replace(b'"model": "m"', b'"model": "n"')
    one, two = resent.loads(first), resent.loads(second)
    assert two["tools"] is one["tools"] and two["model"] == "n"
    assert resent.loads(second, read_only=True)["tools"] is one["tools"]
