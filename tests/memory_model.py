"""A memory model for queue tests: a raw ASGI app that answers like one and counts its runs.

It stores what the newest user message asks ("remember that my <key> is <value>"), answers
503 while `down`, answers 500 for any message containing POISON, waits `delay` seconds per
run, and counts runs per newest message so a test can tell how often each job ran.
"""

from __future__ import annotations

import asyncio
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import orjson
from recorder import lifespan, read_body

_ASK = re.compile(r"remember that my (\w+) is (\S+)", re.IGNORECASE)


@dataclass
class MemoryModel:
    down: bool = False
    delay: float = 0.0
    runs: Counter[str] = field(default_factory=Counter)  # newest user message → runs

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if await lifespan(scope, receive, send):
            return
        status, payload = await self.answer(orjson.loads(await read_body(receive)))
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": orjson.dumps(payload)})

    async def answer(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        users = [m for m in body.get("messages", []) if m.get("role") == "user"]
        text = users[-1]["content"] if users else ""
        text = text if isinstance(text, str) else str(text)
        if self.down:
            return 503, {"error": {"message": "memory model down", "type": "server_error"}}
        self.runs[text] += 1
        if self.delay:
            await asyncio.sleep(self.delay)
        if "POISON" in text:
            return 500, {"error": {"message": "cannot handle this one", "type": "server_error"}}
        ask = _ASK.search(text)
        calls = []
        if ask:
            arguments = orjson.dumps({"key": ask.group(1).lower(), "value": ask.group(2)}).decode()
            calls.append({"id": "c1", "type": "function", "function": {"name": "set_memory", "arguments": arguments}})
        message: dict[str, Any] = {"role": "assistant", "content": None if calls else "nothing to keep"}
        if calls:
            message["tool_calls"] = calls
        return 200, {"id": "m", "object": "chat.completion", "choices": [
            {"index": 0, "message": message, "finish_reason": "tool_calls" if calls else "stop"}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}}
