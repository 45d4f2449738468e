"""proxy/hidden.py on its own: a stored hidden exchange goes back exactly where it was, before the
answer it led to, and only for that answer and that tool catalog."""

from __future__ import annotations

from typing import Any

from proxy.conversations import TurnRecord
from proxy.hidden import HiddenExchange, fingerprint, found_tools, splice

SEARCH = [{"role": "assistant", "content": None, "tool_calls": [{"id": "s1", "type": "function", "function": {
    "name": "tool_search", "arguments": '{"query": "weather"}'}}]},
          {"role": "tool", "tool_call_id": "s1", "content": "get_weather: the weather"}]


def exchange(answer: dict[str, Any], catalog: str = "cat", **fields: Any) -> HiddenExchange:
    return HiddenExchange(**{"before": SEARCH, "visible": None, "after": [], "answer": fingerprint(answer),
                             "catalog": catalog, **fields})


def record(position: int, *exchanges: HiddenExchange) -> TurnRecord:
    return TurnRecord("h", "seg", "conv", position, hidden_exchanges=exchanges)


ANSWER = {"role": "assistant", "content": "sunny"}
MESSAGES = [{"role": "user", "content": "weather?"}, ANSWER, {"role": "user", "content": "thanks"}]


def test_an_exchange_goes_back_before_the_answer_it_led_to() -> None:
    out = splice(MESSAGES, [record(0, exchange(ANSWER))], "cat")
    assert out == [MESSAGES[0], *SEARCH, ANSWER, MESSAGES[2]]
    assert MESSAGES == [{"role": "user", "content": "weather?"}, ANSWER, {"role": "user", "content": "thanks"}], \
        "the client's list is not changed in place"


def test_only_an_exchange_from_this_requests_catalog_returns() -> None:
    """Another catalog's search results name tools this request does not hold (and, across callers
    sharing a prefix, another's private tools): they never come back."""
    assert splice(MESSAGES, [record(0, exchange(ANSWER, catalog="theirs"))], "cat") == MESSAGES
    assert splice(MESSAGES, [record(0, exchange(ANSWER, catalog="theirs"), exchange(ANSWER))], "cat") == \
        [MESSAGES[0], *SEARCH, ANSWER, MESSAGES[2]], "the one of this catalog, among others"
    assert splice(MESSAGES, [record(0, exchange(ANSWER, catalog=""))], "cat") == MESSAGES, \
        "an exchange that names no catalog returns to no request that has one"


def test_a_regenerated_answer_does_not_inherit_another_answers_exchange() -> None:
    other = {"role": "assistant", "content": "a regenerated answer"}
    assert splice([MESSAGES[0], other], [record(0, exchange(ANSWER))], "cat") == [MESSAGES[0], other]


def test_an_answer_being_generated_gets_nothing_yet() -> None:
    assert splice(MESSAGES[:1], [record(0, exchange(ANSWER))], "cat") == MESSAGES[:1]
    assert splice([MESSAGES[0], MESSAGES[2]], [record(0, exchange(ANSWER))], "cat") == [MESSAGES[0], MESSAGES[2]], \
        "a user message follows: no answer to put it before"


def test_the_providers_own_answer_and_results_after_it_are_restored() -> None:
    """Keel trimmed the provider's answer (a call it answered itself) and answered a call in it: the
    provider's version goes back, then the results Keel gave."""
    providers = {"role": "assistant", "content": "sunny", "tool_calls": [{"id": "c2"}]}
    after = [{"role": "tool", "tool_call_id": "c2", "content": "done"}]
    out = splice(MESSAGES, [record(0, exchange(ANSWER, visible=providers, after=after))], "cat")
    assert out == [MESSAGES[0], *SEARCH, providers, *after, MESSAGES[2]]


def test_exchanges_of_several_turns_each_go_to_their_place() -> None:
    second = {"role": "assistant", "content": "rainy"}
    messages = [*MESSAGES, second]
    out = splice(messages, [record(0, exchange(ANSWER)), record(2, exchange(second))], "cat")
    assert out == [MESSAGES[0], *SEARCH, ANSWER, MESSAGES[2], *SEARCH, second]


def test_a_record_past_the_end_or_without_exchanges_is_skipped() -> None:
    assert splice(MESSAGES, [record(7, exchange(ANSWER)), record(0)], "cat") == MESSAGES


def test_a_fingerprint_is_text_and_call_ids() -> None:
    assert fingerprint(ANSWER) == fingerprint({**ANSWER, "refusal": None, "annotations": []})
    assert fingerprint(ANSWER) != fingerprint({**ANSWER, "content": "cloudy"})
    assert fingerprint({"role": "assistant", "tool_calls": [{"id": "a"}]}) != \
        fingerprint({"role": "assistant", "tool_calls": [{"id": "b"}]})


def test_found_tools_in_the_order_found_once_each() -> None:
    records = [record(0, exchange(ANSWER, found=["b", "a"])), record(2, exchange(ANSWER, found=["a", "c"]))]
    assert found_tools(records) == ["b", "a", "c"]


def test_an_exchange_reads_back() -> None:
    stored = exchange(ANSWER, found=("get_weather",))
    assert HiddenExchange.from_stored(stored.to_stored()) == stored
