"""Case-insensitive patterns that read ASCII text without the IGNORECASE flag.

The needs-tool gate and the clause splitter search each new message with long alternations of
words under `re.IGNORECASE`; Python's `re` tries every alternative at every position, and with
the flag each comparison folds case (2-4x slower). For ASCII text (most turns) the same answer
comes from the text lower-cased, searched by the pattern with its ASCII letters lower-cased
(escapes such as `\\W` kept) and without the flag. Each non-ASCII letter the flag lets match an
ASCII one (dotless i matches `i` and `I`) becomes a class holding the lower-case ASCII letters too.
`str.lower` keeps ASCII text's length, so positions (`split`, `sub`) refer to the original text.
Text in other scripts uses the pattern as written.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from functools import cache


@cache
def _ascii_twins(ch: str) -> str:
    """The lower-case ASCII characters `ch` matches under IGNORECASE (for a non-ASCII `ch`)."""
    return "".join(sorted({chr(a).lower() for a in range(128) if re.fullmatch(re.escape(ch), chr(a), re.IGNORECASE)}))


def lowered(source: str) -> str:
    """`source` (a pattern) for lower-cased ASCII text without IGNORECASE."""
    out: list[str] = []
    in_class = False
    i = 0
    while i < len(source):
        ch = source[i]
        if ch == "\\":
            out.append(source[i : i + 2])  # an escape keeps its case: \W is not \w
            i += 2
            continue
        if in_class:
            if ch == "]" and out[-1] not in ("[", "[^"):
                in_class = False
        elif ch == "[":
            in_class = True
            if source[i + 1 : i + 2] == "^":
                out.append("[^")
                i += 2
                continue
        if ch.isascii():
            out.append(ch.lower())
        elif twins := _ascii_twins(ch):
            out.append(ch + twins if in_class else f"[{ch}{twins}]")
        else:
            out.append(ch)
        i += 1
    return "".join(out)


class Caseless:
    """One IGNORECASE pattern, searched the fast way when the text is ASCII."""

    def __init__(self, pattern: re.Pattern[str]) -> None:
        assert pattern.flags & re.IGNORECASE, "only for case-insensitive patterns"
        self.pattern = pattern
        self.ascii = re.compile(lowered(pattern.pattern), pattern.flags & ~re.IGNORECASE)

    def _matches(self, text: str) -> Iterator[re.Match[str]]:
        if text.isascii():
            return self.ascii.finditer(text.lower())
        return self.pattern.finditer(text)

    def search(self, text: str) -> bool:
        if text.isascii():
            return self.ascii.search(text.lower()) is not None
        return self.pattern.search(text) is not None

    def count(self, text: str) -> int:
        """How many times it matches (`len(pattern.findall(text))`)."""
        return sum(1 for _ in self._matches(text))

    def split(self, text: str) -> list[str]:
        """`pattern.split(text)` for a pattern without groups."""
        assert not self.pattern.groups, "split keeps no groups' text"
        if not text.isascii():
            return self.pattern.split(text)
        parts: list[str] = []
        start = 0
        for match in self._matches(text):
            parts.append(text[start : match.start()])
            start = match.end()
        parts.append(text[start:])
        return parts

    def sub(self, replacement: str, text: str) -> str:
        """`pattern.sub(replacement, text)` for a plain replacement (no group references)."""
        if not text.isascii():
            return self.pattern.sub(replacement, text)
        parts: list[str] = []
        start = 0
        for match in self._matches(text):
            parts += (text[start : match.start()], replacement)
            start = match.end()
        parts.append(text[start:])
        return "".join(parts)
