"""Invariant 4: no feature failure fails a turn. Each part that can fail (a planner, the ranker,
a judge, the store, the memory gate, the responder) fails by exception and by timeout, streamed
and not; every client turn is a 200 that means what the client's own request would have meant.

The turn used throughout: a 30-tool request whose user message makes the stand-in want
`archive_ticket`, a tool Keel defers, so that with features working the model searches for it
through Keel's `tool_search`; either way the client must end with a call of `archive_ticket`.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from conftest import KEY, ServerThread, keel_config, small_catalog, tenant
from recorder import Recorder

from proxy.standin.script import hidden_call
from proxy.stores.sqlite import SqliteStore
from proxy.testing import FailingPlanner, FakeMemoryGate, FakeRanker, FaultyStore
from proxy.turn import Turn

WANTED = "archive_ticket"
TEXT = "tidy up the support queue " + hidden_call(WANTED, '{"id": 7}')
FEATURES: dict[str, Any] = {"tools": {"enabled": True, "select": {"timeout_ms": 100}}, "context": {"stable": True},
                            "cache": {"prompt_cache_key": "auto"}}


def sdk(server: ServerThread) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0, timeout=8)


def called(keel: ServerThread, stream: bool, text: str = TEXT, user: str | None = None) -> list[str]:
    """One client turn through the SDK: the names of the tools the client is asked to call."""
    kwargs: dict[str, Any] = dict(model="m", tools=small_catalog(), messages=[
        {"role": "system", "content": "You run a help desk."}, {"role": "user", "content": text}])
    if user:
        kwargs["user"] = user
    if not stream:
        reply = sdk(keel).chat.completions.create(**kwargs)
        assert reply.choices[0].finish_reason == "tool_calls"
        return [c.function.name for c in reply.choices[0].message.tool_calls or []]  # type: ignore[union-attr]
    names: dict[int, str] = {}
    finishes = []
    for chunk in sdk(keel).chat.completions.create(stream=True, **kwargs):
        for choice in chunk.choices:
            finishes += [choice.finish_reason] if choice.finish_reason else []
            for delta in choice.delta.tool_calls or []:
                if delta.function and delta.function.name:
                    names[delta.index] = delta.function.name
    assert finishes == ["tool_calls"]
    return [names[i] for i in sorted(names)]


def failures(keel: ServerThread, stage: str) -> float:
    keel_app = keel.app.state.keel
    value = keel_app.metrics.registry.get_sample_value("keel_planner_failures_total",
                                                       {"tenant": "acme", "planner": stage})
    return value or 0.0


def deferred_upstream(standin: ServerThread) -> bool:
    """Did the upstream's first call of the turn get a deferred tool block (the tool planner ran)?"""
    bodies = list(standin.app.state.standin.requests)
    return any("tool_search" in [t["function"]["name"] for t in b.get("tools", [])] for b in bodies)


@pytest.fixture
def hung_server() -> Iterator[int]:
    """A TCP server that accepts connections and never answers (a hung Redis or model endpoint)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    stop.set()
    thread.join()
    for conn in held:
        conn.close()
    server.close()


STREAMS = pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
MODES = pytest.mark.parametrize("mode", ["raise", "hang"])


@STREAMS
@MODES
def test_failing_planner(standin: ServerThread, start_keel: Callable[..., ServerThread], stream: bool,
                         mode: str) -> None:
    """A planner that raises or overruns the stage deadline is skipped; the others still run."""
    def with_failing(defaults: list[Any]) -> Sequence[Any]:
        return [FailingPlanner(mode), *defaults]

    keel = start_keel(keel_config(tenant(standin.url + "/v1", **FEATURES)), planners=with_failing,
                      stage_deadline=0.3)
    assert called(keel, stream) == [WANTED]
    assert failures(keel, "failing") == 1
    assert deferred_upstream(standin), "the tool planner after the failing one still ran"


@STREAMS
@MODES
def test_failing_ranker(standin: ServerThread, start_keel: Callable[..., ServerThread], stream: bool,
                        mode: str) -> None:
    """A ranker that raises or overruns timeout_ms falls back to the lexical ranking, in the
    planner and in Keel's own tool_search answer alike."""
    ranker = FakeRanker(best=["close_ticket"], error=RuntimeError("backend down") if mode == "raise" else None,
                        delay=5.0 if mode == "hang" else 0.0)
    keel = start_keel(keel_config(tenant(standin.url + "/v1", **FEATURES)), ranker=ranker)
    assert called(keel, stream) == [WANTED]
    assert deferred_upstream(standin)
    fallbacks = keel.app.state.keel.metrics.registry.get_sample_value(
        "keel_judgment_failures_total", {"tenant": "acme", "judgment": "tool_ranking"})
    assert fallbacks == ranker.calls >= 2, "the planner and the search answer each fell back"


