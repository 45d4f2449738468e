"""The local model fetched once, off the request path, from a real HTTP server standing in for the hub."""

from __future__ import annotations

import hashlib
import socket
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from conftest import KEY, MODEL_DIR, ServerThread, keel_config, needs_model, tenant, tuned
from fastapi import FastAPI, Response
from fastapi.responses import FileResponse

from proxy.cli import main
from proxy.tools.model_fetch import DIGESTS, ModelFetchError, fetch_model, onnx_variant

pytest.importorskip("onnxruntime", reason="the optional 'local' extra is part of the dev install")
pytestmark = needs_model  # the hub serves the real model files


def hub_app(hits: Counter[str]) -> FastAPI:
    """The model's repository layout under /repo: onnx/<variant>.onnx and tokenizer.json at the root.
    Beside it, sources that go wrong: /html (a login page), /markup (HTML sent as a binary type),
    /tampered (a tokenizer.json one byte longer than the published one)."""
    app = FastAPI()
    files = {f"onnx/{onnx_variant()}": MODEL_DIR / "model.onnx", "tokenizer.json": MODEL_DIR / "tokenizer.json"}

    @app.get("/repo/{path:path}")
    async def serve(path: str) -> Response:
        hits[path] += 1
        if path not in files:
            return Response(status_code=404)
        return FileResponse(files[path])

    @app.get("/html/{path:path}")
    async def html(path: str) -> Response:
        return Response(b"<!doctype html><title>Sign in</title>", media_type="text/html")

    @app.get("/markup/{path:path}")
    async def markup(path: str) -> Response:
        return Response(b"  <html><body>Not found</body></html>", media_type="application/octet-stream")

    @app.get("/tampered/{path:path}")
    async def tampered(path: str) -> Response:
        if path == "tokenizer.json":
            return Response(files[path].read_bytes() + b"\n", media_type="application/json")
        return FileResponse(files[path])

    return app


@pytest.fixture
def hub() -> Iterator[tuple[str, Counter[str]]]:
    hits: Counter[str] = Counter()
    with ServerThread(hub_app(hits)) as server:
        yield server.url + "/repo", hits


def test_fetch_once(hub: tuple[str, Counter[str]], tmp_path: Path) -> None:
    """Both files arrive whole and readable by every user (root fetches, Keel runs as another user);
    a second fetch finds them and asks the hub for nothing."""
    source, hits = hub
    target = fetch_model(tmp_path / "model", source)
    assert (target / "model.onnx").read_bytes() == (MODEL_DIR / "model.onnx").read_bytes()
    assert (target / "tokenizer.json").read_bytes() == (MODEL_DIR / "tokenizer.json").read_bytes()
    for name in ("model.onnx", "tokenizer.json"):
        assert (target / name).stat().st_mode & 0o777 == 0o644
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
    from conftest import real_catalog

    source, hits = hub
    wanted = {"maps_directions", "maps_geocode", "slack_post_message", "read_file", "write_file", "create_branch",
              "get_current_time", "fetch", "list_issues", "search_code", "merge_pull_request", "convert_time"}
    tools = [t for t in real_catalog()
             if t["function"]["name"] in wanted]
    cfg = {"enabled": True, "stability": "per_turn", "defer": {"min_tools": 5}, "select": {
        "backend": "local", "model_dir": str(tmp_path / "minilm"), "model_source": source, "timeout_ms": 1500}}
    keel = start_keel(keel_config(tenant(standin.url + "/v1", tools=cfg)), planners=tuned(needs_tool_threshold=0.0))
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


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_digest_table_holds_the_published_tokenizer() -> None:
    """The expected tokenizer.json digest is the published file's (the copy in shared/data); the
    ONNX variants, of which no published copy is at hand, are the only files left unchecked."""
    assert DIGESTS["tokenizer.json"] == sha256(MODEL_DIR / "tokenizer.json")
    assert {path for path, digest in DIGESTS.items() if digest is None} == {
        "onnx/model_quint8_avx2.onnx", "onnx/model_qint8_arm64.onnx"}


def test_cli_prints_progress_to_stderr(hub: tuple[str, Counter[str]], tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    """Each file reports bytes/total on stderr, about every tenth of its size, ending at its full size."""
    source, _ = hub
    assert main(["fetch-model", str(tmp_path / "m"), "--source", source]) == 0
    captured = capsys.readouterr()
    assert "model ready" in captured.out and "bytes" not in captured.out
    for name in ("model.onnx", "tokenizer.json"):
        size = (MODEL_DIR / name).stat().st_size
        lines = [line for line in captured.err.splitlines() if line.startswith(f"{name}: ")]
        assert 1 <= len(lines) <= 11
        assert lines[-1] == f"{name}: {size:,}/{size:,} bytes (100%)"


@pytest.mark.parametrize("kind", ["html", "markup"])
def test_html_page_refused(hub: tuple[str, Counter[str]], tmp_path: Path, capsys: pytest.CaptureFixture[str],
                           kind: str) -> None:
    """A source answering with an HTML page (by content type, or a body starting with '<') is an error
    naming the URL, and leaves no file behind."""
    source, _ = hub
    base = source.removesuffix("/repo") + f"/{kind}"
    assert main(["fetch-model", str(tmp_path / "m"), "--source", base]) == 1
    err = capsys.readouterr().err
    assert f"{base}/onnx/{onnx_variant()}" in err and ("HTML" in err or "markup" in err)
    assert list((tmp_path / "m").iterdir()) == []


def test_errors_name_the_url(tmp_path: Path) -> None:
    """A refused connection says which URL it was fetching."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    source = f"http://127.0.0.1:{port}/repo"
    with pytest.raises(ModelFetchError, match=f"{source}/onnx/{onnx_variant()}: ConnectError"):
        fetch_model(tmp_path / "m", source, timeout=5)
    assert list((tmp_path / "m").iterdir()) == []


def test_digest_mismatch_fails_unless_no_verify(hub: tuple[str, Counter[str]], tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    """A custom source whose tokenizer.json is not the published one fails, keeping no tokenizer.json;
    --no-verify accepts it."""
    source, _ = hub
    base = source.removesuffix("/repo") + "/tampered"
    assert main(["fetch-model", str(tmp_path / "m"), "--source", base]) == 1
    err = capsys.readouterr().err
    assert f"{base}/tokenizer.json: sha256 " in err and str(DIGESTS["tokenizer.json"]) in err
    assert not (tmp_path / "m" / "tokenizer.json").exists()
    assert [p.name for p in (tmp_path / "m").iterdir()] == ["model.onnx"]  # whole, and its variant is unchecked
    assert main(["fetch-model", str(tmp_path / "m"), "--source", base, "--no-verify"]) == 0
    assert (tmp_path / "m" / "tokenizer.json").read_bytes() == (MODEL_DIR / "tokenizer.json").read_bytes() + b"\n"


def test_model_checked_where_a_digest_is_known(hub: tuple[str, Counter[str]], tmp_path: Path) -> None:
    """With a digest for the variant's path, model.onnx is checked too: the right one lands, another fails."""
    source, _ = hub
    variant = f"onnx/{onnx_variant()}"
    fetch_model(tmp_path / "ok", source, digests={variant: sha256(MODEL_DIR / "model.onnx")})
    assert (tmp_path / "ok" / "model.onnx").is_file()
    with pytest.raises(ModelFetchError, match=f"{source}/{variant}: sha256"):
        fetch_model(tmp_path / "bad", source, digests={variant: "0" * 64})
    assert not (tmp_path / "bad" / "model.onnx").exists()
