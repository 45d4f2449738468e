"""proxy/encoding.py on its own: a compressed reply read as the provider meant it, a piece at a
time, and refused when it is cut short, not a coding Keel reads, or a decompression bomb."""

from __future__ import annotations

import gzip
import zlib

import pytest

from proxy.encoding import BOMB_FLOOR, Decoder, ReplyEncodingError, accept_encoding, decode_all

TEXT = b'{"choices": [{"message": {"content": "hello"}}]}' * 20


def pieces(data: bytes, size: int) -> list[bytes]:
    return [data[i:i + size] for i in range(0, len(data), size)]


@pytest.mark.parametrize("size", [1, 7, 4096])
def test_gzip_decodes_a_piece_at_a_time(size: int) -> None:
    decoder = Decoder("gzip")
    assert b"".join(decoder.feed(p) for p in pieces(gzip.compress(TEXT), size)) + decoder.flush() == TEXT


def test_deflate_with_and_without_its_zlib_header() -> None:
    raw = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    assert decode_all(zlib.compress(TEXT), "deflate") == TEXT
    assert decode_all(raw.compress(TEXT) + raw.flush(), "deflate") == TEXT


def test_two_gzip_members_and_two_codings() -> None:
    assert decode_all(gzip.compress(b"one ") + gzip.compress(b"two"), "gzip") == b"one two"
    assert decode_all(gzip.compress(gzip.compress(TEXT)), "gzip, gzip") == TEXT
    assert decode_all(gzip.compress(TEXT) + b"\x00trailing", "gzip") == TEXT, "bytes after the last member: ignored"


@pytest.mark.parametrize("cut", [1, 10, -9, -1])
def test_a_body_cut_short_is_an_error_not_a_shorter_answer(cut: int) -> None:
    with pytest.raises(ReplyEncodingError, match=r"cut short|does not decode"):
        decode_all(gzip.compress(TEXT)[:cut], "gzip")


def test_garbage_and_unknown_codings_are_refused() -> None:
    with pytest.raises(ReplyEncodingError):
        decode_all(b"not gzip at all", "gzip")
    with pytest.raises(ReplyEncodingError, match="cannot read"):
        Decoder("br")


def test_a_decompression_bomb_is_refused() -> None:
    bomb = gzip.compress(b"\x00" * (BOMB_FLOOR * 2))
    with pytest.raises(ReplyEncodingError, match="bomb"):
        decode_all(bomb, "gzip")


def test_identity_is_no_coding() -> None:
    assert decode_all(b"plain", "identity") == b"plain"


@pytest.mark.parametrize(("sent", "asked"), [("gzip, deflate, br, zstd", "gzip, deflate"), ("br", "identity"),
                                             ("gzip;q=1.0, identity;q=0.5", "gzip;q=1.0, identity;q=0.5")])
def test_keel_asks_only_for_codings_it_reads(sent: str, asked: str) -> None:
    assert accept_encoding(sent) == asked
