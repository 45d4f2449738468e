"""Provider prompt-cache simulation for the stand-in, under OpenAI's or Anthropic's rules.

OpenAI: the prompt rendered to tokens (tools, then messages); a request reads the longest
prefix of whole 128-token blocks, at least 1,024 tokens, that an earlier request also had.
Anthropic: only prefixes ending at a `cache_control` breakpoint are written (at most 4 per
request, each at least the model's minimum length); a breakpoint reads the longest cached
prefix ending at it or at one of the 20 blocks before it.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Sequence
from dataclasses import dataclass

from proxy.chain import canonical_json
from proxy.jsontext import Json, JsonObject
from proxy.tokens import TokenCounter

OPENAI_MIN_TOKENS = 1024
OPENAI_BLOCK = 128
ANTHROPIC_MAX_BREAKPOINTS = 4
ANTHROPIC_LOOKBACK = 20


class TooManyBreakpointsError(ValueError):
    pass


@dataclass(frozen=True)
class Block:
    """One cacheable unit of the prompt: a tool, a system part, a message part."""

    text: str
    breakpoint: bool


@dataclass(frozen=True)
class CacheUsage:
    prompt_tokens: int
    cached_tokens: int  # read from cache
    cache_write_tokens: int  # written to cache (Anthropic rules only)
    ceiling_tokens: int = 0  # the longest prefix, in whole blocks, that any earlier request already sent


def _strip(value: Json) -> Json:
    if isinstance(value, dict):
        return {k: _strip(v) for k, v in value.items() if k != "cache_control"}
    return value


def prompt_blocks(body: JsonObject) -> list[Block]:
    """The prompt in provider order, as blocks; `cache_control` marks breakpoints, not content."""
    blocks: list[Block] = []
    for tool in body.get("tools") or []:
        blocks.append(Block(canonical_json(_strip(tool)).decode(), isinstance(tool, dict) and "cache_control" in tool))
    for message in body.get("messages") or []:
        role = str(message.get("role", ""))
        content = message.get("content")
        if isinstance(content, list):
            for i, part in enumerate(content):
                head = f"<|{role}|>" if i == 0 else ""
                text = part.get("text") if isinstance(part, dict) and part.get("type") == "text" else None
                rendered = head + (text if isinstance(text, str) else canonical_json(_strip(part)).decode())
                blocks.append(Block(rendered, isinstance(part, dict) and "cache_control" in part))
        else:
            text = f"<|{role}|>" + (content if isinstance(content, str) else "")
            blocks.append(Block(text, "cache_control" in message))
        extra = {k: message[k] for k in ("tool_calls", "tool_call_id", "name") if message.get(k) is not None}
        if extra:
            blocks.append(Block(canonical_json(extra).decode(), False))
    return blocks


class PrefixCache:
    """Everything the simulated provider has cached so far, in memory, per process."""

    def __init__(self, tokens: TokenCounter, anthropic_min_tokens: int = 1024) -> None:
        self.tokens = tokens
        self.anthropic_min_tokens = anthropic_min_tokens
        self._openai: set[bytes] = set()
        self._anthropic: set[bytes] = set()
        self._sent: set[bytes] = set()  # every block prefix ever sent, for the ceiling

    def ceiling(self, blocks: Sequence[Block]) -> int:
        """Tokens of the longest block prefix already sent (what a perfect cache would serve)."""
        h = hashlib.blake2b(digest_size=16)
        running = best = 0
        digests = []
        for block in blocks:
            h.update(block.text.encode())
            h.update(b"\x00")
            running += len(self.tokens.encode(block.text))
            digest = h.copy().digest()
            digests.append(digest)
            if digest in self._sent:
                best = running
        self._sent.update(digests)
        return best

    def openai(self, blocks: Sequence[Block]) -> CacheUsage:
        ids = array("I")
        for block in blocks:
            ids.extend(self.tokens.encode(block.text))
        total = len(ids)
        h = hashlib.blake2b(digest_size=16)
        cached = 0
        boundaries = []
        for end in range(OPENAI_BLOCK, total + 1, OPENAI_BLOCK):
            h.update(ids[end - OPENAI_BLOCK : end].tobytes())
            if end >= OPENAI_MIN_TOKENS:
                digest = h.digest()
                boundaries.append(digest)
                if digest in self._openai:
                    cached = end
        self._openai.update(boundaries)
        return CacheUsage(total, cached, 0)

    def anthropic(self, blocks: Sequence[Block]) -> CacheUsage:
        breakpoints = [i for i, b in enumerate(blocks) if b.breakpoint]
        if len(breakpoints) > ANTHROPIC_MAX_BREAKPOINTS:
            raise TooManyBreakpointsError(
                f"A maximum of {ANTHROPIC_MAX_BREAKPOINTS} blocks with cache_control may be provided. "
                f"Found {len(breakpoints)}."
            )
        ends: list[int] = []  # tokens up to the end of block i
        digests: list[bytes] = []
        h = hashlib.blake2b(digest_size=16)
        running = 0
        for block in blocks:
            running += len(self.tokens.encode(block.text))
            h.update(block.text.encode())
            h.update(b"\x00")
            ends.append(running)
            digests.append(h.copy().digest())
        total = running
        read = 0
        for bp in breakpoints:
            for j in range(bp, max(-1, bp - ANTHROPIC_LOOKBACK - 1), -1):
                if digests[j] in self._anthropic:
                    read = max(read, ends[j])
                    break
        writable = [bp for bp in breakpoints if ends[bp] >= self.anthropic_min_tokens]
        written = 0
        if writable and ends[writable[-1]] > read:
            written = ends[writable[-1]] - read
        self._anthropic.update(digests[bp] for bp in writable)
        return CacheUsage(total, read, written)
