"""Words for lexical matching: split snake/camel/kebab case, lower-case, Snowball stems.

The stop list holds function words plus the words every request is made of ("can you
help me find…"): they carry no signal about which tool a turn needs.
"""

from __future__ import annotations

import re
from functools import lru_cache

import snowballstemmer

_CAMEL = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|[0-9]+")
_STEMMER = snowballstemmer.stemmer("english")

STOPWORDS = frozenset(
    """
    a about above after again against all also am an and any are as at be because been before being below
    between both but by can could did do does doing down during each few for from further get give had has have
    having he her here hers herself him himself his how i if in into is it its itself just let like me might
    more most must my myself no nor not of off on once only or other ought our ours ourselves out over own
    please same shall she should show so some such than that the their theirs them themselves then there these
    they this those through to too under until up us very want was we were what when where which while who whom
    why will with would yes you your yours yourself yourselves able anything assist currently detailed details
    find help information interested kindly know looking lot lots many may much need needs one possible
    provide really recommend request requesting something specific specifically suggest sure tell way well
    wondering
    """.split()  # noqa: SIM905
)


@lru_cache(maxsize=65536)
def stem(word: str) -> str:
    return str(_STEMMER.stemWord(word))


def split_identifier(name: str) -> list[str]:
    """`github__createPullRequest` → ['github', 'create', 'pull', 'request'] (any text: one regex pass)."""
    return [p.lower() for p in _CAMEL.findall(name)]


def terms(text: str) -> list[str]:
    """Index/query terms: split, lower-cased, stop words dropped, stemmed."""
    return [stem(w) for w in split_identifier(text) if w not in STOPWORDS]
