"""proxy/tools/caseless.py on its own: a case-insensitive pattern read the fast way (ASCII text
lower-cased, no IGNORECASE flag) answers exactly as the pattern itself does."""

from __future__ import annotations

import random
import re

import pytest

from proxy.tools import gate, text
from proxy.tools.caseless import Caseless, lowered

WRAPPED = {"REQUEST": gate.REQUEST, "LIVE": gate.LIVE, "_SIGN_OFF": gate._SIGN_OFF, "_ACT_SIGNAL": gate._ACT_SIGNAL,
           "_OWN_WORK": gate._OWN_WORK, "_LEANS": gate._LEANS, "_MINE": gate._MINE, "_CLAUSE": text._CLAUSE}
FILLER = ["the", "a", "report", "Berlin", "acme/widgets", "#12", "ABC-123", "x.py", "www.example.com", "?", ".", ",",
          ";", "\n", "  ", "it's", "today's", "I'm", "that's all", "see you", "now", "my", "poem", "then", "and"]


def texts(pattern: re.Pattern[str], count: int = 300) -> list[str]:
    """ASCII messages made of the pattern's own words and some filler, in random case."""
    words = [w for w in re.findall(r"[A-Za-z][A-Za-z' ]*[A-Za-z]", pattern.pattern) if w.isascii()] + FILLER
    rng = random.Random(7)
    out = []
    for _ in range(count):
        picked = [rng.choice(words) for _ in range(rng.randint(1, 12))]
        message = rng.choice(["", "please ", "Can you ", "OK, "]) + " ".join(picked)
        out.append("".join(c.upper() if rng.random() < 0.3 else c for c in message))
    return out


@pytest.mark.parametrize("name", sorted(WRAPPED))
def test_the_gate_patterns_answer_as_written(name: str) -> None:
    """Every wrapped pattern of the gate and the clause splitter: search, count, split and sub
    agree with the IGNORECASE pattern on ASCII messages in any case."""
    caseless = WRAPPED[name]
    pattern = caseless.pattern
    found = 0
    for message in texts(pattern):
        assert caseless.search(message) == (pattern.search(message) is not None), message
        assert caseless.count(message) == len(pattern.findall(message)), message
        assert caseless.sub(" ", message) == pattern.sub(" ", message), message
        if not pattern.groups:
            assert caseless.split(message) == pattern.split(message), message
        found += caseless.search(message)
    assert found > 0  # the messages reach the pattern's words, not only its misses


def test_a_non_ascii_letter_keeps_the_ascii_letters_it_matches() -> None:
    """IGNORECASE lets the dotless i match i and I, and the Kelvin sign match k: so does the fast way."""
    for source, message in (("yakın", "YAKIN"), ("yakın", "yakin"), ("\u212aeep", "keep"), ("[x\u212a]eep", "Keep")):
        pattern = re.compile(source, re.IGNORECASE)
        assert pattern.search(message)
        assert Caseless(pattern).search(message), (source, message)


def test_escapes_keep_their_case() -> None:
    """\\W is not \\w: only the pattern's letters are lower-cased, never an escape's."""
    assert lowered(r"A\WB[A-Z]\S\d") == r"a\Wb[a-z]\S\d"
    caseless = Caseless(re.compile(r"a\Wb", re.IGNORECASE))
    assert caseless.search("A-B")
    assert not caseless.search("AxB")


def test_other_scripts_use_the_pattern_as_written() -> None:
    """Text beyond ASCII is searched by the pattern itself (its case folding is Unicode's)."""
    caseless = Caseless(re.compile(r"über|straße", re.IGNORECASE))
    assert caseless.search("Grüße ÜBER alles")
    assert caseless.split("a ÜBER b") == ["a ", " b"]
    assert caseless.sub("-", "STRASSE Straße") == "STRASSE -"
