"""Keel keys wherever a request carries them, so that none ever reaches a provider.

Clients put keys in many places: `Authorization` (Bearer, Basic `user:password`, any other
scheme), `x-api-key` (Anthropic's SDKs), `api-key` (Azure's), a cookie, another header, the
query string (`?api_key=`), even the path. Keel reads its own key from the three credential
headers (`CREDENTIAL_HEADERS`) and never forwards them for a Keel-keyed caller; everything else
it forwards is searched here, word by word, before it leaves. A credential header a passthrough
caller forwards as its own is refused when any word of it is, or looks like, a Keel key (a
mistyped or revoked one too, by `server.keel_key_prefixes`); any other slot is refused when a
word of it is a configured Keel key (a prefix alone proves nothing in a cookie or a user agent).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
from collections.abc import Iterable, Iterator, Mapping
from urllib.parse import parse_qsl, unquote

CREDENTIAL_HEADERS = ("authorization", "x-api-key", "api-key")  # where a client's own key goes
CREDENTIAL_PARAMETERS = frozenset({"api_key", "api-key", "apikey", "key", "token", "access_token"})
_WORDS = re.compile(r"[\s:,;=&\"'/]+")
_BASIC = re.compile(r"^\s*basic\s+(\S+)\s*$", re.IGNORECASE)


def words(value: str) -> list[str]:
    """The words a credential may hide among: split on spaces and separators, a Basic
    credential's `user:password` decoded too."""
    found = [w for w in _WORDS.split(value) if w]
    basic = _BASIC.match(value) if value.lstrip()[:5].lower() == "basic" else None
    if basic is not None:
        try:
            decoded = base64.b64decode(basic.group(1) + "==", validate=False).decode("utf-8", "replace")
        except (binascii.Error, ValueError):
            decoded = ""
        found += [w for w in _WORDS.split(decoded) if w]
    return found


class KeelKeys:
    """The digest of every configured Keel key (tenant, admin and user keys) and the prefixes
    that mark a token as meant for Keel. A digest is looked up in a set: its timing says nothing
    about a key (the comparison that authenticates is `Authenticator`'s, in constant time)."""

    def __init__(self, digests: Iterable[bytes], prefixes: Iterable[str]) -> None:
        self._digests = frozenset(digests)
        self._prefixes = tuple(p.lower() for p in prefixes)

    def is_key(self, word: str) -> bool:
        return hashlib.sha256(word.encode(errors="surrogatepass")).digest() in self._digests

    def looks_like(self, word: str) -> bool:
        """A Keel key, or a token shaped like one (a prefix of `server.keel_key_prefixes`)."""
        return (bool(self._prefixes) and word.lower().startswith(self._prefixes)) or self.is_key(word)

    def in_credential(self, value: str) -> bool:
        """Does a credential header's value carry (or look like) a Keel key, in any scheme?"""
        return any(self.looks_like(w) for w in (*words(value), value.strip()) if w)

    def carrier(self, headers: Iterable[tuple[str, str]], query: str, path: str,
                forwarded_credentials: Mapping[str, str]) -> str | None:
        """The first slot of a request Keel would forward that holds a Keel key, or None.
        `headers`: the client's (credential headers are looked at in `forwarded_credentials`,
        which holds those that go upstream as the caller's own)."""
        for name, value in forwarded_credentials.items():
            if self.in_credential(value):
                return f"the {name} header"
        for name, value in headers:
            if name.lower() not in CREDENTIAL_HEADERS and any(self.is_key(w) for w in words(value)):
                return f"the {name.lower()} header"
        for name, value in _parameters(query):
            if name.lower() in CREDENTIAL_PARAMETERS and self.in_credential(value):
                return f"the query parameter {name}"
            if any(self.is_key(w) for w in (*words(name), *words(value))):
                return f"the query parameter {name}"
        if any(self.is_key(w) for w in words(_decoded(path))):
            return "the path"
        return None


def _parameters(query: str) -> Iterator[tuple[str, str]]:
    yield from parse_qsl(query, keep_blank_values=True)
    yield "", unquote(query)  # a key that parse_qsl splits oddly (no '=', ';' separators) is still seen whole


def _decoded(path: str) -> str:
    for _ in range(3):
        path, previous = unquote(path), path
        if path == previous:
            break
    return path
