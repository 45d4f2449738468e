"""Gated memory: the gate, the durable after-turn job, the memory model, the API, memory as context."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from conftest import KEY, KEY_DIGEST, ServerThread, eventually, keel_config, tenant

from proxy.config import parse_config
from proxy.memory.gate import LexicalMemoryGate
from proxy.testing import FakeMemoryGate

ADMIN = "sk-admin"
ADMIN_DIGEST = __import__("hashlib").sha256(ADMIN.encode()).hexdigest()
OFFER = {"role": "assistant", "content": "You use Neovim. Should I remember your editor for next time?"}


@pytest.mark.parametrize("text, context, expected", [
    ("Please remember that I prefer answers in Japanese", [], True),
    ("Forget where I live", [], True),
    ("Actually I moved to Osaka, update my location", [], True),
    ("yes, remember that", [OFFER], True),
    ("Recuerda que prefiero respuestas cortas", [], True),
    ("覚えておいて：私はベジタリアンです", [], True),
    ("I prefer answers in Japanese from now on", [], True),  # a standing preference: the memory model decides
    ("my name is Ali", [], True),  # a first-person statement: the memory model decides
    ("I work as a product designer at YankoDesign, can you help me draft an email?", [], False),  # a request for work
    ("thanks, that was helpful", [], False),
    ("yes", [{"role": "assistant", "content": "Shall I continue with the draft?"}], False),
    ("do you remember what I said about my editor?", [], False),
])
def test_gate_judges_the_newest_message(text: str, context: list[dict[str, Any]], expected: bool) -> None:
    """Explicit requests (also after an offer, in several languages) and statements about the user
    run the memory model; small talk, questions and requests for work do not (the inverted posture)."""
    assert (LexicalMemoryGate().judge_now(text, context, (), {}).probability >= 0.5) is expected


def test_category_only_with_valid_keys_and_update_phrasing() -> None:
    gate = LexicalMemoryGate()
    assert gate.judge_now("remember my editor is vim", [], (), {}).category is None
    assert gate.judge_now("remember my editor is vim", [], ("editor", "language"), {}).category == "editor"
    assert gate.judge_now("please remember I like tea", [], ("editor",), {}).category is None  # nothing fits: dropped
    assert gate.judge_now("actually I moved to Osaka, update my location", [], (), {"location": "Kyoto"}).updates


def test_defaults_filled_at_load() -> None:
    config = parse_config({"tenants": [{"id": "t", "auth": {"keys": [f"sha256:{KEY_DIGEST}"]},
                                        "upstream": {"base_url": "http://u"}, "memory": {"enabled": True}}]})
    memory = config.tenants[0].memory
    assert memory.gate.threshold == 0.5 and memory.gate.enabled and "explicitly asks" in memory.instructions


def memory_tenant(url: str, **memory: Any) -> dict[str, Any]:
    memory["gate"] = {"audit_rate": 0.0, **memory.get("gate", {})}  # counts below are exact: no audited skips
    data = tenant(url, memory={"enabled": True, **memory}, context={"stable": True})
    data["auth"]["admin_keys"] = [f"sha256:{ADMIN_DIGEST}"]
    return data


def memory_calls(standin: ServerThread) -> int:
    return sum(1 for r in standin.app.state.standin.requests
               if any(t["function"]["name"] == "set_memory" for t in r.get("tools", [])))


def turn_requests(standin: ServerThread) -> list[dict[str, Any]]:
    """What the stand-in got for client turns, not for memory jobs (which may run at any moment)."""
    return [r for r in standin.app.state.standin.requests if "set_memory" not in str(r.get("tools"))]


def wait_for(predicate: Callable[[], bool], timeout: float = 5.0) -> bool:
    return eventually(predicate, timeout)


def entries(keel: ServerThread, user: str, key: str = KEY) -> dict[str, str]:
    r = httpx.get(keel.url + "/v1/keel/memory", headers={"authorization": f"Bearer {key}", "x-keel-user": user})
    data: dict[str, str] = r.json()["entries"]
    return data


def test_six_turns_two_memory_model_runs(standin: ServerThread, start_keel: Callable[..., ServerThread]) -> None:
    """Open a page, find links, thanks, a stated preference, "please remember" it, a screenshot:
    the memory model runs for the preference and the request (the gate skips only what is clearly
    not about memory), and the preference is saved."""
    keel = start_keel(keel_config(memory_tenant(standin.url + "/v1")))
    client = openai.OpenAI(base_url=keel.url + "/v1", api_key=KEY, max_retries=0,
                           default_headers={"x-keel-user": "ali"})
    turns = ["open example.com", "find the links on that page", "thanks!", "I prefer dark mode screenshots",
             "please remember that I prefer dark mode screenshots", "take a screenshot of the page"]
    history: list[dict[str, Any]] = []
    for text in turns:
        history.append({"role": "user", "content": text})
        reply = client.chat.completions.create(model="m", messages=history)  # type: ignore[arg-type]
        history.append({"role": "assistant", "content": reply.choices[0].message.content})
    assert wait_for(lambda: entries(keel, "ali") != {})
    time.sleep(0.3)
    assert wait_for(lambda: memory_calls(standin) == 2)
    assert entries(keel, "ali") == {"preference": "I prefer dark mode screenshots"}
    metrics = httpx.get(keel.url + "/metrics").text
    assert 'keel_memory_gate_decisions_total{outcome="skip",tenant="acme"} 4.0' in metrics
    assert 'keel_memory_model_runs_total{result="ok",tenant="acme"} 2.0' in metrics
    cost = next(x for x in metrics.splitlines() if x.startswith("keel_judgment_cost_usd_total{"))
    assert 'judgment="memory_model"' in cost and float(cost.split()[-1]) > 0


def test_memory_change_arrives_as_context_update(standin: ServerThread,
                                                 start_keel: Callable[..., ServerThread]) -> None:
    """A saved memory reaches the model as a <context_update>; the system prompt stays byte-identical."""
    keel = start_keel(keel_config(memory_tenant(standin.url + "/v1")))
    headers = {"authorization": f"Bearer {KEY}", "x-keel-user": "bo"}
    history: list[dict[str, Any]] = [{"role": "system", "content": "Be brief."},
                                     {"role": "user", "content": "remember that my editor is helix"}]
    first = httpx.post(keel.url + "/v1/chat/completions", headers=headers, json={"model": "m", "messages": history})
    system = turn_requests(standin)[-1]["messages"][0]
    assert wait_for(lambda: entries(keel, "bo") == {"editor": "my editor is helix"})
    history += [first.json()["choices"][0]["message"], {"role": "user", "content": "what's next?"}]
    httpx.post(keel.url + "/v1/chat/completions", headers=headers, json={"model": "m", "messages": history})
    sent = turn_requests(standin)[-1]
    assert sent["messages"][0] == system
    assert "Memory entry added: editor: my editor is helix" in sent["messages"][-1]["content"]


def test_memory_off_for_a_request_keeps_memory_out(standin: ServerThread,
                                                   start_keel: Callable[..., ServerThread]) -> None:
    """X-Keel-Memory: off: the request carries none of the user's memory, even in a segment whose
    frozen front was written with it, and queues no job."""
    keel = start_keel(keel_config(memory_tenant(standin.url + "/v1")))
    headers = {"authorization": f"Bearer {KEY}", "x-keel-user": "eve"}
    assert httpx.put(keel.url + "/v1/keel/memory/city", json={"value": "Lisbon"}, headers=headers).status_code == 200
    history: list[dict[str, Any]] = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    first = httpx.post(keel.url + "/v1/chat/completions", headers=headers, json={"model": "m", "messages": history})
    assert "Lisbon" in str(turn_requests(standin)[-1]["messages"][0])
    history += [first.json()["choices"][0]["message"], {"role": "user", "content": "incognito now"}]
    httpx.post(keel.url + "/v1/chat/completions", headers={**headers, "x-keel-memory": "off"},
               json={"model": "m", "messages": history})
    assert "Lisbon" not in str(turn_requests(standin)[-1])


def test_regeneration_is_not_judged_again(standin: ServerThread, start_keel: Callable[..., ServerThread]) -> None:
    keel = start_keel(keel_config(memory_tenant(standin.url + "/v1")))
    headers = {"authorization": f"Bearer {KEY}", "x-keel-user": "cy"}
    body = {"model": "m", "messages": [{"role": "user", "content": "please remember that I live in Lyon"}]}
    for _ in range(3):
        httpx.post(keel.url + "/v1/chat/completions", headers=headers, json=body)
    assert wait_for(lambda: entries(keel, "cy") != {})
    time.sleep(0.3)
    assert memory_calls(standin) == 1


def test_gate_failure_runs_the_memory_model(standin: ServerThread, start_keel: Callable[..., ServerThread]) -> None:
    """A gate that fails (here: times out) resolves to running the memory model as usual."""
    slow_gate = FakeMemoryGate(delay=0.2, error=AssertionError("never reached in time"))
    keel = start_keel(keel_config(memory_tenant(standin.url + "/v1", gate={"timeout_ms": 1})), memory_gate=slow_gate)
    httpx.post(keel.url + "/v1/chat/completions", headers={"authorization": f"Bearer {KEY}", "x-keel-user": "di"},
               json={"model": "m", "messages": [{"role": "user", "content": "thanks"}]})
    assert wait_for(lambda: memory_calls(standin) == 1)
    assert 'keel_memory_gate_decisions_total{outcome="failed",tenant="acme"} 1.0' in httpx.get(
        keel.url + "/metrics").text


def test_api_scoping(standin: ServerThread, start_keel: Callable[..., ServerThread]) -> None:
    """Users see only their own memory; an admin may manage any user of its tenant, never another tenant."""
    other_key = "sk-other-tenant"
    other = tenant(standin.url + "/v1", id="globex", memory={"enabled": True})
    other["auth"] = {"keys": [f"sha256:{__import__('hashlib').sha256(other_key.encode()).hexdigest()}"]}
    keel = start_keel(keel_config(memory_tenant(standin.url + "/v1"), other))
    base = keel.url + "/v1/keel/memory"

    def call(method: str, path: str = "", key: str = KEY, user: str | None = "alice", **kw: Any) -> httpx.Response:
        headers = {"authorization": f"Bearer {key}", **({"x-keel-user": user} if user else {})}
        return httpx.request(method, base + path, headers=headers, **kw)

    assert call("PUT", "/editor", json={"value": "vim"}).status_code == 200
    assert call("GET").json()["entries"] == {"editor": "vim"}
    assert call("GET", user="bob").json()["entries"] == {}  # B never sees A's
    assert call("GET", "?user=alice", user="bob").status_code == 403  # naming a user needs an admin key
    assert call("GET", "?user=alice", key=ADMIN, user=None).json()["entries"] == {"editor": "vim"}
    assert call("GET", key=other_key).json()["entries"] == {}  # another tenant's alice is another person
    assert call("DELETE", "/editor", key=other_key).status_code == 404
    assert call("DELETE", "/editor", key=ADMIN, user=None, params={"user": "alice"}).status_code == 200
    assert call("GET").json()["entries"] == {}
    call("PUT", "/a", json={"value": "1"})
    assert call("DELETE").json()["deleted"] == "all" and call("GET").json()["entries"] == {}
    assert call("GET", user=None).status_code == 400
    assert call("PUT", "/x", content=b"not json").status_code == 400


def test_job_survives_a_restart(standin: ServerThread, start_keel: Callable[..., ServerThread],
                                tmp_path: Path) -> None:
    """A job claimed by a process that stopped in the middle of it is finished by the next one,
    once the stopped process's lease has run out."""
    db = tmp_path / "keel.db"
    config = keel_config(memory_tenant(standin.url + "/v1", gate={"timeout_ms": 60000}),
                         store={"url": f"sqlite:///{db}", "job_lease_seconds": 0.5})
    judging = threading.Event()

    class StuckGate:  # the first process claims the job and never gets past the gate
        async def judge(self, *args: Any) -> Any:
            judging.set()
            await asyncio.sleep(3600)

    first = start_keel(config, memory_gate=StuckGate())
    httpx.post(first.url + "/v1/chat/completions", headers={"authorization": f"Bearer {KEY}", "x-keel-user": "ed"},
               json={"model": "m", "messages": [{"role": "user", "content": "please remember that my name is Ed"}]})
    assert judging.wait(5)
    first.__exit__()
    assert memory_calls(standin) == 0
    second = start_keel(config)
    assert wait_for(lambda: entries(second, "ed") == {"name": "my name is Ed"})


