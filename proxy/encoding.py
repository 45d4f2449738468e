"""Content codings: reading what the provider meant when it compressed its reply.

Clients ask for compression (the SDKs send `Accept-Encoding: gzip, deflate`) and Keel passes
that on, so a provider may answer gzip. Wherever Keel reads a reply (usage, the end of a
stream, the tool_search round loop) it must read the decoded bytes; what it relays unchanged
keeps the provider's encoding, and what it rewrites goes out decoded and labelled so.

Keel asks only for codings it can decode (`accept_encoding`), decodes a piece at a time, and
refuses a reply that inflates past `BOMB_FLOOR` bytes at more than `BOMB_RATIO` to one: no
real answer compresses like that, a decompression bomb does.
"""

from __future__ import annotations

import zlib
from collections.abc import AsyncIterator

from proxy.errors import ProxyError
from proxy.upstream import UpstreamResponse, header

READABLE = ("gzip", "x-gzip", "deflate")  # what Python reads without another package
BOMB_FLOOR = 16 * 1024 * 1024  # bytes decoded before the ratio is checked
BOMB_RATIO = 200
_IDENTITY = ("", "identity")


class ReplyEncodingError(ProxyError):
    """The upstream's reply is in a coding Keel cannot read, or does not decode."""

    status = 502
    type = "server_error"
    code = "upstream_bad_encoding"


def accept_encoding(value: str) -> str:
    """The client's `Accept-Encoding` limited to the codings Keel reads (identity when none is left)."""
    kept = [part.strip() for part in value.split(",")
            if part.split(";", 1)[0].strip().lower() in (*READABLE, "identity")]
    return ", ".join(kept) or "identity"


def coding(response: UpstreamResponse) -> str:
    """The reply's content coding, lower-cased ('' for none)."""
    return header(response, "content-encoding").strip().lower()


def is_encoded(response: UpstreamResponse) -> bool:
    return bool(codings(coding(response)))


def codings(value: str) -> list[str]:
    """The codings a `Content-Encoding` value names, in the order they were applied (identity left out)."""
    return [part.strip().lower() for part in value.split(",") if part.strip().lower() not in _IDENTITY]


class Decoder:
    """One reply's bytes, decoded a piece at a time, however many codings were applied (`gzip,
    gzip` is two); `feed` and `flush` raise `ReplyEncodingError`, also for a body cut short."""

    def __init__(self, value: str) -> None:
        names = codings(value)
        for name in names:
            if name not in READABLE:
                raise ReplyEncodingError(f"the upstream answered in a content coding Keel cannot read: {name!r}")
        self._layers = [_Layer(name) for name in reversed(names)]  # the last applied comes off first

    def feed(self, chunk: bytes) -> bytes:
        for layer in self._layers:
            chunk = layer.feed(chunk)
        return chunk

    def flush(self) -> bytes:
        out = b""
        for i, layer in enumerate(self._layers):
            out = layer.feed(out) + layer.flush() if i else layer.flush()
        return out


class _Layer:
    """One coding's inflater, bounded (a bomb is refused) and strict (a cut body is an error)."""

    def __init__(self, name: str) -> None:
        self._gzip = name != "deflate"
        self._inflate = zlib.decompressobj(zlib.MAX_WBITS | 32 if self._gzip else zlib.MAX_WBITS)
        self._raw_deflate = False  # some servers send deflate without the zlib header
        self._done = False  # a last member ended and what followed was not another: ignored
        self._seen = 0
        self._made = 0

    def feed(self, chunk: bytes) -> bytes:
        if self._done or not chunk:
            return b""
        self._seen += len(chunk)
        out = self._inflated(chunk)
        while self._gzip and self._inflate.eof and self._inflate.unused_data:
            rest = self._inflate.unused_data
            if not rest.startswith(b"\x1f\x8b"):  # trailing bytes that are no gzip member: not the body
                self._done = True
                break
            self._inflate = zlib.decompressobj(zlib.MAX_WBITS | 32)  # another gzip member follows
            out += self._inflated(rest)
        return out

    def _inflated(self, data: bytes) -> bytes:
        try:
            out = self._inflate.decompress(data, self._room())
        except zlib.error as exc:
            if not self._gzip and not self._raw_deflate and self._made == 0:  # deflate without its zlib header
                self._raw_deflate = True
                self._inflate = zlib.decompressobj(-zlib.MAX_WBITS)
                return self._inflated(data)
            raise ReplyEncodingError(f"the upstream's reply does not decode as {'gzip' if self._gzip else 'deflate'}") \
                from exc
        if self._inflate.unconsumed_tail:
            raise ReplyEncodingError("the upstream's reply inflates beyond any real answer (a decompression bomb)")
        self._made += len(out)
        return out

    def flush(self) -> bytes:
        out = self._inflate.flush()
        self._made += len(out)
        if self._seen and not self._done and not self._inflate.eof:
            raise ReplyEncodingError("the upstream's compressed reply was cut short")
        return out

    def _room(self) -> int:
        """How many more bytes may come out before the reply counts as a bomb."""
        return max(BOMB_FLOOR, BOMB_RATIO * self._seen) - self._made + 1


def decode_all(body: bytes, name: str) -> bytes:
    decoder = Decoder(name)
    return decoder.feed(body) + decoder.flush()


class DecodedResponse:
    """An upstream reply as the provider meant it: decoded body, no `content-encoding` header."""

    def __init__(self, response: UpstreamResponse) -> None:
        self._response = response
        self._coding = coding(response)
        self.status = response.status
        self.headers = [(k, v) for k, v in response.headers if k not in ("content-encoding", "content-length")]

    async def iter_raw(self) -> AsyncIterator[bytes]:
        decoder = Decoder(self._coding)
        async for chunk in self._response.iter_raw():
            out = decoder.feed(chunk)
            if out:
                yield out
        tail = decoder.flush()
        if tail:
            yield tail

    async def read(self) -> bytes:
        try:
            return b"".join([chunk async for chunk in self.iter_raw()])
        finally:
            await self._response.aclose()

    async def aclose(self) -> None:
        await self._response.aclose()


def decoded(response: UpstreamResponse) -> UpstreamResponse:
    """The reply decoded when it is encoded, else the reply itself."""
    return DecodedResponse(response) if is_encoded(response) else response
