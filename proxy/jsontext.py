"""Faithful JSON: read a client's body and write it back without changing what it means.

orjson is fast but reads a few valid texts differently from how they were written: an
integer beyond 64 bits becomes a float (digits lost), `1.50` and `1e5` come back as `1.5`
and `100000.0`, and `1e400` is refused. `loads` notices (the digits, dots and exponents of
the text must survive a round trip) and then reads the body again with the standard
library, each such number kept as its own text, which `dumps` writes back verbatim. Key
order is never sorted on the way out: a JSON schema's property order is what Structured
Outputs generate in. Only hashes use `canonical`, which sorts keys.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

import orjson

# Everything but the characters a number is written with: the text left after deleting
# these is the sequence of number characters (strings' digits included, in order).
_NOT_NUMBER_CHARS = bytes(range(256)).translate(None, b"0123456789.eE+-")
_UNICODE_ESCAPE = re.compile(rb"\\u[0-9a-fA-F]{4}")


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


def _refuse_constant(name: str) -> Any:
    raise json.JSONDecodeError(f"{name} is not valid JSON", name, 0)


def _number_text(raw: bytes) -> bytes:
    if b"\\u" in raw:  # escapes carry hex digits that orjson writes as the character itself
        raw = _UNICODE_ESCAPE.sub(b"", raw)
    return raw.translate(None, _NOT_NUMBER_CHARS)


def faithful(raw: bytes, value: Any) -> bool:
    """Does orjson's reading of `raw` write back every number as it was written?"""
    try:
        again = orjson.dumps(value)
    except orjson.JSONEncodeError as exc:  # nested deeper than orjson writes (254)
        raise UnreadableJsonError(str(exc)) from None
    return _number_text(raw) == _number_text(again)


def loads(raw: bytes) -> Any:
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


def _int(text: str) -> int:
    value = int(text)
    return JsonInt(text) if not -(2**63) <= value < 2**64 or str(value) != text else value  # big, or -0


def _fragment(value: Any) -> Any:
    if isinstance(value, (JsonFloat, JsonInt)):
        return orjson.Fragment(value.text)
    raise TypeError(f"not JSON: {type(value).__name__}")


def dumps(value: Any) -> bytes:
    """Compact JSON in the value's own key order, numbers as the client wrote them."""
    return orjson.dumps(value, default=_fragment, option=orjson.OPT_PASSTHROUGH_SUBCLASS)


def canonical(value: Any) -> bytes:
    """Stable bytes for hashing: sorted keys, no whitespace, null-valued keys dropped."""
    return orjson.dumps(_drop_nulls(value), default=_fragment,
                        option=orjson.OPT_SORT_KEYS | orjson.OPT_PASSTHROUGH_SUBCLASS)


def _drop_nulls(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _drop_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_drop_nulls(v) for v in value]
    return value