async def test_window_without_user_message_makes_no_request(standin: ServerThread) -> None:
    """A job whose window holds no user message is skipped without any request."""
    from proxy.memory.book import MemoryBook
    from proxy.memory.jobs import MemoryJob, MemoryJobs
    from proxy.memory.worker import MemoryWorker
    from proxy.metrics import Metrics
    from proxy.stores.sqlite import SqliteStore
    from proxy.upstream_aiohttp import AiohttpUpstream

    config = keel_config(memory_tenant(standin.url + "/v1"))
    store = SqliteStore(":memory:")
    upstream = AiohttpUpstream(config.server)
    worker = MemoryWorker(config, MemoryBook(store), MemoryJobs(store, store.job_queue()), upstream, Metrics())
    before = len(standin.app.state.standin.requests)
    decided = await worker.decide(config.tenants[0], MemoryJob("acme", "u", "h", [
        {"role": "assistant", "content": "hello"}], 0.0))
    assert decided == ([], "empty")
    assert len(standin.app.state.standin.requests) == before
    await upstream.aclose()
    await store.close()


def test_p_yes_from_logprobs_and_from_text() -> None:
    import math

    from proxy.judge import JudgeError, p_yes

    top = [{"token": "Yes", "logprob": math.log(0.6)}, {"token": "no", "logprob": math.log(0.2)}]
    choice = {"message": {"content": "Yes"}, "logprobs": {"content": [{"token": "Yes", "logprob": math.log(0.6),
                                                                        "top_logprobs": top}]}}
    assert abs(p_yes(choice) - 0.75) < 1e-9
    assert p_yes({"message": {"content": "no."}}) == 0.0 and p_yes({"message": {"content": "yes"}}) == 1.0
    with pytest.raises(JudgeError):
        p_yes({"message": {"content": "perhaps"}})


