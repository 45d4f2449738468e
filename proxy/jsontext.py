"""Faithful JSON: read a client's body and write it back without changing what it means.

orjson is fast but reads a few valid texts differently from how they were written: an
integer beyond 64 bits becomes a float (digits lost), `1.50` and `1e5` come back as `1.5`
and `100000.0`, and `1e400` is refused. `loads` notices (the digits, dots and exponents of
the text must survive a round trip) and then reads the body again with the standard
library, each such number kept as its own text, which `dumps` writes back verbatim. Key
order is never sorted on the way out: a JSON schema's property order is what Structured
Outputs generate in. Only hashes use `canonical`, which sorts keys.

`read` is orjson's reading alone, for a body Keel never writes back (a turn no planner acts
on): its numbers are not checked. `Resent` parses a big member a client resends byte for byte (an agent's tools array, on every
call) once: a later body whose member starts with the same bytes is parsed without it.
"""

from __future__ import annotations

import json
import re
import secrets
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import orjson

# Everything but the characters a number is written with: the text left after deleting
# these is the sequence of number characters (strings' digits included, in order).
_NOT_NUMBER_CHARS = bytes(range(256)).translate(None, b"0123456789.eE+-")
_UNICODE_ESCAPE = re.compile(rb"\\u[0-9a-fA-F]{4}")

# JSON as a client or a provider wrote it: objects, arrays, strings, numbers, booleans and null,
# to any depth. Keel passes most of it on untouched and narrows with isinstance where it reads a
# value, so this is the one place `Any` stands for it: everywhere else in proxy/ a JSON value is
# `Json` and a JSON object `JsonObject`, which says what the value is. Measured: as the recursive
# union (None | bool | int | float | str | list[Json] | dict[str, Json]) strict mypy reports 1,311
# errors in 55 files, each a read that narrows by isinstance later or not at all.
Json = Any  # Any: JSON of any depth (above); the one alias, counted by tests/test_structure.py
JsonObject = dict[str, Json]


class UnreadableJsonError(ValueError):
    """JSON nested deeper than Keel reads (1024) or writes (254): forwarded untouched."""


class JsonFloat(float):
    """A number whose text orjson would rewrite; `text` is written back as received."""

    __slots__ = ("text",)
    text: str

    def __new__(cls, text: str) -> JsonFloat:
        self = super().__new__(cls, float(text))
        self.text = text
        return self


class JsonInt(int):
    """An integer beyond 64 bits, kept as its text."""

    text: str

    def __new__(cls, text: str) -> JsonInt:
        self = super().__new__(cls, int(text))
        self.text = text
        return self


def _refuse_constant(name: str) -> Json:
    raise json.JSONDecodeError(f"{name} is not valid JSON", name, 0)


def _number_text(raw: bytes) -> bytes:
    if b"\\u" in raw:  # escapes carry hex digits that orjson writes as the character itself
        raw = _UNICODE_ESCAPE.sub(b"", raw)
    return raw.translate(None, _NOT_NUMBER_CHARS)


def faithful(raw: bytes, value: Json) -> bool:
    """Does orjson's reading of `raw` write back every number as it was written?"""
    try:
        again = orjson.dumps(value)
    except orjson.JSONEncodeError as exc:  # nested deeper than orjson writes (254)
        raise UnreadableJsonError(str(exc)) from None
    return _number_text(raw) == _number_text(again)


def loads(raw: bytes) -> Json:
    """Parse JSON; numbers orjson would change are kept as `JsonFloat`/`JsonInt`.

    Raises `ValueError` for text that is not JSON, `UnreadableJsonError` for JSON too deep
    to hold."""
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        if "depth" in str(exc).lower() or "recursion" in str(exc).lower():
            raise UnreadableJsonError(str(exc)) from None
        # anything else orjson refuses (a huge number, a lone surrogate escape, a BOM) the standard
        # library may still read; what it cannot read either is not JSON
    else:
        if faithful(raw, value):
            return value
    try:
        return json.loads(raw, parse_float=JsonFloat, parse_int=_int, parse_constant=_refuse_constant)
    except RecursionError:
        raise UnreadableJsonError("nesting too deep") from None
    except UnicodeDecodeError as exc:
        raise ValueError(f"not UTF-8: {exc}") from None


def read(raw: bytes) -> Json:
    """Parse JSON for reading only: orjson's reading, numbers as orjson makes them (no round-trip
    check; a body read this way is never written back). Same errors as `loads`."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        if "depth" in str(exc).lower() or "recursion" in str(exc).lower():
            raise UnreadableJsonError(str(exc)) from None
    return loads(raw)  # what orjson refuses the standard library may still read


def _int(text: str) -> int:
    value = int(text)
    return JsonInt(text) if not -(2**63) <= value < 2**64 or str(value) != text else value  # big, or -0


def _fragment(value: Json) -> Json:
    if isinstance(value, (JsonFloat, JsonInt)):
        return orjson.Fragment(value.text)
    raise TypeError(f"not JSON: {type(value).__name__}")


def dumps(value: Json) -> bytes:
    """Compact JSON in the value's own key order, numbers as the client wrote them."""
    return orjson.dumps(value, default=_fragment, option=orjson.OPT_PASSTHROUGH_SUBCLASS)


