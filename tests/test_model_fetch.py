"""The local model fetched once, off the request path, from a real HTTP server standing in for the hub."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from conftest import KEY, SHARED, ServerThread, keel_config, tenant
from fastapi import FastAPI, Response
from fastapi.responses import FileResponse

from proxy.cli import main
from proxy.tools.model_fetch import fetch_model, onnx_variant

pytest.importorskip("onnxruntime", reason="the optional 'local' extra is part of the dev install")
MODEL_DIR = SHARED / "data" / "models" / "all-MiniLM-L6-v2-int8"


def hub_app(hits: Counter[str]) -> FastAPI:
    """The model's repository layout: onnx/<variant>.onnx and tokenizer.json at the root."""
    app = FastAPI()
    files = {f"onnx/{onnx_variant()}": MODEL_DIR / "model.onnx", "tokenizer.json": MODEL_DIR / "tokenizer.json"}

    @app.get("/repo/{path:path}")
    async def serve(path: str) -> Response:
        hits[path] += 1
        if path not in files:
            return Response(status_code=404)
        return FileResponse(files[path])

    return app


@pytest.fixture
def hub() -> Iterator[tuple[str, Counter[str]]]:
    hits: Counter[str] = Counter()
    with ServerThread(hub_app(hits)) as server:
        yield server.url + "/repo", hits


def test_fetch_once(hub: tuple[str, Counter[str]], tmp_path: Path) -> None:
    """Both files arrive whole; a second fetch finds them and asks the hub for nothing."""
    source, hits = hub
    target = fetch_model(tmp_path / "model", source)
    assert (target / "model.onnx").read_bytes() == (MODEL_DIR / "model.onnx").read_bytes()
    assert (target / "tokenizer.json").read_bytes() == (MODEL_DIR / "tokenizer.json").read_bytes()
    asked = sum(hits.values())
    fetch_model(tmp_path / "model", source)
    assert sum(hits.values()) == asked == 2


def test_cli_fetch_and_failure(hub: tuple[str, Counter[str]], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`keel fetch-model DIR --source URL` fetches; a source without the files fails cleanly, leaving nothing."""
    source, _ = hub
    assert main(["fetch-model", str(tmp_path / "ok"), "--source", source]) == 0
    assert (tmp_path / "ok" / "model.onnx").stat().st_size == (MODEL_DIR / "model.onnx").stat().st_size
    assert main(["fetch-model", str(tmp_path / "bad"), "--source", source + "/missing"]) == 1
    assert "404" in capsys.readouterr().err
    assert list((tmp_path / "bad").iterdir()) == []  # no half-written file left behind


def test_local_backend_fetches_in_background(hub: tuple[str, Counter[str]], tmp_path: Path, standin: ServerThread,
                                             start_keel: Callable[..., ServerThread]) -> None:
    """A local backend whose directory is empty answers at once (BM25 meanwhile), fetches the model
    in the background, then ranks a paraphrase by meaning."""
    import orjson
    from conftest import CATALOGS

    source, hits = hub
    wanted = {"maps_directions", "maps_geocode", "slack_post_message", "read_file", "write_file", "create_branch",
              "get_current_time", "fetch", "list_issues", "search_code", "merge_pull_request", "convert_time"}
    tools = [t for t in orjson.loads((CATALOGS / "agent_8servers.json").read_bytes())["tools"]
             if t["function"]["name"] in wanted]
    cfg = {"enabled": True, "defer": {"min_tools": 5}, "select": {
        "backend": "local", "model_dir": str(tmp_path / "minilm"), "model_source": source, "timeout_ms": 2000,
        "needs_tool_threshold": 0.0}}
    keel = start_keel(keel_config(tenant(standin.url + "/v1", tools=cfg)))
    body = {"model": "m", "tools": tools,  # no word shared with the tool: BM25 cannot find it
            "messages": [{"role": "user", "content": "tell the team in chat that we shipped"}]}
    headers = {"authorization": f"Bearer {KEY}"}
    first = httpx.post(keel.url + "/v1/chat/completions", json=body, headers=headers, timeout=30)
    assert first.status_code == 200
    assert "slack_post_message" not in [t["function"]["name"] for t in standin.app.state.standin.requests[-1]["tools"]]
    deadline = time.monotonic() + 60
    names: list[str] = []
    while time.monotonic() < deadline:
        httpx.post(keel.url + "/v1/chat/completions", json=body, headers=headers, timeout=30)
        names = [t["function"]["name"] for t in standin.app.state.standin.requests[-1]["tools"]]
        if "slack_post_message" in names:
            break
        time.sleep(0.2)
    assert "slack_post_message" in names
    assert (tmp_path / "minilm" / "model.onnx").is_file()
    assert hits == Counter({f"onnx/{onnx_variant()}": 1, "tokenizer.json": 1})  # once, whatever the traffic