def judge_calls(standin: ServerThread) -> int:
    return sum(1 for r in standin.app.state.standin.requests if r.get("logprobs"))


def test_llm_gate_backend(standin: ServerThread, start_keel: Callable[..., ServerThread]) -> None:
    """With the llm backend one yes/no request judges each new message; only a yes runs the memory model."""
    keel = start_keel(keel_config(memory_tenant(standin.url + "/v1", gate={"backend": "llm"})))
    headers = {"authorization": f"Bearer {KEY}", "x-keel-user": "fa"}
    history: list[dict[str, Any]] = []
    for text in ("hello!", "please remember that I live in Porto"):
        history.append({"role": "user", "content": text})
        reply = httpx.post(keel.url + "/v1/chat/completions", headers=headers, json={"model": "m", "messages": history})
        history.append(reply.json()["choices"][0]["message"])
    assert wait_for(lambda: entries(keel, "fa") != {})
    time.sleep(0.2)
    assert judge_calls(standin) == 2 and memory_calls(standin) == 1
    judged = [r for r in standin.app.state.standin.requests if r.get("logprobs")][-1]["messages"][-1]["content"]
    assert "<newest_message>\nplease remember that I live in Porto\n</newest_message>" in judged
    assert "hello!" in judged.split("<newest_message>")[0]  # earlier messages only as context
    assert 'judgment="memory_gate"' in httpx.get(keel.url + "/metrics").text  # the judgment's cost, recorded


