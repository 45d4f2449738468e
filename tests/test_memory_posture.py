"""The memory gate's inverted posture: skip only what is clearly not about memory, in any language."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.memory.gate import NOT_SURE, YES, LexicalMemoryGate
from proxy.memory.posture import declines, skip_class

OFFER = {"role": "assistant", "content": "Want me to remember that you like window seats?"}


def probability(text: str, context: list[dict[str, Any]] | None = None) -> float:
    return LexicalMemoryGate().judge_now(text, context or [], (), {}).probability


@pytest.mark.parametrize("text", [
    "From now on, answer in metric units", "Going forward keep answers under five lines",
    "I'd rather you didn't use emoji", "I'm allergic to peanuts", "Actually it's Maria, not Mary",
    "no, I live in Porto now", "Ab jetzt bitte immer auf Deutsch", "A partir de ahora respóndeme en español",
    "今後は敬語でお願いします", "以后请用简体中文回答", "Mi hija tiene cinco años",
])
def test_statements_preferences_corrections_and_standing_instructions_run_the_model(text: str) -> None:
    assert probability(text) >= 0.5, text


@pytest.mark.parametrize("text, kind", [
    ("thanks, that fixed it!", "small_talk"), ("no thanks", "small_talk"), ("nope, don't save that", "small_talk"),
    ("How do I save a matplotlib plot as PNG?", "question"), ("is it safe to swim after eating", "question"),
    ("do you remember the function we wrote earlier?", "question"), ("¿Cuál es la capital de Australia?", "question"),
    ("Write a haiku about autumn", "work"), ("Don't forget to add tests for the parser", "work"),
    ("i need to book a table for two tonight", "work"), ("Übersetze das bitte ins Englische", "work"),
    ("この文章を英語に翻訳してください", "work"), ("def add(a, b):\n    return a + b", "code"),
])
def test_what_is_clearly_not_about_memory_is_skipped(text: str, kind: str) -> None:
    assert skip_class(text) == kind
    assert probability(text) < 0.5


def test_a_reply_to_an_offer_to_remember_is_never_skipped_but_a_no_is() -> None:
    assert probability("yes please", [OFFER]) == YES
    assert probability("sure, and also aisle seats on short flights", [OFFER]) >= 0.5
    assert probability("no thanks", [OFFER]) < 0.5
    assert declines("Nein danke") and not declines("No, it's Maria")


def test_words_of_keeping_only_inside_a_quote_are_someone_elses() -> None:
    said = "My grandfather used to say  "
    assert skip_class(said, (), "My grandfather used to say 'remember who you are'") == "quote"


def test_a_language_the_patterns_do_not_know_runs_unless_small_talk_or_code() -> None:
    assert probability("Ninapendelea majibu mafupi kuanzia sasa") == NOT_SURE  # Swahili: a preference
    assert probability("ขอบคุณครับ") >= 0.5  # Thai thanks: not in the small-talk list, so not confident
