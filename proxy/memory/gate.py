"""The embedded memory gate: is the newest user message asking to remember, update or forget?

Multilingual patterns for explicit requests (English, Spanish, French, German, Portuguese,
Italian, Japanese, Chinese), plus short confirmations ("yes, remember that", "sí, guárdalo")
read against the assistant's offer to remember that they answer. Stated preferences and
personal facts without a request are not requests: the default memory instructions keep only
what the user asks to keep, so the gate says no and the memory model does not run.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from proxy.messages import message_text

_REQUEST = re.compile(
    "|".join(
        [
            # English
            r"\b(please\s+)?(remember|memori[sz]e|keep in mind|note down|make a note|save (this|that|it)|store (this|that))\b",
            r"\b(don'?t|do not) forget\b",
            r"\bforget (that|about|where|what|my|everything|it)\b|\bforget\b.*\b(please|now)\b|^\s*forget\b",
            r"\b(update|change|correct) (my|the) (memory|location|address|name|preference|info|details|profile)",
            r"\bupdate (that|it) in (your )?memory\b",
            r"\b(change|update|correct|set|add|save|put|store)\b.{0,60}\b(in|to|into|from) (your )?memory\b",
            # Spanish
            r"\b(recuerda|recuérdalo|recordá|acuérdate|guarda (esto|eso|que)|guárdalo|no olvides|olvida|olvídalo|"
            r"actualiza (mi|la))\b",
            # French
            r"\b(souviens-toi|rappelle-toi|retiens|n'oublie pas|oublie|mémorise|enregistre (ça|cela|que)|"
            r"mets à jour (mon|ma))\b",
            # German
            r"\b(merk dir|merke dir|vergiss|speicher(e)?,?\s+(das|dass|bitte)|aktualisiere (mein\w*)|behalte im kopf)\b",
            # Portuguese
            r"\b(lembre(-se)?|lembra(-te)?|não esqueça|esqueça|memorize|guarde (isso|que)|atualize (meu|minha))\b",
            # Italian
            r"\b(ricorda(ti|lo|la|melo)?|non dimenticare|dimentica|memorizza|aggiorna (il mio|la mia))\b",
            # Japanese
            r"(覚えて|覚えておいて|記憶して|忘れて|忘れないで|メモして|更新して)",
            # Chinese
            r"(记住|記住|忘掉|忘记|忘記|别忘了|別忘了|更新我的|帮我记)",
        ]
    ),
    re.IGNORECASE,
)
_CONFIRM = re.compile(
    r"^\s*(yes|yeah|yep|sure|ok(ay)?|please do|do it|go ahead|sí|si|claro|oui|d'accord|ja|gerne|sim|certo|"
    r"はい|お願い|好的|是的|可以)\b[\s,.!]*.{0,40}$",
    re.IGNORECASE,
)
_OFFER = re.compile(
    r"\b(remember|save|store|keep|note)\b.{0,60}\b(for (you|next time|later)|in (my )?memory)\b|"
    r"\b(should|shall|want me to|would you like me to) (i )?(remember|save|store|note)\b",
    re.IGNORECASE,
)
_QUESTION_ABOUT = re.compile(
    r"\b(do you|can you|what do you|how do you)\s+(remember|recall)\b|"
    r"\bhow (do|can|could|should) (i|we|one)\b.{0,20}\b(remember|memori[sz]e)\b|\bhow to (remember|memori[sz]e)\b",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class GateResult:
    probability: float  # P(the newest message asks to remember, update or forget)
    category: str | None = None  # a valid_keys category, when one fits
    updates: bool = False  # the request changes an existing entry


class MemoryGate(Protocol):
    """One judgment: does the newest user message ask to remember, update or forget something?"""

    async def judge(self, text: str, context: Sequence[dict[str, Any]], valid_keys: Sequence[str],
                    memory: dict[str, str]) -> GateResult: ...


def newest_window(messages: Sequence[dict[str, Any]], context_messages: int) -> tuple[str, list[dict[str, Any]]]:
    """The newest user message's text and the few messages before it (context only)."""
    for i in range(len(messages) - 1, -1, -1):
        if messages[i].get("role") == "user":
            return message_text(messages[i]), list(messages[max(0, i - context_messages) : i])
    return "", []


class LexicalMemoryGate:
    """No network, no model: patterns over the newest message, with its context for confirmations."""

    async def judge(self, text: str, context: Sequence[dict[str, Any]], valid_keys: Sequence[str],
                    memory: dict[str, str]) -> GateResult:
        return self.judge_now(text, context, valid_keys, memory)

    def judge_now(self, text: str, context: Sequence[dict[str, Any]], valid_keys: Sequence[str],
              memory: dict[str, str]) -> GateResult:
        if not text.strip() or _QUESTION_ABOUT.search(text):
            return GateResult(0.02)
        explicit = bool(_REQUEST.search(text))
        if not explicit:
            offered = any(m.get("role") == "assistant" and _OFFER.search(message_text(m)) for m in context[-2:])
            explicit = offered and bool(_CONFIRM.match(text))
        if not explicit:
            return GateResult(0.03)
        lowered = text.lower()
        category = next((k for k in valid_keys if k.lower() in lowered), None)
        updates = any(k.lower() in lowered for k in memory) or bool(re.search(r"\b(update|actually|moved|now)\b", lowered))
        return GateResult(0.95, category, updates)
