"""proxy/records.py on its own: what is stored reads back equal, a new conversation's record
stores only what says something, and a value of another format version is absent."""

from __future__ import annotations

from proxy.records import HiddenExchange, SegmentAnchor, StoredState, TurnRecord


def test_a_bare_record_stores_only_what_says_something_and_reads_back_equal() -> None:
    record = TurnRecord("h", "seg", "conv", 0)
    raw = record.to_stored()
    assert TurnRecord.from_stored(raw) == record
    assert b"hidden_exchanges" not in raw and b"dispatched" not in raw and b"context_update" not in raw
    assert b'"position":0' in raw.replace(b" ", b""), "a required field is kept at its zero"
    assert b'"tool_block":null' in raw.replace(b" ", b""), "no block recorded is not an empty block"


def test_a_full_record_and_anchor_read_back_equal() -> None:
    exchange = HiddenExchange([{"role": "assistant", "content": None}], {"role": "assistant", "content": "x"}, [],
                              ("get_weather",), "fp", "cat")
    record = TurnRecord("h", "seg", "conv", 3, "<context_update>", StoredState("ref", "2026-12-06", "mem"), (),
                        (exchange,), {"c1": {"name": "t", "arguments": "{}"}}, "<tools_update>", 12.5, "ctx",
                        ("h0",))
    assert TurnRecord.from_stored(record.to_stored()) == record
    anchor = SegmentAnchor("seg", "conv", ({"role": "system", "content": "s"},), "2026-12-06", {"city": "Oslo"},
                           StoredState("ref"), 1.0, None)
    assert SegmentAnchor.from_stored(anchor.to_stored()) == anchor
    bare = SegmentAnchor("seg", "conv")
    assert SegmentAnchor.from_stored(bare.to_stored()) == bare


def test_another_format_version_is_absent() -> None:
    raw = TurnRecord("h", "seg", "conv", 0).to_stored()
    assert TurnRecord.from_stored(raw.replace(b'"v":1', b'"v":2')) is None
    assert TurnRecord.from_stored(b'{"chain_hash":"h","segment":"s","conversation":"c","position":0}') is None


def test_empty_strings_where_none_is_the_default_read_back_as_written() -> None:
    """An empty `<context_update>`, date or blob ref is not the absent one: leaving it out made
    it read back as None (found by the adversarial review)."""
    record = TurnRecord("h", "seg", "conv", 0, "", StoredState("", ""), (), (), {}, "", 0.0, "", ())
    assert TurnRecord.from_stored(record.to_stored()) == record
    anchor = SegmentAnchor("seg", "conv", (), "", {}, None, 0.0, "")
    assert SegmentAnchor.from_stored(anchor.to_stored()) == anchor
    raw = TurnRecord("h", "seg", "conv", 0).to_stored()
    assert b"context" not in raw.replace(b'"conversation"', b""), "a default empty field is still left out"


def test_a_stored_number_too_large_for_a_position_is_absent() -> None:
    raw = b'{"v":1,"chain_hash":"h","segment":"s","conversation":"c","position":1e400}'
    assert TurnRecord.from_stored(raw) is None


def test_a_version_that_only_compares_equal_is_another_format() -> None:
    raw = TurnRecord("h", "seg", "conv", 0).to_stored()
    assert TurnRecord.from_stored(raw.replace(b'"v":1', b'"v":true')) is None
    assert SegmentAnchor.from_stored(SegmentAnchor("s", "c").to_stored().replace(b'"v":1', b'"v":true')) is None
