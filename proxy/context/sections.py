"""A system prompt as sections, with the timestamps in it recognised.

Sections are what a client toggles or rewrites: XML-ish tagged blocks (`<memory>…</memory>`),
markdown-headed blocks (`## Tools`), and otherwise blank-line separated blocks. Each has a
key that survives edits to its body (the tag, the heading, or the block's first line), so a
change is seen as "this section changed", not "one removed, one added".

Timestamps (ISO 8601, RFC 2822, "YYYY-MM-DD HH:MM:SS", "Monday, November 30, 2026",
"11/30/2026", "14:03:59") are masked when sections are compared: a clock line that ticks
is not a change.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

_MONTHS = r"(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Sept|Oct|Nov|Dec)[a-z]*\.?"
_DAYS = r"(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun)[a-z]*\.?"
TIMESTAMP = re.compile(
    "|".join(
        [
            r"\d{4}-\d{2}-\d{2}(?:[T ]\d{1,2}:\d{2}(?::\d{2}(?:[.,]\d+)?)?(?:\s?(?:Z|UTC|GMT|[+-]\d{2}:?\d{2}))?)?",
            rf"(?:{_DAYS},?\s+)?\d{{1,2}}\s+{_MONTHS}\s+\d{{4}}(?:\s+\d{{1,2}}:\d{{2}}(?::\d{{2}})?(?:\s+(?:[+-]\d{{4}}|GMT|UTC))?)?",
            rf"(?:{_DAYS},?\s+)?{_MONTHS}\s+\d{{1,2}}(?:st|nd|rd|th)?,?\s+\d{{4}}(?:,?\s+(?:at\s+)?\d{{1,2}}:\d{{2}}(?::\d{{2}})?(?:\s?[AaPp]\.?[Mm]\.?)?)?",
            r"\d{1,2}/\d{1,2}/\d{2,4}(?:,?\s+\d{1,2}:\d{2}(?::\d{2})?(?:\s?[AaPp][Mm])?)?",
            r"\b\d{1,2}:\d{2}(?::\d{2}(?:\.\d+)?)?(?:\s?[AaPp]\.?[Mm]\.?)?(?:\s?(?:UTC|GMT|Z))?\b",
            rf"\b{_DAYS}\b",
            r"\b\d{10,13}\b",  # epoch seconds or milliseconds
        ]
    )
)

# Only a ticking clock: a time of day to the second, or an ISO datetime's time. Dates, bare
# numbers and weekdays stay: two system prompts that differ in a birthdate or a phone number
# are two conversations (`proxy.chain` seeds with this mask, never with `mask`).
CLOCK = re.compile(
    r"(?<=\d{4}-\d{2}-\d{2}[T ])\d{1,2}:\d{2}(?::\d{2}(?:[.,]\d+)?)?(?:\s?(?:Z|UTC|GMT|[+-]\d{2}:?\d{2}))?"
    r"|\b\d{1,2}:\d{2}:\d{2}(?:[.,]\d+)?(?:\s?[AaPp]\.?[Mm]\.?)?(?:\s?(?:Z|UTC|GMT|[+-]\d{2}:?\d{2}))?"
)

_TAG = re.compile(r"<([A-Za-z][\w.-]*)(?:\s[^<>]*)?>.*?</\1\s*>", re.DOTALL)
_HEADING = re.compile(r"^#{1,6}\s+\S.*$", re.MULTILINE)


# Masking a long prompt costs milliseconds (these patterns try every position), and a prompt
# with a clock is a new text every request while its sections and paragraphs stay the same:
# each is masked once (bounded caches; a cached text costs a hash, microseconds).
MASKED_TEXTS = 1024


@lru_cache(maxsize=MASKED_TEXTS)
def mask(text: str) -> str:
    """The text with every timestamp replaced by a placeholder."""
    return TIMESTAMP.sub("<time>", text)


def mask_clock(text: str) -> str:
    """The text with only its clock readings (time of day to the second) masked: paragraph by
    paragraph (no reading spans a blank line, and none looks across one), each cached."""
    return "\n\n".join(_mask_clock(paragraph) for paragraph in text.split("\n\n"))


@lru_cache(maxsize=MASKED_TEXTS)
def _mask_clock(text: str) -> str:
    return CLOCK.sub("<clock>", text)


@dataclass(frozen=True)
class Section:
    key: str
    text: str

    @property
    def masked(self) -> str:
        return mask(self.text)


def _blocks(text: str) -> list[tuple[str, str]]:
    out = []
    for block in re.split(r"\n\s*\n", text):
        block = block.strip("\n")
        if block.strip():
            first = mask(block.strip().splitlines()[0])[:80]
            out.append((f"block: {first}", block))
    return out


def _headed(text: str) -> list[tuple[str, str]]:
    matches = list(_HEADING.finditer(text))
    if not matches:
        return _blocks(text)
    out = _blocks(text[: matches[0].start()])
    for i, match in enumerate(matches):
        end = matches[i + 1].start() if i + 1 < len(matches) else len(text)
        out.append((match.group(0).strip(), text[match.start() : end].strip("\n")))
    return out


def split_sections(text: str) -> list[Section]:
    """Sections in order of appearance; duplicate keys get a #n suffix."""
    raw: list[tuple[str, str]] = []
    position = 0
    for match in _TAG.finditer(text):
        raw += _headed(text[position : match.start()])
        raw.append((f"<{match.group(1)}>", match.group(0)))
        position = match.end()
    raw += _headed(text[position:])
    seen: dict[str, int] = {}
    sections = []
    for key, body in raw:
        seen[key] = seen.get(key, 0) + 1
        sections.append(Section(key if seen[key] == 1 else f"{key} #{seen[key]}", body))
    return sections
