"""The embedded needs-tool gate: does this turn need any tool at all?

A small logistic model over the ranking's raw top score and the shape of the message:
a task the model does itself ("write a haiku", "explain…"), a knowledge question ("why…"),
a request to fetch or act ("can you find…", "show me…"), real-world or live words
("latest", "price", "my"…), and small talk (always no); with the `local` backend also the
model's raw cosines to the nearest tools and to built-in examples of turns that do and do not
need a tool. Its weights are fitted by
`bench/fit_gate.py` on MetaTool's awareness set and Keel's labelled agent queries; that
script prints held-out accuracy, and `bench/tools.py` reports the gate as shipped.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

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
WEIGHTS = (-2.371, 1.583, 1.176, -0.892, -0.577, 1.124, 0.665, -0.246, -0.556, -0.422, -0.433, 0.736)


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


# Turns that need a tool and turns that do not, for the local model's gate: a turn close in
# meaning to the first kind more than to the second likelier needs a tool, whatever the catalog.
# Written for Keel, generic on purpose (none is taken from an evaluation set).
NEEDS_TOOL_EXAMPLES = (
    "What's the weather in Berlin right now?", "Book a table for two at an Italian restaurant tonight.",
    "Find flights from London to New York next Friday.", "What is Apple's stock price today?",
    "Show me the latest news about the election.", "Send a message to the team channel saying the build is fixed.",
    "Create a new branch in my repository.", "Look up the reviews for this hotel.",
    "Search the web for the newest iPhone release date.", "Order a large pepperoni pizza for delivery.",
    "Check my calendar for meetings tomorrow.", "Convert 100 US dollars to euros at today's rate.",
    "Find a nearby pharmacy that is open now.", "Get the directions from my office to the airport.",
    "What are the trending topics on Twitter today?", "Read the file report.txt and tell me what it says.",
    "List the open issues in our project.", "Track my package with this tracking number.",
    "Play some relaxing jazz music.", "Buy tickets for the concert on Saturday.",
    "Find the cheapest parking garage near the stadium.", "What movies are showing at the cinema this weekend?",
    "Check whether my server at example.com is up.", "Add milk and eggs to my shopping list.",
    "Translate and download the subtitles for this YouTube video.",
)
NO_TOOL_EXAMPLES = (
    "Write a short poem about the sea.", "Explain how photosynthesis works.",
    "What is the difference between a virus and a bacterium?", "Summarize the following paragraph in one sentence.",
    "Translate this sentence into French.", "Give me three ideas for a birthday party theme.", "Why do cats purr?",
    "Rewrite this email so it sounds more polite.", "What does the word ephemeral mean?",
    "Tell me a joke about programmers.", "How do I stay motivated when studying?",
    "Compose a limerick about a lazy dog.", "What are the pros and cons of remote work?",
    "Who wrote Pride and Prejudice?", "Describe the plot of Hamlet in a few lines.", "Solve 2x + 3 = 11.",
    "Brainstorm names for a coffee shop.", "Is it better to rent or buy a house, in general?",
    "What would a good first sentence for a novel be?", "Pretend you are a pirate and greet me.",
    "Help me outline an essay on climate change.", "Classify these words as nouns or verbs.",
    "What causes the seasons on Earth?", "Give me advice on how to be a better listener.",
    "Draft a thank-you note for my colleague.",
)

# The same features plus the local model's evidence, each x10: the best five raw cosines to
# the catalog's tools (top, top - 5th, mean) and the margin between the turn's closeness to the
# needs-tool and the no-tool examples (mean of the best three each). Fitted for all-MiniLM-L6-v2.
SEMANTIC_WEIGHTS = (-4.950, 0.784, 0.606, -0.742, -0.512, 0.931, 0.290, -0.123, -0.432, -0.287, -0.495, 0.600,
                    0.595, -0.027, 0.552, 0.980)
# The cosine scale those weights were fitted on: mean and spread of the pairwise cosines among
# the example turns (printed by bench/fit_gate.py). Another model (or a different export that
# moves them by more than SCALE_TOLERANCE) gets the lexical gate instead of miscalibrated evidence.
SEMANTIC_SCALE = (0.0837, 0.0944)
SCALE_TOLERANCE = 0.02


def on_fitted_scale(mean: float, spread: float) -> bool:
    """Do a model's example-turn cosines live on the scale SEMANTIC_WEIGHTS were fitted on?"""
    return abs(mean - SEMANTIC_SCALE[0]) <= SCALE_TOLERANCE and abs(spread - SEMANTIC_SCALE[1]) <= SCALE_TOLERANCE


@dataclass(frozen=True)
class SemanticEvidence:
    cosines: Sequence[float]  # the best raw cosines to the catalog's tools, best first
    example_margin: float  # closeness to NEEDS_TOOL_EXAMPLES minus closeness to NO_TOOL_EXAMPLES


def semantic_features(text: str, top_score: float, evidence: SemanticEvidence) -> list[float]:
    """`features` plus the local model's evidence."""
    top5 = list(evidence.cosines[:5]) or [0.0]
    return [*features(text, top_score), 10 * top5[0], 10 * (top5[0] - top5[-1]), 10 * sum(top5) / len(top5),
            10 * evidence.example_margin]


def needs_tool_probability(top_score: float, text: str, evidence: SemanticEvidence | None = None) -> float:
    """P(the turn needs a tool); small talk is always 0. `evidence`: the local model's, when the
    ranking has it."""
    if conversational(text):
        return 0.0
    if evidence is None:
        pairs = zip(WEIGHTS, features(text, top_score), strict=True)
    else:
        pairs = zip(SEMANTIC_WEIGHTS, semantic_features(text, top_score, evidence), strict=True)
    z = sum(w * x for w, x in pairs)
    return 1 / (1 + math.exp(-z))