@STREAMS
@MODES
def test_failing_judge(standin: ServerThread, start_keel: Callable[..., ServerThread], hung_server: int,
                       stream: bool, mode: str) -> None:
    """The llm ranking backend on a dead (refused) or hung endpoint: the turn goes on lexically,
    including Keel's answer to the model's tool_search (once a 502 to the client)."""
    endpoint = "http://127.0.0.1:1/v1" if mode == "raise" else f"http://127.0.0.1:{hung_server}/v1"
    tools = {"enabled": True, "select": {"backend": "llm", "endpoint": endpoint, "timeout_ms": 150}}
    keel = start_keel(keel_config(tenant(standin.url + "/v1", tools=tools)))
    assert called(keel, stream) == [WANTED]
    assert deferred_upstream(standin)


@STREAMS
@MODES
def test_failing_store(standin: ServerThread, start_keel: Callable[..., ServerThread], tmp_path: Path,
                       stream: bool, mode: str) -> None:
    """A store that errors or hangs costs the turn its history, never the turn: within the
    request's store budget Keel gives up and sends the client's own request."""
    store = FaultyStore(SqliteStore(str(tmp_path / "k.db")), mode)
    keel = start_keel(keel_config(tenant(standin.url + "/v1", **FEATURES)), store=store)
    assert called(keel, stream) == [WANTED]
    assert failures(keel, "locate") == 1


@STREAMS
@pytest.mark.parametrize("where", ["dead_redis", "hung_redis", "sqlite_unwritable"])
def test_real_store_faults(standin: ServerThread, start_keel: Callable[..., ServerThread], tmp_path: Path,
                           hung_server: int, stream: bool, where: str) -> None:
    """Real stores failing for real: Redis refusing connections, Redis accepting and never
    answering (each call would wait its 5 s socket timeout), an SQLite file whose directory
    cannot be created. Three turns each: the breaker opens after the first failures."""
    blocker = tmp_path / "file"
    blocker.write_text("a file where a directory should be")
    url = {"dead_redis": "redis://127.0.0.1:1/0", "hung_redis": f"redis://127.0.0.1:{hung_server}/0",
           "sqlite_unwritable": f"sqlite:///{blocker}/sub/keel.db"}[where]
    keel = start_keel(keel_config(tenant(standin.url + "/v1", **FEATURES), store={"url": url}))
    for _ in range(3):
        assert called(keel, stream) == [WANTED]
    assert httpx.get(keel.url + "/readyz").status_code == 200
    assert httpx.get(keel.url + "/healthz", timeout=5).json()["store"] == "unavailable"


@MODES
def test_failing_memory_gate(standin: ServerThread, start_keel: Callable[..., ServerThread], mode: str) -> None:
    """A memory gate that raises or overruns its deadline: the turn is answered and the memory
    model runs as usual (a missed memory would be the worse failure)."""
    broken_gate = FakeMemoryGate(delay=30 if mode == "hang" else 0.0, error=RuntimeError("gate down"))
    memory = {"enabled": True, "gate": {"timeout_ms": 100}}
    keel = start_keel(keel_config(tenant(standin.url + "/v1", memory=memory, **FEATURES)), memory_gate=broken_gate)
    assert called(keel, False, user="ana") == [WANTED]
    metrics = keel.app.state.keel.metrics.registry
    for _ in range(100):
        if metrics.get_sample_value("keel_memory_model_runs_total", {"tenant": "acme", "result": "ok"}):
            break
        threading.Event().wait(0.05)
    assert metrics.get_sample_value("keel_memory_gate_decisions_total", {"tenant": "acme", "outcome": "failed"}) == 1
    assert metrics.get_sample_value("keel_memory_model_runs_total", {"tenant": "acme", "result": "ok"}) == 1


class ExplodingResponder:
    async def respond(self, request: Turn, exchange: Any) -> Any:
        raise RuntimeError("responder bug")


class RespondingPlanner:
    """Hands the response to a responder that raises before it answers."""

    name = "exploding"
    after: tuple[str, ...] = ()

    def applies(self, request: Turn) -> bool:
        return True

    async def plan(self, request: Turn) -> Turn:
        return request.with_body({**request.body, "x": 1}, responder=ExplodingResponder())


@STREAMS
def test_failing_responder(standin: ServerThread, start_keel: Callable[..., ServerThread], stream: bool) -> None:
    """A responder that raises leaves the turn to the client's own request, relayed as usual."""
    keel = start_keel(keel_config(tenant(standin.url + "/v1", **FEATURES)),
                      planners=lambda defaults: [RespondingPlanner()])
    assert called(keel, stream) == [WANTED]
    assert failures(keel, "responder") == 1
    assert "x" not in standin.app.state.standin.requests[-1], "the client's own body went upstream"