@pytest.mark.parametrize("failure", ["error", "unparseable"])
def test_gate_errors_run_the_memory_model(standin: ServerThread, start_keel: Callable[..., ServerThread],
                                          failure: str) -> None:
    """A gate that errors or answers neither yes nor no resolves to running the memory model."""
    gate: dict[str, Any] = {"backend": "llm"} if failure == "unparseable" else {}
    broken_gate = FakeMemoryGate(error=RuntimeError("gate backend down"))
    keel = start_keel(keel_config(memory_tenant(standin.url + "/v1", gate=gate)),
                      memory_gate=broken_gate if failure == "error" else None)
    text = "thanks [[judge garbage]]" if failure == "unparseable" else "thanks"
    httpx.post(keel.url + "/v1/chat/completions", headers={"authorization": f"Bearer {KEY}", "x-keel-user": "gi"},
               json={"model": "m", "messages": [{"role": "user", "content": text}]})
    assert wait_for(lambda: memory_calls(standin) == 1)
    metrics = httpx.get(keel.url + "/metrics").text
    assert 'keel_memory_gate_decisions_total{outcome="failed",tenant="acme"} 1.0' in metrics
    assert "judgment=\"memory_gate\"" not in metrics  # a failed judgment reports no usage


@pytest.mark.parametrize("shape", ["responses", "messages"])
def test_memory_model_requests_carry_nothing_internal(standin: ServerThread, start_keel: Callable[..., ServerThread],
                                                      shape: str) -> None:
    """A memory ask on /v1/responses and /v1/messages: the memory model's request holds the
    messages as the client sent them, without Keel's own `_keel` bookkeeping on any of them."""
    keel = start_keel(keel_config(memory_tenant(standin.url + "/v1")))
    turns: list[dict[str, Any]] = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"},
                                   {"role": "user", "content": "please remember that my city is Porto"}]
    if shape == "responses":
        path, body = "/v1/responses", {"model": "m", "instructions": "Be brief.", "input": turns, "user": "ana"}
    else:
        path, body = "/v1/messages", {"model": "c", "max_tokens": 50, "system": "Be brief.", "messages": turns,
                                      "metadata": {"user_id": "ana"}}
    assert httpx.post(keel.url + path, headers={"authorization": f"Bearer {KEY}"}, json=body).status_code == 200
    assert wait_for(lambda: memory_calls(standin) == 1)
    asked = next(r for r in standin.app.state.standin.requests if "set_memory" in str(r.get("tools")))
    assert "Porto" in str(asked["messages"]) and "_keel" not in str(asked)


