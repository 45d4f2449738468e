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


class LexicalIndex:
    def __init__(self, docs: Sequence[tuple[str, str, str]]) -> None:
        """`docs`: (name, description, parameter text) per tool, in catalog order."""
        self.size = len(docs)
        postings: dict[str, dict[int, float]] = defaultdict(dict)
        lengths = []
        for i, (name, description, params) in enumerate(docs):
            tf: dict[str, float] = defaultdict(float)
            for word in split_identifier(name):
                tf[stem(word)] += NAME_WEIGHT
            for word in terms(description):
                tf[word] += DESCRIPTION_WEIGHT
            for word in terms(params):
                tf[word] += PARAM_WEIGHT
            lengths.append(sum(tf.values()))
            for word, weight in tf.items():
                postings[word][i] = weight
        average = (sum(lengths) / len(lengths)) if lengths else 1.0
        self._postings: dict[str, list[tuple[int, float]]] = {}
        for word, docs_tf in postings.items():
            idf = math.log(1 + (self.size - len(docs_tf) + 0.5) / (len(docs_tf) + 0.5))
            weighted = []
            for doc, frequency in docs_tf.items():
                norm = K1 * (1 - B + B * lengths[doc] / average)
                weighted.append((doc, idf * frequency * (K1 + 1) / (frequency + norm)))
            self._postings[word] = weighted

    def scores(self, query: str) -> dict[int, float]:
        """BM25 score per tool index, for tools sharing at least one word with the query."""
        scores: dict[int, float] = defaultdict(float)
        for word in set(terms(query)):
            for doc, weight in self._postings.get(word, ()):
                scores[doc] += weight
        return scores
