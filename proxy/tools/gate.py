"""The embedded needs-tool gate: does this turn need any tool at all?

A small logistic model over the ranking's raw top score and the shape of the message:
a task the model does itself ("write a haiku", "explain…"), a knowledge question ("why…"),
a request to fetch or act ("can you find…", "show me…"), real-world or live words
("latest", "price", "my"…), and small talk (always no); with the `local` backend also the
model's raw cosines to the nearest tools. Its weights are fitted by
`bench/fit_gate.py` on MetaTool's awareness set and Keel's labelled agent queries; that
script prints held-out accuracy, and `bench/tools.py` reports the gate as shipped.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

from proxy.tools.text import terms

TASK = re.compile(
    r"^\s*(write|create (a|an) (story|poem|list|short|essay|song|haiku)|make (a|an) (list|story|poem)|rank|parse|given|"
    r"generate|rewrite|summari[sz]e|classify|explain|describe|compose|edit|identify|convert|answer|tell me (a|about)|"
    r"name|list|give me|suggest|design|come up with|solve|translate|correct|paraphrase|rephrase|categori[sz]e|extract|"
    r"sort|calculate|find the|brainstorm|draft|outline|analy[sz]e|compare|evaluate|determine|provide (a|an)|create a|"
    r"construct|formulate|how would you|imagine|pretend|read the|consider|choose|select|fill|complete|improve|reword|"
    r"detect|decide|predict|estimate)\b",
    re.IGNORECASE,
)
KNOWLEDGE = re.compile(
    r"^\s*(why|how (do|does|did|can|is|are|would|could|should|to|many|much)|what (is|are|was|were|does|do|would|makes|"
    r"happens|causes)|who (is|was|wrote|were|invented)|when (did|was|is)|is it|is there|are there|do you|does|can a|"
    r"can you explain|what's the difference|which is)\b",
    re.IGNORECASE,
)
REQUEST = re.compile(
    r"\b(i need|i want|i'?m looking|i am looking|i'?d like|i would like|can you (find|show|get|search|check|fetch|book|"
    r"recommend|help|provide|tell me where|look)|could you (find|show|get|search|check|fetch|book|recommend|help|provide)|"
    r"help me (find|get|book|search|with)|show me|find me|look up|search for|please (find|show|get|search|check))\b",
    re.IGNORECASE,
)
LIVE = re.compile(
    r"\b(current|currently|latest|today|tonight|now|recent|recently|live|nearby|near me|price|prices|pricing|weather|"
    r"news|trending|stock|stocks|schedule|available|deals?|discounts?|book|booking|reserve|order|buy|purchase|tickets?|"
    r"upcoming|this week|tomorrow|real-time|forecast|score|scores|my)\b",
    re.IGNORECASE,
)

_CONVERSATIONAL = re.compile(
    r"^\s*(?:(?:ok(?:ay)?|k|cool|great|nice|perfect|awesome|thanks?(?: you)?|thank you(?: so much| very much)?|thx|ty|"
    r"cheers|got it|sounds good|sure|yes|yep|yeah|no|nope|hi|hello|hey|good (?:morning|evening|night|afternoon)|"
    r"bye|goodbye|see you|lol|haha|wow|that(?:'s| is| was) (?:\w+ )?(?:great|helpful|perfect|awesome|useful|nice|it)|"
    r"(?:that|this) (?:was|is) (?:really |very |super )?(?:helpful|useful|great|good)|"
    r"you(?:'re| are) (?:the best|great|awesome)|never ?mind|all good|no worries|np)"
    r"[\s,.!?:;)(-]*)+$",
    re.IGNORECASE,
)


def conversational(text: str) -> bool:
    """Thanks, greetings, acknowledgements: turns that need no tool whatever they share in words."""
    return bool(_CONVERSATIONAL.match(text)) or not text.strip()


# intercept, top/10, top/terms, task, knowledge, request, live/3, words/60, multi-line, small talk,
# task*top/10, request*top/10 (fitted by bench/fit_gate.py)
WEIGHTS = (-2.373, 1.581, 1.178, -0.892, -0.577, 1.125, 0.666, -0.243, -0.554, -0.422, -0.432, 0.736)


def features(text: str, top_score: float) -> list[float]:
    top = top_score / 10
    task = float(bool(TASK.match(text)))
    request = float(bool(REQUEST.search(text)))
    return [
        1.0,
        top,
        top_score / max(1, len(terms(text))),
        task,
        float(bool(KNOWLEDGE.match(text))),
        request,
        min(3, len(LIVE.findall(text))) / 3,
        min(60, len(text.split())) / 60,
        float("\n" in text.strip()),
        float(conversational(text)),
        task * top,
        request * top,
    ]


# The same features plus the local model's cosines (top, top - 5th, mean of the top 5; each x10),
# for all-MiniLM-L6-v2: a turn close to some tool's description in meaning needs a tool more often.
SEMANTIC_WEIGHTS = (-5.425, 0.824, 0.788, -0.899, -0.457, 0.965, 0.465, -0.265, -0.524, -0.241, -0.489, 0.573,
                    0.637, -0.036, 0.653)


def semantic_features(text: str, top_score: float, cosines: Sequence[float]) -> list[float]:
    """`features` plus the best five raw cosines' evidence (`cosines` sorted, best first)."""
    top5 = list(cosines[:5]) or [0.0]
    return [*features(text, top_score), 10 * top5[0], 10 * (top5[0] - top5[-1]), 10 * sum(top5) / len(top5)]


def needs_tool_probability(top_score: float, text: str, cosines: Sequence[float] | None = None) -> float:
    """P(the turn needs a tool); small talk is always 0. `cosines`: the local model's best raw
    cosines, when the ranking has them."""
    if conversational(text):
        return 0.0
    if cosines is None:
        pairs = zip(WEIGHTS, features(text, top_score), strict=True)
    else:
        pairs = zip(SEMANTIC_WEIGHTS, semantic_features(text, top_score, cosines), strict=True)
    z = sum(w * x for w, x in pairs)
    return 1 / (1 + math.exp(-z))
