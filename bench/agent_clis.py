"""Claude Code and Codex CLI through Keel: a 4-turn session with a tool call, direct vs through Keel.

    .venv/bin/python bench/agent_clis.py --clis DIR [--cli claude|codex|both]

The CLIs are ~800 MB of npm packages, so they are not a dependency: install them once anywhere
(`npm install @anthropic-ai/claude-code@2.1.332 @openai/codex@0.171.0` in DIR) and point
`--clis` at DIR. Each CLI runs non-interactively (`claude -p … --resume`, `codex exec …
resume`) against the stand-in provider (`/v1/messages` and `/v1/responses`), once directly and
once through Keel with every feature on; the turns script a tool call the CLI executes itself.
Printed per run: whether every turn completed, the tool call, the tool tokens and the cached
fraction of the prompt over the session (the stand-in simulates each provider's prefix cache).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
os.environ.setdefault("TIKTOKEN_CACHE_DIR", str(ROOT.parent / "shared" / "data" / "tiktoken"))

from conftest import KEY_DIGEST, ServerThread  # noqa: E402

from proxy.app import create_app  # noqa: E402
from proxy.config import parse_config  # noqa: E402
from proxy.standin.app import StandIn, create_standin_app  # noqa: E402

KEY = "sk-keel-test"
FEATURES: dict[str, Any] = {"tools": {"enabled": True, "stability": "segment"}, "context": {"stable": True},
                            "cache": {"breakpoints": "auto", "prompt_cache_key": "auto"}}
TURNS = {
    "claude": ["hello, what can you do here?", 'read a.py [[call Read {"file_path": "WORK/a.py"}]]',
               "thanks, that helps", "anything else I should know?"],
    "codex": ["hello, what can you do here?", 'list the files [[call exec_command {"cmd": "ls"}]]',
              "thanks, that helps", "anything else I should know?"],
}


def keel(standin: ServerThread, kind: str) -> Any:
    config = parse_config({"store": {"url": "sqlite:///:memory:"}, "tenants": [{
        "id": "bench", "auth": {"keys": [f"sha256:{KEY_DIGEST}"]},
        "upstream": {"base_url": standin.url + "/v1", "kind": kind}, **FEATURES}]})
    return ServerThread(create_app(config), server_config=config.server)


def run_claude(clis: Path, url: str, work: Path, home: Path) -> list[bool]:
    env = {**os.environ, "HOME": str(home), "ANTHROPIC_BASE_URL": url, "ANTHROPIC_API_KEY": KEY,
           "DISABLE_TELEMETRY": "1", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1"}
    done, session = [], None
    for text in TURNS["claude"]:
        args = [str(clis / "node_modules/.bin/claude"), "-p", text.replace("WORK", str(work)),
                "--output-format", "json", "--allowedTools", "Read"]
        if session:
            args += ["--resume", session]
        result = subprocess.run(args, cwd=work, env=env, capture_output=True, text=True, timeout=120)
        import json

        try:
            out = json.loads(result.stdout)
            session = out.get("session_id", session)
            done.append(result.returncode == 0 and not out.get("is_error"))
        except json.JSONDecodeError:
            done.append(False)
    return done


def run_codex(clis: Path, url: str, work: Path, home: Path) -> list[bool]:
    (home / ".codex").mkdir(parents=True, exist_ok=True)
    (home / ".codex" / "config.toml").write_text(
        'model = "gpt-5-codex"\nmodel_provider = "keel"\n[model_providers.keel]\nname = "keel"\n'
        f'base_url = "{url}/v1"\nwire_api = "responses"\nenv_key = "KEEL_KEY"\n')
    env = {**os.environ, "HOME": str(home), "KEEL_KEY": KEY}
    done = []
    for n, text in enumerate(TURNS["codex"]):
        args = [str(clis / "node_modules/.bin/codex"), "exec", "--skip-git-repo-check"]
        args += ["resume", "--last", text] if n else [text]
        result = subprocess.run(args, cwd=work, env=env, capture_output=True, text=True, timeout=120)
        done.append(result.returncode == 0)
    return done


def session(cli: str, clis: Path, through_keel: bool) -> dict[str, Any]:
    standin_app = create_standin_app(standin=StandIn())
    with ServerThread(standin_app) as standin, tempfile.TemporaryDirectory() as tmp:
        work, home = Path(tmp) / "work", Path(tmp) / "home"
        work.mkdir()
        home.mkdir()
        (work / "a.py").write_text("print('hello')\n")
        proxy = keel(standin, "anthropic-compatible" if cli == "claude" else "openai") if through_keel else None
        if proxy is not None:
            proxy.__enter__()
        try:
            url = proxy.url if proxy is not None else standin.url
            runner = run_claude if cli == "claude" else run_codex
            done = runner(clis, url, work, home)
        finally:
            if proxy is not None:
                proxy.__exit__()
        served = list(standin_app.state.standin.served)
        bodies = list(standin_app.state.standin.requests)
    calls = [c for b in bodies for c in _calls(b)]
    prompt = sum(s.prompt_tokens for s in served)
    return {"turns": f"{sum(done)}/{len(done)}", "requests": len(served),
            "tool tokens / request": round(sum(s.tool_tokens for s in served) / max(1, len(served))),
            "prompt tokens": prompt, "cached": round(sum(s.cached_tokens for s in served) / max(1, prompt), 3),
            "tool called": "Read" in calls or "exec_command" in calls}


def _calls(body: dict[str, Any]) -> list[str]:
    names = []
    for m in body.get("messages") or []:
        for b in m.get("content") or [] if isinstance(m.get("content"), list) else []:
            if isinstance(b, dict) and b.get("type") == "tool_use":
                names.append(b.get("name"))
    for item in body.get("input") or [] if isinstance(body.get("input"), list) else []:
        if isinstance(item, dict) and item.get("type") == "function_call":
            names.append(item.get("name"))
    return names


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--clis", type=Path, required=True, help="the directory the CLIs were npm-installed in")
    parser.add_argument("--cli", choices=["claude", "codex", "both"], default="both")
    args = parser.parse_args()
    for cli in (["claude", "codex"] if args.cli == "both" else [args.cli]):
        for through in (False, True):
            row = session(cli, args.clis, through)
            print(f"{cli:6} {'keel  ' if through else 'direct'} " + "  ".join(f"{k}: {v}" for k, v in row.items()),
                  flush=True)


if __name__ == "__main__":
    main()