class Unencodable:
    name = "unencodable"
    after: tuple[str, ...] = ()

    def applies(self, request: Turn) -> bool:
        return True

    async def plan(self, request: Turn) -> Turn:
        return request.with_body({**request.body, "x": object()})


def test_body_keel_cannot_write_goes_as_sent(standin: ServerThread, start_keel: Callable[..., ServerThread]) -> None:
    """A planned body that cannot be written back as JSON: the client's bytes go upstream."""
    keel = start_keel(keel_config(tenant(standin.url + "/v1", **FEATURES)), planners=[Unencodable()])
    assert called(keel, False) == [WANTED]
    assert failures(keel, "encode") == 1


def chat_json(content: str, calls: list[dict[str, Any]] | str | None = None) -> bytes:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls is not None:
        message["tool_calls"] = calls
    import orjson

    return orjson.dumps({"id": "c", "object": "chat.completion", "choices": [
        {"index": 0, "message": message, "finish_reason": "tool_calls" if calls else "stop"}]})


class Scripted(Recorder):
    """A recorder that answers each request with the next of `replies`."""

    def __init__(self, replies: list[bytes]) -> None:
        super().__init__()
        self.replies = replies

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            self.chunks = [self.replies[min(len(self.received), len(self.replies) - 1)]]
        await super().__call__(scope, receive, send)


def test_unreadable_answer_is_relayed_as_it_came(start_keel: Callable[..., ServerThread]) -> None:
    """An upstream answer whose tool_calls Keel cannot read is the upstream's own answer: relayed
    as it came, in one upstream call."""
    odd = chat_json("", "not a list of calls")
    upstream = Scripted([odd])
    with ServerThread(upstream) as server:
        keel = start_keel(keel_config(tenant(server.url + "/v1", **FEATURES)))
        response = httpx.post(keel.url + "/v1/chat/completions", headers={"authorization": f"Bearer {KEY}"},
                              json={"model": "m", "tools": small_catalog(),
                                    "messages": [{"role": "user", "content": "hello"}]})
    assert response.status_code == 200 and response.content == odd
    assert len(upstream.received) == 1


def tools_planner_answering_with(ranker: Any, conversations: Any) -> Callable[[list[Any]], Sequence[Any]]:
    """A tool planner whose responder searches with `ranker` as given (no guard around it)."""
    from proxy.metrics import Metrics
    from proxy.rounds.responder import ToolSearchResponder
    from proxy.tokens import TokenCounter
    from proxy.tools.catalog import CatalogCache
    from proxy.tools.planner import ToolPlanner
    from proxy.tools.ranking import LexicalRanker

    metrics = Metrics()
    tools = ToolPlanner(CatalogCache(TokenCounter()), lambda tenant: LexicalRanker(), metrics,
                        lambda plan, _: ToolSearchResponder(plan, ranker, conversations, metrics))
    return lambda defaults: [tools]


@STREAMS
def test_responder_bug_falls_back(standin: ServerThread, start_keel: Callable[..., ServerThread], tmp_path: Path,
                                  stream: bool) -> None:
    """A bug inside Keel's tool_search answer: before anything reached the client, the client's own
    request is sent and relayed; once a stream has begun, it ends with one error event."""
    from proxy.conversations import Conversations

    conversations = Conversations(SqliteStore(str(tmp_path / "c.db")), 60)
    broken = FakeRanker(error=RuntimeError("bug in the search answer"))  # handed to the responder without its guard
    keel = start_keel(keel_config(tenant(standin.url + "/v1", **FEATURES)),
                      planners=tools_planner_answering_with(broken, conversations))
    if not stream:
        assert called(keel, False) == [WANTED]
        return
    with pytest.raises(openai.APIError, match="could not continue"):
        called(keel, True)


def test_unhealthy_store_is_bypassed(standin: ServerThread, start_keel: Callable[..., ServerThread],
                                     tmp_path: Path) -> None:
    """After a few failures in a row the store is not asked at all (each call would cost the
    request its budget): turns are planned afresh, without it, until a probe finds it well."""
    store = FaultyStore(SqliteStore(str(tmp_path / "k.db")), "hang")
    keel = start_keel(keel_config(tenant(standin.url + "/v1", **FEATURES)), store=store)
    for _ in range(6):
        assert called(keel, False) == [WANTED]
    turns = store.calls - store.faults["ping"]  # the health monitor's pings are its own, in the background
    assert turns == 3, "three failures open the breaker; later turns never wait on the store"
    assert failures(keel, "store_unavailable") == 4  # turn 1's locate and learning, turn 2's locate: 3 failures
