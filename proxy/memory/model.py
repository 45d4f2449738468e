"""The memory model: instructions, the user's memory, the recent messages, and two tools."""

from __future__ import annotations

import orjson

from proxy import jsontext
from proxy.config import TenantConfig
from proxy.encoding import decoded
from proxy.jsontext import Json, JsonObject
from proxy.upstream import Upstream, json_headers

TOOLS = [
    {"type": "function", "function": {
        "name": "set_memory", "description": "Store or update one memory entry for this user.",
        "parameters": {"type": "object", "properties": {"key": {"type": "string"}, "value": {"type": "string"}},
                       "required": ["key", "value"]}}},
    {"type": "function", "function": {
        "name": "delete_memory", "description": "Delete one memory entry of this user.",
        "parameters": {"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]}}},
]


class MemoryModelError(Exception):
    pass


async def run_memory_model(upstream: Upstream, tenant: TenantConfig, memory: dict[str, str],
                           window: list[JsonObject], hint: str | None) -> tuple[list[tuple[str, str, str]], Json]:
    """Ask the memory model what to change; returns [(op, key, value)] and its usage."""
    cfg = tenant.memory
    current = "\n".join(f"- {k}: {v}" for k, v in sorted(memory.items())) or "(empty)"
    limit = cfg.token_limit * 4  # about four characters per token
    if len(current) > limit:
        current = current[:limit].rsplit("\n", 1)[0] + "\n(… more entries not shown)"
    system = f"{cfg.instructions}\n\nThe user's memory now:\n{current}"
    if cfg.valid_keys:
        system += "\n\nUse only these keys: " + ", ".join(cfg.valid_keys)
    if hint:
        system += f"\n\n<memory_hint>{hint}</memory_hint>"
    body = {"model": cfg.model, "messages": [{"role": "system", "content": system}, *window], "tools": TOOLS}
    base, key = tenant.model_endpoint(cfg.endpoint, cfg.api_key_env)
    response = await upstream.open("POST", base + "/chat/completions", json_headers(key), jsontext.dumps(body))
    raw = await decoded(response).read()
    if response.status != 200:
        raise MemoryModelError(f"memory model answered {response.status}")
    data = orjson.loads(raw)
    ops = []
    for call in data["choices"][0]["message"].get("tool_calls") or []:
        args = orjson.loads(call["function"].get("arguments") or "{}")
        name = call["function"]["name"]
        if name == "set_memory" and isinstance(args.get("key"), str):
            ops.append(("set", args["key"], str(args.get("value", ""))))
        elif name == "delete_memory" and isinstance(args.get("key"), str):
            ops.append(("delete", args["key"], ""))
    return ops, data.get("usage")
