"""Words for lexical matching, in any script, and a rough guess at a message's language.

Latin-script words are split on snake/camel/kebab case, lower-cased and Snowball-stemmed
(English: tool catalogs are written in English). Unsegmented scripts (CJK, kana, Thai…) and
Hangul become character bigrams, so two texts in those scripts meet on shared characters
without a segmenter. A request in another language also carries the English words of the
tool-domain glossary (`proxy.tools.lexicon`) it uses, so it can meet an English catalog.

The stop list holds function words plus the words every request is made of ("can you
help me find…"): they carry no signal about which tool a turn needs.
"""

from __future__ import annotations

import re
from collections import Counter
from functools import lru_cache
from itertools import groupby

import snowballstemmer

from proxy.tools.caseless import Caseless
from proxy.tools.lexicon import LONGEST, PHRASES, WORD_STARTS, normalized

_CAMEL = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|[0-9]+")
# Letters and digits, with the combining marks Indic, Thai and Arabic words are spelled with
# (a matra is not a `\w` character: without them "बनाओ" falls apart into "बन" and "ओ").
_TOKEN = re.compile(r"(?:[^\W_]|[\u0300-\u036F\u064B-\u065F\u0670\u0900-\u0963\u0966-\u0DFF\u0E00-\u0E7F])+",
                    re.UNICODE)
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

# Unsegmented scripts (no spaces between words) and Hangul: character bigrams.
_NGRAM_RANGES = ((0x3040, 0x30FF), (0x3400, 0x4DBF), (0x4E00, 0x9FFF), (0xF900, 0xFAFF), (0xAC00, 0xD7AF),
                 (0x1100, 0x11FF), (0x3130, 0x318F), (0x0E00, 0x0EFF), (0x1000, 0x109F), (0x1780, 0x17FF))
_SCRIPTS = (("ja", 0x3040, 0x30FF), ("zh", 0x4E00, 0x9FFF), ("zh", 0x3400, 0x4DBF), ("ko", 0xAC00, 0xD7AF),
            ("ko", 0x1100, 0x11FF), ("ru", 0x0400, 0x04FF), ("ar", 0x0600, 0x06FF), ("ar", 0x0750, 0x077F),
            ("hi", 0x0900, 0x097F), ("th", 0x0E00, 0x0E7F), ("el", 0x0370, 0x03FF), ("he", 0x0590, 0x05FF))
# Function words that tell Latin-script languages apart (a vote, not a classifier).
_FUNCTION_WORDS = {
    "en": "the a an to of and is are my me you your for in on with this that it what how please can i do",
    "de": "der die das und ist ich mir mich mein meine meinen nicht ein eine einen bitte du dir wie was warum "
          "im auf mit zu von dass den dem wir kannst noch",
    "es": "el la los las de que y es por para con mi mis me un una en del al se lo qué cómo dónde favor puedes "
          "tu está soy muy",
    "fr": "le la les de des du et est je moi mon ma mes un une pour que qui dans sur avec pas ne tu vous "
          "s'il c'est j'ai au aux ce cette",
    "pt": "o a os as de do da dos das e é que em no na um uma meu minha para por com não eu você se isso "
          "esse essa está",
    "it": "il lo la gli le di del della e è che un una per con non mi mio mia sono ho ti questo questa come "
          "perché nel nella",
    "nl": "de het een en is van ik mijn me niet dat die op te voor met je jij wat hoe waarom graag ben zijn",
    "tr": "bir ve bu için ile ben benim beni bana de da mi mı ne nasıl çok değil lütfen şu olarak var yok",
    "pl": "i w z na się nie to jest że do mój moja mnie mi jak czy co proszę dla od jestem",
    "id": "yang dan di ke dari ini itu untuk dengan saya aku kamu tidak bisa apa bagaimana tolong ada adalah sudah",
    "vi": "của là và tôi không có cho với này được một những các bạn làm sao gì đã hãy rằng",
}
_WORDS = {lang: frozenset(words.split()) for lang, words in _FUNCTION_WORDS.items()}


@lru_cache(maxsize=65536)
def stem(word: str) -> str:
    return str(_STEMMER.stemWord(word))


def split_identifier(name: str) -> list[str]:
    """`github__createPullRequest` → ['github', 'create', 'pull', 'request'] (ASCII words only)."""
    return [p.lower() for p in _CAMEL.findall(name)]


def _ngram(ch: str) -> bool:
    code = ord(ch)
    return any(low <= code <= high for low, high in _NGRAM_RANGES)


def terms(text: str) -> list[str]:
    """Index/query terms: ASCII words split, lower-cased, stop words dropped, stemmed; words of
    other alphabets lower-cased; runs of unsegmented scripts as character bigrams."""
    out: list[str] = []
    for token in _TOKEN.findall(text):
        if token.isascii():
            out += [stem(w) for w in split_identifier(token) if w not in STOPWORDS]
            continue
        for unsegmented, chars in groupby(token, _ngram):
            run = "".join(chars)
            if unsegmented:
                out += [run] if len(run) == 1 else [run[i : i + 2] for i in range(len(run) - 1)]
            elif run.isascii():
                out += [stem(w) for w in split_identifier(run) if w not in STOPWORDS]
            else:
                out.append(run.lower())
    return out


