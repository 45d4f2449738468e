"""Claude Code and Codex CLI, replayed: what the CLIs sent (tests/data/agent_clis.json.gz, recorded by
`bench/agent_clis.py --record`) goes through Keel with the quickstart's features, on real uvicorn
servers in front of the stand-in, without the CLIs installed.

Each recorded session (Claude Code; Codex on its default model and on gpt-5.5; a 4-turn session and
an 8-turn one with 8 MCP servers attached) holds what the CLI sent to Keel: its history holds Keel's
answers, so a replay through a fresh Keel (its clock pinned to the recording's: the date Keel would
announce is part of the prompt) meets the conversation as it did live. The same requests sent
straight to a stand-in give the direct figures. Issue 21, item 5: the provider answers every
request, nothing internal goes upstream (the memory model's requests included), the session costs
no more input tokens than direct, every tool the client sent reaches the provider, and no request
carries more cache breakpoints than the provider allows. (The recording also keeps what each CLI
sent straight to the stand-in, for comparison by hand.)
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import recordings
from conftest import KEY, KEY_DIGEST, ServerThread

from proxy.app import create_app
from proxy.config import parse_config
from proxy.context.planner import ContextPlanner
from proxy.pipeline import Planner
from proxy.server import QUICKSTART_FEATURES
from proxy.standin.app import StandIn, create_standin_app

RECORDING = Path(__file__).parent / "data" / "agent_clis.json.gz"
SESSIONS = ["claude/short", "claude/long", "codex/short", "codex/long", "codex-gpt-5.5/short", "codex-gpt-5.5/long"]
BREAKPOINTS = 4  # Anthropic's limit on cache_control blocks per request

@dataclass
class Replay:
    statuses: list[int]
    sent: list[dict[str, Any]]  # the client's bodies
    upstream: list[dict[str, Any]]  # what the provider got for the client's requests
    upstream_ids: list[str]  # the x-request-id each came with: the client request it served
    own: list[dict[str, Any]]  # Keel's own calls (the memory model), on a provider of their own
    input_tokens: int


@pytest.fixture(scope="module")
def recording() -> dict[str, Any]:
    data: dict[str, Any] = recordings.load(RECORDING)
    return data


def replay(session: dict[str, Any], through_keel: bool, tmp: Path) -> Replay:
    """The bodies the CLI sent to Keel, through Keel or (like for like) straight to the provider."""
    standin, aux = StandIn(), StandIn()
    requests = session["keel"]
    statuses: list[int] = []
    with ServerThread(create_standin_app(standin=standin)) as provider, \
            ServerThread(create_standin_app(standin=aux)) as memory_model:
        url = provider.url
        keel: ServerThread | None = None
        if through_keel:
            features: dict[str, Any] = {**QUICKSTART_FEATURES}
            features["memory"] = {**features["memory"], "endpoint": memory_model.url + "/v1"}
            config = parse_config({"store": {"url": f"sqlite:///{tmp / 'keel.db'}"}, "tenants": [{
                "id": "replay", "auth": {"keys": [f"sha256:{KEY_DIGEST}"]},
                "upstream": {"base_url": provider.url + "/v1", "kind": session["kind"]}, **features}]})
            clock = float(session["clock"])

            def pinned(defaults: list[Planner]) -> list[Planner]:
                for planner in defaults:
                    if isinstance(planner, ContextPlanner):
                        planner.clock = lambda: clock
                return defaults

            keel = ServerThread(create_app(config, planners=pinned), server_config=config.server).__enter__()
            url = keel.url
        try:
            with httpx.Client(timeout=60) as http:
                for n, entry in enumerate(requests):
                    headers = {**entry["headers"], "authorization": f"Bearer {KEY}", "x-api-key": KEY,
                               "x-request-id": f"replay-{n}"}
                    with http.stream("POST", url + entry["path"], headers=headers,
                                     content=json.dumps(entry["body"], ensure_ascii=False).encode()) as response:
                        response.read()
                        statuses.append(response.status_code)
        finally:
            if keel is not None:
                keel.__exit__()
    shape = "messages" if session["kind"] == "anthropic-compatible" else "responses"
    ids = [h.get("x-request-id", "") for h in standin.headers]
    return Replay(statuses, [e["body"] for e in requests], list(standin.requests), ids, list(aux.requests),
                  sum(s.prompt_tokens for s in standin.served if s.shape == shape))


@pytest.fixture(scope="module")
def replays(recording: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Replay]]:
    """Each session replayed once, direct and through Keel, when a test first asks for it."""
    done: dict[str, Replay] = {}

    class Lazy(dict[str, Replay]):
        def __missing__(self, key: str) -> Replay:
            name, _, path = key.rpartition(":")
            done[key] = replay(recording["sessions"][name], path == "keel", tmp_path_factory.mktemp("replay"))
            return done[key]

    yield Lazy()


def tools(body: dict[str, Any]) -> list[tuple[str, Any]]:
    """The tools of a body, each with its name (`<type>` for an unnamed one: a hosted or client
    tool_search), and those of any `additional_tools` input item (Codex's newer models)."""
    found = list(body.get("tools") or [])
    for item in body.get("input") or [] if isinstance(body.get("input"), list) else []:
        if isinstance(item, dict) and item.get("type") == "additional_tools":
            found += item.get("tools") or []
    return [(str(t.get("name") or (t.get("function") or {}).get("name") or f"<{t.get('type')}>"), t)
            for t in found if isinstance(t, dict)]


def unmarked(tool: Any) -> Any:
    return {k: v for k, v in tool.items() if k != "cache_control"} if isinstance(tool, dict) else tool


def marks(value: Any) -> int:
    if isinstance(value, dict):
        return ("cache_control" in value) + sum(marks(v) for v in value.values())
    if isinstance(value, list):
        return sum(marks(v) for v in value)
    return 0


def has_key(value: Any, key: str) -> bool:
    if isinstance(value, dict):
        return key in value or any(has_key(v, key) for v in value.values())
    if isinstance(value, list):
        return any(has_key(v, key) for v in value)
    return False


def test_recording_is_small_and_complete(recording: dict[str, Any]) -> None:
    assert RECORDING.stat().st_size < 300_000
    assert sorted(recording["sessions"]) == sorted(SESSIONS)
    for name in SESSIONS:
        session = recording["sessions"][name]
        assert session["direct"] and session["keel"], name
        assert {e["path"].split("?")[0] for e in session["direct"] + session["keel"]} <= {"/v1/messages", "/v1/responses"}
        assert not any(k in ("authorization", "x-api-key") for e in session["keel"] for k in e["headers"])


@pytest.mark.parametrize("name", SESSIONS)
def test_every_request_answered(name: str, replays: dict[str, Replay]) -> None:
    through = replays[f"{name}:keel"]
    assert through.statuses == [200] * len(through.sent)
    assert len(through.upstream) >= len(through.sent)


@pytest.mark.parametrize("name", SESSIONS)
def test_nothing_internal_upstream(name: str, replays: dict[str, Replay]) -> None:
    through = replays[f"{name}:keel"]
    for body in through.upstream + through.own:
        assert not has_key(body, "_keel")


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


def memory_delivered(bodies: list[dict[str, Any]]) -> int:
    """Tokens of the context updates that tell the model of memory entries (a user asked Keel to
    remember something): what Keel's memory adds on purpose, in each request that carries them."""
    from proxy.tokens import TokenCounter

    counter = TokenCounter()
    blocks = [b for body in bodies for text in _strings(body)
              for b in re.findall(r"<context_update>.*?</context_update>", text, re.DOTALL)]
    return sum(counter.count(b) + 4 for b in blocks if "Memory entry" in b)


@pytest.mark.parametrize("name", SESSIONS)
def test_input_tokens_not_above_direct(name: str, replays: dict[str, Replay]) -> None:
    """The CLI's requests cost no more input through Keel than the same requests sent direct, but
    for the memory entries a user asked Keel to keep (Claude Code's "remember I prefer…")."""
    direct, through = replays[f"{name}:direct"], replays[f"{name}:keel"]
    assert direct.statuses == [200] * len(direct.sent)
    assert through.input_tokens <= direct.input_tokens + memory_delivered(through.upstream)


@pytest.mark.parametrize("name", SESSIONS)
def test_client_tools_reach_the_provider(name: str, replays: dict[str, Replay]) -> None:
    """Neither CLI puts MCP tools in `tools` (they search their own, or call them from code): every
    tool a CLI sends goes upstream as sent (a cache mark aside), in the request that answers it."""
    through = replays[f"{name}:keel"]
    for n, body in enumerate(through.sent):
        forwarded = through.upstream[through.upstream_ids.index(f"replay-{n}")]
        shipped = {name_: unmarked(tool) for name_, tool in tools(forwarded)}
        for name_, tool in tools(body):
            assert shipped.get(name_) == unmarked(tool), f"request {n}: {name_} did not reach the provider as sent"


@pytest.mark.parametrize("name", SESSIONS)
def test_cache_breakpoints_within_the_limit(name: str, replays: dict[str, Replay]) -> None:
    through = replays[f"{name}:keel"]
    for body in through.upstream:
        assert marks(body) <= BREAKPOINTS

