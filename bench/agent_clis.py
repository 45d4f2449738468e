"""Claude Code and Codex CLI through Keel: two sessions each, direct vs through Keel, every feature on.

    .venv/bin/python bench/agent_clis.py --clis DIR [--cli claude|codex|codex-gpt-5.5 ...]
                                        [--session short|long ...] [--stability S] [--record FILE.json.gz]

The CLIs are ~800 MB of npm packages, so they are not a dependency: install them once anywhere
(`npm install --prefix DIR @anthropic-ai/claude-code @openai/codex`) and point `--clis` at DIR.
Each CLI runs non-interactively (`claude -p … --resume`, `codex exec … resume --last`) against the
stand-in provider (`/v1/messages` under Anthropic's cache rules, `/v1/responses` under OpenAI's),
once directly and once through Keel with the quickstart's features (proxy/server.py
QUICKSTART_FEATURES: lean tools, the frozen system prompt, cache hints, gated memory), each run
on a fresh stand-in, a fresh Keel and a fresh home directory. Sessions:

- `short`: 4 turns, the second a tool call the CLI runs itself (reads a file);
- `long`: 8 turns with the 8 MCP servers of ../shared/data/catalogs/agent_8servers.json attached
  (bench/mcp_catalog.py: 208 real tool schemas), a built-in tool turn, two MCP tool turns (Slack,
  time: Claude Code finds each through its own ToolSearch; Codex calls it from its `exec`), a
  request to remember something, and chat.

CLIs: `claude` (Claude Code on its default model), `codex` (Codex on its default model: its tools
come in an `additional_tools` input item, MCP tools reached from JavaScript in `exec`) and
`codex-gpt-5.5` (Codex on gpt-5.5: function tools and Codex's own client-run `tool_search`, which
defers every MCP tool; the stand-in does not answer Responses' tool_search calls, so that run's
MCP turns end with the model saying the tool is not available to it, as a text turn).

Printed per CLI, session and path: turns completed, the tools the model called (as the CLI's
history tells it), the requests the provider answered (refused: those the CLI got an error for), input
tokens and the cached fraction over the session, tool tokens per request (the `tools` array and any
`additional_tools` items), the client's tools that did not reach the provider in the request that
carried them, the memory model's calls (Keel's own, through the same provider, not in the input
tokens), the conversations Keel saw, and Keel's warnings. Targets (issue 21, item 5): through Keel
every turn completes with the tool calls of the direct run and every client tool sent on, input
tokens <= direct, cached fraction >= direct - 0.01. The two runs' prompts differ a little on their
own (Codex's tool outputs carry timings and ids), so "added by keel" compares like for like: each
request Keel sent upstream (a tool_search round it answered counting whole) against the CLI's own
request, counted the stand-in's way. `--stability` overrides tools.stability through
Keel (the quickstart takes the config default, auto).

`--record FILE` writes what each CLI sent (path, headers less credentials, body), direct and through
Keel, as gzipped JSON with recurring parts kept once (tests/recordings.py): tests/test_agent_clis.py
replays tests/data/agent_clis.json.gz, recorded so, through Keel without the CLIs.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
os.environ.setdefault("TIKTOKEN_CACHE_DIR", str(ROOT.parent / "shared" / "data" / "tiktoken"))

import recordings  # noqa: E402
from conftest import KEY_DIGEST, ServerThread  # noqa: E402

from proxy.app import create_app  # noqa: E402
from proxy.config import parse_config  # noqa: E402
from proxy.server import QUICKSTART_FEATURES  # noqa: E402
from proxy.standin.app import StandIn, create_standin_app  # noqa: E402
from proxy.standin.messages import MessagesShape  # noqa: E402
from proxy.standin.responses import ResponsesShape  # noqa: E402
from proxy.tokens import TokenCounter  # noqa: E402

KEY = "sk-keel-test"
MCP_SERVERS = ("dataforseo", "github", "filesystem", "slack", "google_maps", "time", "fetch", "sequential_thinking")
SECRET_HEADERS = {"authorization", "x-api-key", "host", "content-length", "connection", "accept-encoding"}
RAMBLE = " [[ramble 30]]"  # a model's answer is its own: sampled words, as proof of continuity needs

SESSIONS = {
    "short": ["hello, what can you do here?" + RAMBLE, "read a.py {read}", "thanks, that helps" + RAMBLE,
              "anything else I should know?" + RAMBLE],
    "long": ["hello, what can you do here?" + RAMBLE, "read a.py {read}", "what does that file do?" + RAMBLE,
             "post hi to the team on slack {slack}", "thanks, that helps" + RAMBLE,
             "what time is it in Tokyo? {time}", "please remember that I prefer short answers" + RAMBLE,
             "anything else I should know?" + RAMBLE],
}


@dataclass(frozen=True)
class Cli:
    name: str
    kind: str  # the upstream kind Keel is configured with
    path: str  # the API route the CLI calls
    calls: dict[str, str]  # {read}, {slack}, {time}: the stand-in's directives for the tool turns
    model: str | None = None
    allowed: tuple[str, ...] = ()


def _js(tool: str, args: str) -> str:
    return f"[[call exec text(await tools.{tool}({args}))]]"


CLIS = {
    "claude": Cli("claude", "anthropic-compatible", "/v1/messages", {
        "read": '[[call Read {"file_path": "WORK/a.py"}]]',
        "slack": '[[call ToolSearch {"query": "select:mcp__slack__slack_post_message"}]] '
                 '[[call mcp__slack__slack_post_message {"channel_id": "C1", "text": "hi"}]]',
        "time": '[[call ToolSearch {"query": "select:mcp__time__get_current_time"}]] '
                '[[call mcp__time__get_current_time {"timezone": "Asia/Tokyo"}]]'},
        allowed=("Read", "ToolSearch", "mcp__slack__slack_post_message", "mcp__time__get_current_time")),
    "codex": Cli("codex", "openai", "/v1/responses", {
        "read": _js("exec_command", '{"cmd": "cat a.py"}'),
        "slack": _js("mcp__slack__slack_post_message", '{"channel_id": "C1", "text": "hi"}'),
        "time": _js("mcp__time__get_current_time", '{"timezone": "Asia/Tokyo"}')}),
    "codex-gpt-5.5": Cli("codex", "openai", "/v1/responses", {
        "read": '[[call exec_command {"cmd": "cat a.py"}]]',
        "slack": '[[call slack_post_message {"channel_id": "C1", "text": "hi"}]]',
        "time": '[[call get_current_time {"timezone": "Asia/Tokyo"}]]'}, model="gpt-5.5"),
}

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


class Tap:
    """An ASGI wrapper that keeps what a client sent to the API routes (path, headers, body) and the
    conversation Keel answered with (`x-keel-conversation`)."""

    def __init__(self, app: Any, record: list[dict[str, Any]]) -> None:
        self.app, self.record = app, record

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or not scope["path"].startswith("/v1/"):
            await self.app(scope, receive, send)
            return
        query = scope.get("query_string", b"").decode()
        entry: dict[str, Any] = {
            "path": scope["path"] + (f"?{query}" if query else ""),
            "headers": {k.decode().lower(): v.decode() for k, v in scope["headers"]
                        if k.decode().lower() not in SECRET_HEADERS}, "body": b""}
        self.record.append(entry)

        async def tapped_receive() -> MutableMapping[str, Any]:
            message = await receive()
            if message["type"] == "http.request":
                entry["body"] += message.get("body", b"")
            return message

        async def tapped_send(message: MutableMapping[str, Any]) -> None:
            if message["type"] == "http.response.start":
                entry["status"] = message["status"]
                for k, v in message.get("headers", []):
                    if k.decode().lower() in ("x-keel-conversation", "x-request-id"):
                        entry[k.decode().lower().removeprefix("x-keel-").removeprefix("x-")] = v.decode()
            await send(message)

        await self.app(scope, tapped_receive, tapped_send)


class Warnings(logging.Handler):
    """Keel's warnings and errors during a run, by message."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.seen: dict[str, int] = {}

    def emit(self, record: logging.LogRecord) -> None:
        label = record.getMessage()
        planner = getattr(record, "planner", None) or getattr(record, "stage", None)
        label += f"({planner})" if planner else ""
        self.seen[label] = self.seen.get(label, 0) + 1


