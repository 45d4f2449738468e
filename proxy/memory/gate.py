"""The embedded memory gate: is the newest user message about memory, or clearly not?

Costs are asymmetric (a skipped memory is lost, an extra run is one cheap call), so the posture
is inverted: the gate says a confident yes to explicit requests about the user, in 17 languages
(`proxy.memory.phrases`: keep "remember that I…", forget, "call me Sam", updates "I moved to
Porto", a yes to the assistant's offer to remember), a confident no only to what is clearly not
about memory (`proxy.memory.posture`: small talk and acknowledgements, questions, requests for
work, code, unless they carry a standing instruction such as "from now on…"), and NOT_SURE,
which runs the memory model, to everything else: first-person statements, preferences,
corrections, and a language the patterns do not know (there only small talk and code are
skipped). Quoted speech is not the user's own words.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from proxy.jsontext import JsonObject
from proxy.memory import phrases
from proxy.memory.posture import skip_class
from proxy.messages import message_text
from proxy.tools.text import language

_QUOTED = re.compile(r"\"[^\"]{2,}\"|“[^”]{2,}”|„[^“”]{2,}[“”]|«[^»]{2,}»|「[^」]{2,}」|『[^』]{2,}』|"
                     r"(?<![\w])'[^']{2,}'(?![\w])|‘[^’]{2,}’")
_IMPERATIVE_EN = re.compile(
    r"(?:^|[,.;:!?]\s*|\b(?:please|pls|and|also|just|kindly|always|so|ok|okay|yes|yeah|now|can you|could you|"
    r"would you|will you|you should|i want you to|i'd like you to|need you to|make sure to|try to|to)\s+)$",
    re.IGNORECASE,
)
YES, NO, NOT_SURE = 0.95, 0.03, 0.6


@dataclass(frozen=True)
class GateResult:
    probability: float  # P(the newest message asks to remember, update or forget)
    category: str | None = None  # a valid_keys category, when one fits
    updates: bool = False  # the request changes an existing entry


class MemoryGate(Protocol):
    """One judgment: does the newest user message ask to remember, update or forget something?"""

    async def judge(self, text: str, context: Sequence[JsonObject], valid_keys: Sequence[str],
                    memory: dict[str, str]) -> GateResult: ...


def newest_window(messages: Sequence[JsonObject], context_messages: int) -> tuple[str, list[JsonObject]]:
    """The newest user message's text and the few messages before it (context only)."""
    for i in range(len(messages) - 1, -1, -1):
        if messages[i].get("role") == "user":
            return message_text(messages[i]), list(messages[max(0, i - context_messages) : i])
    return "", []


class LexicalMemoryGate:
    """No network, no model: patterns over the newest message, with its context for confirmations."""

    async def judge(self, text: str, context: Sequence[JsonObject], valid_keys: Sequence[str],
                    memory: dict[str, str]) -> GateResult:
        return self.judge_now(text, context, valid_keys, memory)

    def judge_now(self, text: str, context: Sequence[JsonObject], valid_keys: Sequence[str],
                  memory: dict[str, str]) -> GateResult:
        if not text.strip():
            return GateResult(NO)
        said = _QUOTED.sub(" ", text)  # what the user says, not what someone else said
        lang = language(said if said.strip() else text)
        short_latin = lang == "und" and len(said.split()) <= 4 and all(ord(c) < 0x0250 for c in said)
        if lang not in phrases.LANGUAGES and not short_latin:  # a language the patterns do not know:
            skipped = skip_class(said, context, text) in ("small_talk", "code")  # only what reads alike in any
            return GateResult(NO if skipped else NOT_SURE)
        if not (asks(said, context) or confirms(said, context)):
            # the posture: skip only what is clearly not about memory; run the memory model for the rest
            return GateResult(NO if skip_class(said, context, text) else NOT_SURE)
        lowered = text.lower()
        category = next((k for k in valid_keys if k.lower() in lowered), None)
        updates = any(k.lower() in lowered for k in memory) or _found(phrases.UPDATE, lang, said) is not None or bool(
            re.search(r"\b(update|actually|moved|now)\b", lowered))
        return GateResult(YES, category, updates)


def _found(table: dict[str, re.Pattern[str] | None], lang: str, text: str) -> re.Match[str] | None:
    pattern = table.get(lang)
    return pattern.search(text) if pattern else None


def asks(text: str, context: Sequence[JsonObject]) -> bool:
    """An explicit request about the user: to be called something, an update, or to keep or
    forget something the user says of themself, in any of the languages (each language's verbs
    with its own first-person words, so a short or mixed message needs no language guess)."""
    question = (text.rstrip().endswith(("?", "？", "؟")) or phrases.WH_START.search(text)) and not (
        phrases.MODAL.search(text) and not phrases.WH_START.search(text))
    if phrases.RECALL.search(text) or question:
        return False
    return any(_asks_in(text, lang, context) for lang in phrases.LANGUAGES)


def _asks_in(text: str, lang: str, context: Sequence[JsonObject]) -> bool:
    if _found(phrases.CALL_ME, lang, text) or _found(phrases.UPDATE, lang, text):
        return True
    first_person = lang in phrases.PRO_DROP or _found(phrases.FIRST_PERSON, lang, text) is not None
    keep = _found(phrases.KEEP, lang, text)
    if keep and first_person and (lang != "en" or _imperative(text[: keep.start()])):
        return True
    dont = _found(phrases.DONT_FORGET, lang, text)
    if dont:  # "don't forget that I…", never "don't forget to add tests"
        return _found(phrases.FIRST_PERSON, lang, text) is not None and not re.match(r"\s+to\b", text[dont.end():], re.IGNORECASE)
    forget = _found(phrases.FORGET, lang, text)
    if forget is None or phrases.TASK_OBJECT.search(text) or (lang == "en" and not _imperative(text[: forget.start()])):
        return False
    after_saving = any(m.get("role") == "assistant" and phrases.OFFER.search(message_text(m)) for m in context[-2:])
    return first_person or after_saving or bool(re.search(r"\b(?:about me|everything)\b", text, re.IGNORECASE))


def _imperative(before: str) -> bool:
    """Does an English verb that starts after `before` give an order ("please remember", "and
    forget…"), rather than tell ("I also remember", "before I forget")?"""
    if re.search(r"\b(?:i|you|we|they|he|she|it|who|that)\s+(?:\w+\s+)?$", before, re.IGNORECASE):
        return bool(re.search(r"\b(?:can|could|would|will) you\s+(?:please\s+|just\s+)?$", before, re.IGNORECASE))
    return bool(_IMPERATIVE_EN.search(before))


def confirms(text: str, context: Sequence[JsonObject]) -> bool:
    """A short yes to the assistant's offer to remember something, in any of the languages."""
    if len(text) > 80 or phrases.NO.search(text) or not phrases.YES.search(text):
        return False
    return any(m.get("role") == "assistant" and phrases.OFFER.search(message_text(m))
               and any(mark in message_text(m) for mark in "?？؟") for m in context[-2:])
