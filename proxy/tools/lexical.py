"""BM25 over tool names, descriptions and parameters: the embedded default ranker.

Fields are weighted (a name word counts three times, a parameter word half) and folded
into one BM25F-style term frequency per tool. The index is built once per catalog; a query
walks only the postings of its own words, so 1,000 tools cost well under a millisecond.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence

from proxy.tools.text import split_identifier, stem, terms

NAME_WEIGHT = 3.0
DESCRIPTION_WEIGHT = 1.0
PARAM_WEIGHT = 0.5
K1 = 1.2
B = 0.75


def term_frequencies(name: str, description: str, params: str) -> dict[str, float]:
    """One tool's weighted term frequencies: computed once per schema and cached with it."""
    tf: dict[str, float] = defaultdict(float)
    for word in split_identifier(name):
        tf[stem(word)] += NAME_WEIGHT
    for word in terms(description):
        tf[word] += DESCRIPTION_WEIGHT
    for word in terms(params):
        tf[word] += PARAM_WEIGHT
    return dict(tf)


class LexicalIndex:
    def __init__(self, docs: Sequence[dict[str, float]]) -> None:
        """`docs`: each tool's `term_frequencies`, in catalog order."""
        self.size = len(docs)
        postings: dict[str, list[tuple[int, float]]] = defaultdict(list)
        lengths = [sum(tf.values()) for tf in docs]
        for i, tf in enumerate(docs):
            for word, weight in tf.items():
                postings[word].append((i, weight))
        average = (sum(lengths) / len(lengths)) if lengths else 1.0
        norms = [K1 * (1 - B + B * length / average) for length in lengths]
        self._postings: dict[str, list[tuple[int, float]]] = {}
        for word, docs_tf in postings.items():
            idf = math.log(1 + (self.size - len(docs_tf) + 0.5) / (len(docs_tf) + 0.5))
            self._postings[word] = [(doc, idf * f * (K1 + 1) / (f + norms[doc])) for doc, f in docs_tf]

    def scores(self, query: str) -> dict[int, float]:
        """BM25 score per tool index, for tools sharing at least one word with the query."""
        scores: dict[int, float] = defaultdict(float)
        for word in set(terms(query)):
            for doc, weight in self._postings.get(word, ()):
                scores[doc] += weight
        return scores
