"""BM25 over tool names, descriptions and parameters: the embedded default ranker.

Fields are weighted (a name word counts three times, a parameter word half) and folded
into one BM25F-style term frequency per tool. The index is built once per catalog; a query
walks only the postings of its own words, so 1,000 tools cost well under a millisecond.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Sequence

from proxy.tools.text import STOPWORDS, query_terms, split_identifier, stem, terms

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
        for word in set(query_terms(query)):
            for doc, weight in self._postings.get(word, ()):
                scores[doc] += weight
        return scores

    def weighted_scores(self, weights: dict[str, float]) -> dict[int, float]:
        """BM25 per tool of a query whose terms weigh unequally (`weights`: term -> weight)."""
        scores: dict[int, float] = defaultdict(float)
        for word, weight in weights.items():
            for doc, contribution in self._postings.get(word, ()):
                scores[doc] += weight * contribution
        return scores


# Leading name words that are actions, not products: `list_issues` is no "list" family.
_VERB_WORDS = (
    "get list create update delete search read write add remove set find manage execute run analyze apply "
    "generate describe fetch retrieve move edit post put patch query check start stop cancel mark merge push "
    "open close upload download install uninstall upgrade toggle trigger simulate show convert batch bulk data"
)
_VERBS = frozenset(stem(w) for w in _VERB_WORDS.split())
_WORD = re.compile(r"[A-Za-z][A-Za-z0-9]+")


def _product_words(text: str) -> tuple[set[str], set[str]]:
    """Stems a description capitalizes mid-sentence (Jira, CloudWatch), and every stem it uses."""
    capitalized, every = set(), set()
    for match in _WORD.finditer(text):
        word, start = match.group(), match.start()
        every.add(stem(word.lower()))
        initial = start == 0 or text[max(0, start - 2) : start].strip() in ("", ".", "!", "?", ":", "-", "*", "#")
        if word[0].isupper() and not initial and len(word) >= 4 and stem(word.lower()) not in _VERBS:
            capitalized.add(stem(word.lower()))
    return capitalized, every


class Namespaces:
    """Which tools a request naming a product or server means: "in Linear…", "the Jira ticket",
    "with kubectl". Groups come from the `server__` prefix (each of its words), from a name's
    leading word shared by three or more tools and used by few others (slack_*, browser_*), and
    from product words the descriptions capitalize mid-sentence (GitHub, Confluence, CloudWatch)
    that one server owns."""

    def __init__(self, names: Sequence[str], descriptions: Sequence[str], servers: Sequence[str | None]) -> None:
        groups: dict[str, set[int]] = defaultdict(set)
        family: dict[str, set[int]] = defaultdict(set)
        mentions: dict[str, set[int]] = defaultdict(set)
        uses: dict[str, set[int]] = defaultdict(set)
        for i, (name, server, text) in enumerate(zip(names, servers, descriptions, strict=True)):
            for part in (server or "").split("_"):
                if len(part) >= 3 and stem(part) not in _VERBS:
                    groups[stem(part.lower())].add(i)
            words = split_identifier(name.split("__", 1)[-1])
            if words and len(words[0]) >= 3 and stem(words[0]) not in _VERBS | STOPWORDS:
                family[stem(words[0])].add(i)
            capitalized, every = _product_words(text)
            for word in capitalized:
                mentions[word].add(i)
            for word in every:
                uses[word].add(i)
        for word, members in family.items():
            if len(members) >= 3 and len(uses.get(word, set()) - members) <= len(members) // 10:
                groups[word] |= members
        for word, members in mentions.items():
            if len(members) < 3 or word in STOPWORDS or len(uses[word]) > 1.25 * len(members):
                continue
            owners: dict[str | None, int] = defaultdict(int)
            for i in members:
                owners[servers[i]] += 1
            owner, count = max(owners.items(), key=lambda kv: kv[1])
            if owner is not None and count >= 0.8 * len(members):
                groups[word] |= {i for i, s in enumerate(servers) if s == owner}
            elif owner is None and len(members) <= len(names) // 2:
                groups[word] |= members
        self.groups = {w: frozenset(m) for w, m in groups.items() if len(m) < len(names)}

    def named(self, query: str) -> frozenset[int]:
        """Tools of every group the query names (empty when it names none)."""
        found: set[int] = set()
        for word in set(query_terms(query)):
            found |= self.groups.get(word, frozenset())
        return frozenset(found)