def keel_app(standin_url: str, kind: str, store: Path, stability: str | None = None) -> Any:
    features = dict(QUICKSTART_FEATURES)
    if stability:
        features["tools"] = {**features["tools"], "stability": stability}  # type: ignore[dict-item]
    config = parse_config({"store": {"url": f"sqlite:///{store}"}, "tenants": [{
        "id": "bench", "auth": {"keys": [f"sha256:{KEY_DIGEST}"]},
        "upstream": {"base_url": standin_url + "/v1", "kind": kind}, **features}]})
    return create_app(config), config


def run_claude(cli: Cli, clis: Path, url: str, work: Path, home: Path, turns: list[str], mcp: bool) -> list[bool]:
    env = {**os.environ, "HOME": str(home), "ANTHROPIC_BASE_URL": url, "ANTHROPIC_API_KEY": KEY,
           "DISABLE_TELEMETRY": "1", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_AUTOUPDATER": "1"}
    if mcp:
        servers = {name: {"command": sys.executable, "args": [str(ROOT / "bench" / "mcp_catalog.py"), name]}
                   for name in MCP_SERVERS}
        (home / "mcp.json").write_text(json.dumps({"mcpServers": servers}))
    done, session = [], None
    for text in turns:
        args = [str(clis / "node_modules/.bin/claude"), "-p", text.replace("WORK", str(work)),
                "--output-format", "json", "--allowedTools", ",".join(cli.allowed)]
        if mcp:
            args += ["--mcp-config", str(home / "mcp.json"), "--strict-mcp-config"]
        if session:
            args += ["--resume", session]
        result = subprocess.run(args, cwd=work, env=env, capture_output=True, text=True, timeout=300)
        try:
            out = json.loads(result.stdout)
            session = out.get("session_id", session)
            done.append(result.returncode == 0 and not out.get("is_error"))
        except json.JSONDecodeError:
            done.append(False)
    return done


def run_codex(cli: Cli, clis: Path, url: str, work: Path, home: Path, turns: list[str], mcp: bool) -> list[bool]:
    (home / ".codex").mkdir(parents=True, exist_ok=True)
    config = f'model = "{cli.model}"\n' if cli.model else ""
    config += ('model_provider = "keel"\n[model_providers.keel]\nname = "keel"\n'
               f'base_url = "{url}/v1"\nwire_api = "responses"\nenv_key = "KEEL_KEY"\n')
    for name in MCP_SERVERS if mcp else ():
        config += (f'[mcp_servers.{name}]\ncommand = "{sys.executable}"\n'
                   f'args = ["{ROOT / "bench" / "mcp_catalog.py"}", "{name}"]\n')
    (home / ".codex" / "config.toml").write_text(config)
    env = {**os.environ, "HOME": str(home), "KEEL_KEY": KEY}
    done = []
    for n, text in enumerate(turns):
        args = [str(clis / "node_modules/.bin/codex"), "exec", "--skip-git-repo-check"]
        args += ["resume", "--last", text] if n else [text]
        result = subprocess.run(args, cwd=work, env=env, capture_output=True, text=True, timeout=300,
                                stdin=subprocess.DEVNULL)
        done.append(result.returncode == 0 and "ERROR" not in result.stderr.split("tokens used")[0][-2000:])
    return done


@dataclass
class Run:
    done: list[bool]
    sent: list[dict[str, Any]]  # what the CLI sent (path, headers, body)
    upstream: list[dict[str, Any]]  # what the provider got, every shape
    upstream_ids: list[str]  # the x-request-id each came with (Keel's: the client request it serves)
    served: list[Any]
    warnings: dict[str, int] = field(default_factory=dict)


def session(cli: Cli, clis: Path, name: str, through_keel: bool, stability: str | None = None) -> Run:
    turns = [t.format(**cli.calls) for t in SESSIONS[name]]
    standin = StandIn()
    standin_app = create_standin_app(standin=standin)
    sent: list[dict[str, Any]] = []
    warnings = Warnings()
    # the same paths on both runs: the CLIs write them into their prompts, so their tokens compare
    tmp = Path(tempfile.gettempdir()) / "keel-agent-clis" / f"{cli.name}{cli.model or ''}-{name}"
    shutil.rmtree(tmp, ignore_errors=True)
    with ServerThread(standin_app) as provider:
        work, home = tmp / "work", tmp / "home"
        work.mkdir(parents=True)
        home.mkdir()
        (work / "a.py").write_text("print('hello')\n")
        if through_keel:
            app, config = keel_app(provider.url, cli.kind, tmp / "keel.db", stability)
            proxy = ServerThread(Tap(app, sent), server_config=config.server)
        else:
            proxy = ServerThread(Tap(standin_app, sent))
        logging.getLogger("keel").addHandler(warnings)
        try:
            with proxy:
                runner = run_claude if cli.name == "claude" else run_codex
                done = runner(cli, clis, proxy.url, work, home, turns, mcp=name == "long")
                time.sleep(1.0)  # the last turn's background work (memory, savings) settles
        finally:
            logging.getLogger("keel").removeHandler(warnings)
            shutil.rmtree(tmp, ignore_errors=True)
    for entry in sent:
        entry["body"] = json.loads(entry["body"]) if entry["body"] else None
    ids = [h.get("x-request-id", "") for h in standin.headers]
    return Run(done, sent, list(standin.requests), ids, list(standin.served), warnings.seen)


def tool_tokens(body: dict[str, Any], tokens: TokenCounter) -> int:
    """The tool block's tokens: the `tools` array and any `additional_tools` input items."""
    tools = list(body.get("tools") or [])
    for item in body.get("input") or [] if isinstance(body.get("input"), list) else []:
        if isinstance(item, dict) and item.get("type") == "additional_tools":
            tools.extend(item.get("tools") or [])
    return sum(tokens.count(json.dumps(t, separators=(",", ":"))) for t in tools)


def tool_names(body: dict[str, Any]) -> list[str]:
    """Each tool as `name`, or `type` for an unnamed one (a hosted or client tool_search, web_search)."""
    names = [t.get("name") or (t.get("function") or {}).get("name") or f"<{t.get('type')}>" for t in body.get("tools") or []]
    return [str(n) for n in names]


def called(body: dict[str, Any] | None) -> list[str]:
    """The tools the model called in a CLI's conversation, as the CLI's last request tells it."""
    names = []
    for m in (body or {}).get("messages") or []:
        for b in m.get("content") if isinstance(m.get("content"), list) else []:
            if isinstance(b, dict) and b.get("type") == "tool_use":
                names.append(str(b.get("name")))
    for item in (body or {}).get("input") or [] if isinstance((body or {}).get("input"), list) else []:
        if isinstance(item, dict) and item.get("type") in ("function_call", "custom_tool_call"):
            text = str(item.get("input") or "")
            names.append(str(item.get("name")) + (f"({text.split('tools.')[1].split('(')[0]})" if "tools." in text else ""))
    return names


def figures(cli: Cli, run: Run, tokens: TokenCounter) -> dict[str, Any]:
    shape = "messages" if cli.path == "/v1/messages" else "responses"
    mine = [s for s in run.served if s.shape == shape]
    asked = [b for b in run.upstream if ("input" if shape == "responses" else "messages") in b
             and "set_memory" not in tool_names(b)]  # the CLI's requests, not the memory model's
    memory = [s for s in run.served if s.shape == "chat"]
    total = sum(s.prompt_tokens for s in mine)
    cached = sum(s.cached_tokens for s in mine)
    bodies = [e["body"] for e in run.sent if isinstance(e.get("body"), dict)]
    reader = MessagesShape() if shape == "messages" else ResponsesShape()

    def prompt(body: dict[str, Any]) -> int:  # input tokens as the stand-in counts them
        return sum(len(tokens.encode(block.text)) for block in reader.prompt(body))

    missing: set[str] = set()  # a client tool absent from the upstream request that served it
    added = 0  # input tokens Keel's requests cost beyond the client's own, request by request
    for entry in run.sent:
        if entry.get("request-id") in run.upstream_ids and isinstance(entry.get("body"), dict):
            served = [b for b, i in zip(run.upstream, run.upstream_ids, strict=True)
                      if i == entry["request-id"] and any(b is a for a in asked)]
            missing |= set(tool_names(entry["body"])) - set(tool_names(served[0]))
            added += sum(map(prompt, served)) - prompt(entry["body"])  # rounds Keel answered itself count whole
    return {
        "turns": f"{sum(run.done)}/{len(run.done)}",
        "tools called": ",".join(called(bodies[-1] if bodies else None)) or "-",
        "requests": len(mine), "refused": len([e for e in run.sent if e.get("status", 200) != 200]),
        "input tokens": total, "added by keel": added if run.upstream_ids and any(run.upstream_ids) else "-",
        "cached": round(cached / max(1, total), 3),
        "tool tokens/req": round(sum(tool_tokens(b, tokens) for b in asked) / max(1, len(asked))),
        "client tools not sent": sorted(missing) or "-",
        "memory calls": f"{len(memory)} ({sum(s.prompt_tokens for s in memory)} tok)",
        "conversations": len({e["conversation"] for e in run.sent if e.get("conversation")}) or "-",
        "keel warnings": dict(run.warnings) or "-",
    }


def versions(clis: Path) -> dict[str, str]:
    found = {}
    for pkg in ("@anthropic-ai/claude-code", "@openai/codex"):
        meta = clis / "node_modules" / pkg / "package.json"
        if meta.is_file():
            found[pkg] = json.loads(meta.read_text())["version"]
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clis", type=Path, required=True, help="the directory the CLIs were npm-installed in")
    parser.add_argument("--cli", action="append", choices=sorted(CLIS), help="default: all three")
    parser.add_argument("--session", action="append", choices=sorted(SESSIONS), help="default: both")
    parser.add_argument("--stability", choices=("per_turn", "segment", "dispatch", "auto"),
                        help="tools.stability through Keel (default: the quickstart's)")
    parser.add_argument("--record", type=Path, help="write what the CLIs sent here (gzipped JSON)")
    args = parser.parse_args()
    tokens = TokenCounter()
    recorded: dict[str, Any] = {"versions": versions(args.clis), "sessions": {}}
    print("versions:", ", ".join(f"{k} {v}" for k, v in recorded["versions"].items()), flush=True)
    for name in args.cli or list(CLIS):
        cli = CLIS[name]
        for which in args.session or ["short", "long"]:
            rows = {}
            kept = recorded["sessions"][f"{name}/{which}"] = {"kind": cli.kind}
            for through in (False, True):
                if through:
                    kept["clock"] = time.time()  # Keel's clock when the session started (a replay pins it)
                run = session(cli, args.clis, which, through, args.stability)
                rows[through] = figures(cli, run, tokens)
                kept["keel" if through else "direct"] = [{k: e[k] for k in ("path", "headers", "body")} for e in run.sent]
                path = "keel  " if through else "direct"
                print(f"{name:14} {which:5} {path} " + "  ".join(f"{k}: {v}" for k, v in rows[through].items()),
                      flush=True)
            direct, keel = rows[False], rows[True]
            same = keel["tools called"] == direct["tools called"] and keel["client tools not sent"] == "-"
            added = keel["added by keel"] if isinstance(keel["added by keel"], int) else 0
            ok = (keel["turns"].split("/")[0] == keel["turns"].split("/")[1] and same and added <= 0
                  and keel["cached"] >= direct["cached"] - 0.01)
            print(f"{name:14} {which:5} target {'met' if ok else 'MISSED'}: input vs the direct run "
                  f"{keel['input tokens'] - direct['input tokens']:+,} tokens "
                  f"({keel['input tokens'] / max(1, direct['input tokens']) - 1:+.2%}; the CLI's own prompts vary a "
                  f"little run to run), added by Keel to the CLI's requests {added:+,}, cached "
                  f"{keel['cached'] - direct['cached']:+.3f}, tools {'as direct' if same else 'NOT as direct'}",
                  flush=True)
    if args.record:
        recordings.save(args.record, recorded)
        print(f"recorded {args.record} ({args.record.stat().st_size:,} bytes)")


if __name__ == "__main__":
    main()
