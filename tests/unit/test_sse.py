"""proxy/sse.py on its own: bytes in, whole events out, however the stream is cut into chunks."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.sse import Event, EventParser, EventTooLargeError, encode_event

ENDINGS = {"lf": b"\n", "crlf": b"\r\n", "cr": b"\r"}


def stream(eol: bytes) -> bytes:
    """Four events in one line ending: JSON data, a keep-alive comment, a named event, the end."""
    return eol.join([b'data: {"a":1}', b"", b": keep-alive", b"", b"event: x", b"data: two", b"", b"data: [DONE]",
                     b"", b""])


def parse(chunks: list[bytes], max_event_bytes: int = 1 << 20) -> tuple[list[Event], bytes]:
    parser = EventParser(max_event_bytes)
    events = [event for chunk in chunks for event in parser.feed(chunk)]
    return events, parser.rest()


@pytest.mark.parametrize("eol", ENDINGS.values(), ids=ENDINGS.keys())
def test_an_event_split_at_any_one_byte_is_the_same_event(eol: bytes) -> None:
    """Two chunks, cut at every position: the same four events, whatever the line ending."""
    whole = stream(eol)
    for cut in range(1, len(whole)):
        events, rest = parse([whole[:cut], whole[cut:]])
        assert [e.data for e in events] == [b'{"a":1}', None, b"two", b"[DONE]"], cut
        assert events[0].json() == {"a": 1} and events[-1].done and rest == b""


@pytest.mark.parametrize("eol", ENDINGS.values(), ids=ENDINGS.keys())
def test_a_stream_arriving_one_byte_at_a_time_yields_every_event(eol: bytes) -> None:
    """A boundary spread over chunks shorter than itself (CRLF CRLF as four one-byte chunks) still
    ends the event: the parser once looked only at the last pending chunk and held the event back."""
    whole = stream(eol)
    events, rest = parse([whole[i:i + 1] for i in range(len(whole))])
    assert [e.data for e in events] == [b'{"a":1}', None, b"two", b"[DONE]"] and rest == b""


@given(st.sampled_from(list(ENDINGS.values())), st.lists(st.integers(1, 200), max_size=30))
def test_raw_events_are_the_stream_byte_for_byte(eol: bytes, cuts: list[int]) -> None:
    """Any chunking: the events' raw bytes, then what is pending, are exactly the bytes fed."""
    whole = stream(eol) + b"data: unfinished"
    points = sorted({c % len(whole) for c in cuts} | {0, len(whole)})
    events, rest = parse([whole[a:b] for a, b in itertools.pairwise(points)])
    assert b"".join(e.raw for e in events) + rest == whole
    assert [e.data for e in events] == [b'{"a":1}', None, b"two", b"[DONE]"] and rest == b"data: unfinished"


def test_multi_line_data_is_joined_with_newlines_and_other_fields_are_not_data() -> None:
    events, _ = parse([b"id: 7\nevent: delta\nretry: 10\ndata: first\ndata:second\ndata:  third\n: note\n\n"])
    assert events[0].data == b"first\nsecond\n third", "one space after the colon goes, a second stays"
    assert events[0].json() is None, "not JSON: no payload, no error"


def test_a_comment_only_event_has_no_data_and_no_payload() -> None:
    events, _ = parse([b": ping\n\n", b"data:\n\n"])
    assert events[0].data is None and events[0].json() is None and not events[0].done
    assert events[1].data == b"" and events[1].json() is None


def test_what_never_ended_is_the_rest() -> None:
    events, rest = parse([b'data: {"a":1}\n\ndata: {"cut', b" short"])
    assert len(events) == 1 and rest == b'data: {"cut short'


def test_an_event_that_never_ends_is_an_error_not_memory() -> None:
    parser = EventParser(max_event_bytes=100)
    with pytest.raises(EventTooLargeError):
        for _ in range(20):
            list(parser.feed(b"data: " + b"x" * 10))


def test_an_event_within_the_limit_passes() -> None:
    events, _ = parse([b"data: " + b"x" * 80, b"\n\n"], max_event_bytes=100)
    assert events[0].data == b"x" * 80


def test_encode_event_reads_back() -> None:
    raw = encode_event({"error": {"message": "é"}})
    events, _ = parse([raw])
    assert events[0].raw == raw and events[0].json() == {"error": {"message": "é"}}
