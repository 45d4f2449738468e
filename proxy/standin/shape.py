"""What each API shape the stand-in serves (Chat Completions, Responses, Messages) provides.

One answer loop (`StandIn.serve`) reads, plans, waits, fails and accounts the same way for
every shape; a shape only translates: its request into the chat view `plan_answer` reads, its
prompt into cache blocks in its provider's order, and the `Turn` into its own JSON or SSE.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Literal, Protocol

import orjson
from starlette.responses import Response

from proxy.jsontext import Json, JsonObject
from proxy.standin.caching import Block, CacheUsage
from proxy.standin.script import Script

Rules = Literal["openai", "anthropic"]


@dataclass(frozen=True)
class Turn:
    """One planned, accounted answer, handed to its shape to render."""

    raw: bytes
    body: JsonObject
    view: JsonObject  # the chat view the script was planned from
    script: Script
    cache: CacheUsage
    rules: Rules | None  # the cache rules applied; None without cache simulation
    completion_tokens: int
    headers: dict[str, str]


class Shape(Protocol):
    """One API shape: its request read as chat, its prompt as cache blocks, its answer rendered."""

    rules: Rules | None  # its provider's cache rules; None: chosen by `--rules` (chat)

    def read(self, body: Json) -> JsonObject | None:
        """The request body if it has this shape, else None (a 400)."""

    def chat_view(self, body: JsonObject) -> JsonObject: ...

    def prompt(self, body: JsonObject) -> list[Block]: ...

    def error(self, status: int, message: str, type_: str) -> Response: ...

    def answer(self, turn: Turn) -> Response: ...


async def spoken(script: Script) -> AsyncIterator[str]:
    """The answer text in streamed pieces, a word each, paced by [[drip]]; [[cut]] breaks the
    stream once two pieces are out (every shape's stream then raises, as a dropped connection)."""
    words = (script.text or "").split(" ") if script.text else []
    for i, word in enumerate(words):
        yield word if i == 0 else " " + word
        if script.cut and i == 1:
            raise ConnectionAbortedError("stand-in: stream cut on purpose")
        if script.drip:
            await asyncio.sleep(script.drip)
        elif i % 8 == 7:
            await asyncio.sleep(0)


def pieces(arguments: str, size: int = 16) -> list[str]:
    """Tool-call arguments as streamed: fixed-size slices."""
    return [arguments[i : i + size] for i in range(0, len(arguments), size)]


def named_event(type_: str, payload: JsonObject) -> bytes:
    """An SSE event with an `event:` line, as Responses and Messages stream."""
    return b"event: " + type_.encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"