# A turn's text is read several times per request (ranking, server names, the needs-tool gate,
# each step of a multi-step ask): the pure functions of it are cached, so each runs once.
TEXT_CACHE = 256


@lru_cache(maxsize=TEXT_CACHE)
def turn_terms(text: str) -> tuple[str, ...]:
    """`terms` of a turn's text, computed once: the gate's shape, the ranking's query and the
    learned phrases all read them (a catalog's descriptions use `terms` itself, uncached)."""
    return tuple(terms(text))


@lru_cache(maxsize=TEXT_CACHE)
def language(text: str) -> str:
    """A rough guess: a script's language (ja, zh, ko, ru, ar, hi…), the Latin-script language
    whose function words the text uses most, 'en' for ASCII text using none, else 'und'."""
    scripts: Counter[str] = Counter()
    for ch in "" if text.isascii() else text:  # ASCII is all below 0x0370: no script to count
        code = ord(ch)
        if code < 0x0370:
            continue
        for name, low, high in _SCRIPTS:
            if low <= code <= high:
                scripts[name] += 1
                break
        else:
            scripts["other"] += 1
    if scripts:
        name, count = scripts.most_common(1)[0]
        if "ja" in scripts and name == "zh":
            return "ja"  # kanji with kana
        latin = sum(c.isalpha() and ord(c) < 0x0250 for c in text)
        if count >= latin / 2:
            return "und" if name == "other" else name
    words = [w.lower() for w in re.findall(r"[^\W\d_]+(?:'[^\W\d_]+)?", text)]
    votes = Counter({lang: sum(w in vocab for w in words) for lang, vocab in _WORDS.items()})
    best, hits = votes.most_common(1)[0] if votes else ("und", 0)
    if hits and votes["en"] == hits:
        return "en"
    if hits:
        return best
    return "en" if text.isascii() else "und"


def glossed(text: str) -> list[str]:
    """English glossary words for the tool-domain words a non-English text uses."""
    lowered = text.lower()
    found = [english for phrase, english in PHRASES.items() if phrase in lowered]
    for token in _TOKEN.findall(lowered):
        if any(_ngram(c) for c in token):
            for i in range(len(token)):
                for j in range(i + 2, min(len(token), i + LONGEST) + 1):
                    if token[i:j] in WORD_STARTS:
                        found.append(WORD_STARTS[token[i:j]])
            continue
        for j in range(min(len(token), LONGEST), 2, -1):
            if token[:j] in WORD_STARTS:
                found.append(WORD_STARTS[token[:j]])
                break
    return found


def query_terms(text: str) -> list[str]:
    """A turn's terms: its own, plus the glossary's English words when it is not in English."""
    return list(_query_terms(text))


@lru_cache(maxsize=TEXT_CACHE)
def _query_terms(text: str) -> tuple[str, ...]:
    text = normalized(text)
    own = turn_terms(text)
    if language(text) == "en":
        return own
    return own + tuple(terms(" ".join(glossed(text))))


_CLAUSE = Caseless(re.compile(
    r"\s*(?:[;\n]|(?<=[.!?])\s+|,?\s+(?:and\s+)?then\b|,?\s+after\s+that\b|,?\s+afterwards\b|,\s+and\b|,?\s+and\s+also\b|"
    r",?\s+(?:und\s+)?(?:dann|danach|anschließend)\b|,?\s+(?:y\s+)?(?:luego|después)\b|,?\s+(?:et\s+)?(?:puis|ensuite)\b|"
    r",?\s+(?:e\s+)?(?:depois|em seguida|poi|quindi)\b|,?\s+(?:en\s+)?(?:daarna|dan)\b|,?\s+(?:а\s+)?(?:затем|потом)\b|"
    r"然后|之后|接着|、?それから|その後|그리고|그 다음|ve sonra|a potem|lalu|rồi|"
    r"\s+and\s+(?=(?:get|post|send|create|open|read|write|save|list|show|find|search|add|delete|remove|merge|move|"
    r"take|click|check|run|commit|push|deploy|reply|notify|tell|email|share|upload|download|fetch|close|assign|"
    r"update|scale|restart|book|star|fork|tag|label)\b))\s*",
    re.IGNORECASE,
))


def clauses(text: str) -> list[str]:
    """The steps of a multi-step ask ("file a ticket, then post the link in the channel"): the
    text cut at sequencing words and at "and" before an action verb; one clause when it has none."""
    return list(_clauses(text))


@lru_cache(maxsize=TEXT_CACHE)
def _clauses(text: str) -> tuple[str, ...]:
    parts = [p.strip(" ,.;，、。") for p in _CLAUSE.split(text)]
    return tuple([p for p in parts if len(p) >= 3] or [text])


def english_hint(text: str) -> str:
    """The text with the glossary's English words appended when it is not in English: what an
    English sentence-embedding model can read of it."""
    if language(text) == "en":
        return text
    words = list(dict.fromkeys(glossed(normalized(text))))
    return f"{text} ({' '.join(words)})" if words else text