def canonical(value: Json) -> bytes:
    """Stable bytes for hashing: sorted keys, no whitespace, null-valued keys dropped."""
    if type(value) is dict and all(type(v) is str for v in value.values()):  # a plain message: nothing to drop
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
    return orjson.dumps(_drop_nulls(value), default=_fragment,
                        option=orjson.OPT_SORT_KEYS | orjson.OPT_PASSTHROUGH_SUBCLASS)


def _drop_nulls(value: Json) -> Json:
    if isinstance(value, Mapping):
        return {k: _drop_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_drop_nulls(v) for v in value]
    return value


_TOKEN = re.compile(rb'"(?:[^"\\]|\\.)*"|[\[\]{}]')


def _array_end(raw: bytes, start: int) -> int:
    """Where the JSON array that opens at `start` ends (one past its `]`), else -1: strings
    skipped whole, brackets counted (once per distinct array text, then it is remembered)."""
    depth = 0
    for token in _TOKEN.finditer(raw, start):
        first = token.group()[:1]
        if first in (b"[", b"{"):
            depth += 1
        elif first in (b"]", b"}"):
            depth -= 1
            if depth == 0:
                return token.end()
    return -1


class Resent:
    """Values of one top-level member (`tools`) that clients resend byte for byte, parsed once.

    After a body is parsed whole, its member's value is remembered with its text, when the client
    wrote it compactly (as orjson writes it: the SDKs do). A later body whose member starts with a
    remembered text (compared as bytes, in C) is parsed with a placeholder in its place, and the
    remembered value is put back: the same value, shared, so nothing may change it in place (the
    planners build new lists and dicts). Anything unexpected (the member is not where the
    placeholder landed, a duplicate key, an unreadable rest) is parsed whole, as `loads` would.
    """

    PREFIX = 256  # bytes of a value's text that index it

    def __init__(self, member: str = "tools", min_bytes: int = 4096, size: int = 32,
                 max_bytes: int = 64 * 1024 * 1024) -> None:
        self._key = b'"' + member.encode() + b'"'
        self._member = member
        self._min_bytes, self._size, self._max_bytes = min_bytes, size, max_bytes
        self._bytes = 0
        self._known: OrderedDict[bytes, Json] = OrderedDict()  # text -> its value, newest last
        self._by_prefix: dict[bytes, list[bytes]] = {}
        self._placeholder = "\x00keel-resent-" + secrets.token_hex(8)  # never a client's value
        self._marker = orjson.dumps(self._placeholder)

    def _start(self, raw: bytes) -> int:
        """Where the member's value starts in `raw` (its first occurrence as a key), else -1."""
        at = raw.find(self._key)
        if at < 0:
            return -1
        at += len(self._key)
        while at < len(raw) and raw[at] in b" \t\r\n":
            at += 1
        if raw[at : at + 1] != b":":
            return -1
        at += 1
        while at < len(raw) and raw[at] in b" \t\r\n":
            at += 1
        return at if raw[at : at + 1] == b"[" else -1

    def loads(self, raw: bytes, read_only: bool = False) -> Json:
        """`loads(raw)` (`read(raw)` when `read_only`), the member's value taken from memory when
        its text was seen before."""
        parse = read if read_only else loads
        start = self._start(raw) if len(raw) >= self._min_bytes else -1
        if start < 0:
            return parse(raw)
        for text in self._by_prefix.get(raw[start : start + self.PREFIX], ()):
            if raw.startswith(text, start):
                try:
                    body = parse(raw[:start] + self._marker + raw[start + len(text):])
                except ValueError:
                    break
                if isinstance(body, dict) and body.get(self._member) == self._placeholder:
                    self._known.move_to_end(text)
                    body[self._member] = self._known[text]
                    return body
                break
        body = parse(raw)
        self._learn(raw, start, body)
        return body

    def _learn(self, raw: bytes, start: int, body: Json) -> None:
        value = body.get(self._member) if isinstance(body, dict) else None
        if not isinstance(value, list) or not value:
            return
        try:  # compact, as orjson writes it? (its first element tells, before the whole is written)
            if raw.startswith(b"[" + orjson.dumps(value[0]), start):
                text = orjson.dumps(value)
            else:  # written another way (spaced, indented): its own text, found once by its brackets
                end = _array_end(raw, start)
                text = raw[start:end] if end > start else b""
                if not text or not faithful(text, value):
                    return
        except (orjson.JSONEncodeError, TypeError):  # too deep, or a number kept as text: parsed each time
            return
        if len(text) < self._min_bytes or not raw.startswith(text, start) or text in self._known:
            return
        self._known[text] = value
        self._by_prefix.setdefault(text[: self.PREFIX], []).insert(0, text)
        self._bytes += len(text)
        while len(self._known) > self._size or self._bytes > self._max_bytes:
            old, _ = self._known.popitem(last=False)
            self._bytes -= len(old)
            same = self._by_prefix[old[: self.PREFIX]]
            same.remove(old)
            if not same:
                del self._by_prefix[old[: self.PREFIX]]