def keyless_tenant(url: str, **memory: Any) -> dict[str, Any]:
    return {"id": "byo", "default": True, "auth": {"passthrough": True}, "upstream": {"base_url": url},
            "memory": {"enabled": True, "gate": {"audit_rate": 0.0}, **memory}, "context": {"stable": True}}


def keyless_chat(keel: ServerThread, text: str) -> None:
    """A caller that sends no credential at all (a keyless upstream: a local model server), as `alice`."""
    httpx.post(keel.url + "/v1/chat/completions", json={
        "model": "m", "user": "alice", "messages": [{"role": "user", "content": text}]}).raise_for_status()


def test_keyless_callers_keep_no_memory(standin: ServerThread, start_keel: Callable[..., ServerThread]) -> None:
    """Callers of a passthrough tenant who send no credential prove nothing about who they are:
    nothing is kept for them, and none sees what another asked to keep under the same claimed name."""
    keel = start_keel(keel_config(keyless_tenant(standin.url + "/v1")))
    keyless_chat(keel, "please remember that my pin is PIN-4711")
    time.sleep(1.0)  # the worker wakes as the turn ends: a job would have run by now
    assert memory_calls(standin) == 0
    keyless_chat(keel, "hi, who am I?")
    assert "PIN-4711" not in str(turn_requests(standin)[-1])


def test_keyless_callers_share_memory_when_the_tenant_says_so(standin: ServerThread,
                                                             start_keel: Callable[..., ServerThread]) -> None:
    """`memory.keyless: true`: a tenant whose callers are trusted (one app before a local model)
    keeps memory for keyless callers, by the user name they claim."""
    keel = start_keel(keel_config(keyless_tenant(standin.url + "/v1", keyless=True)))
    keyless_chat(keel, "please remember that my pin is PIN-4711")
    assert wait_for(lambda: memory_calls(standin) == 1)
    time.sleep(0.3)
    keyless_chat(keel, "hi, who am I?")
    assert "PIN-4711" in str(turn_requests(standin)[-1])
