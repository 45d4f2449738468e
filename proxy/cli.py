"""The `keel` command: serve, check-config, report, purge-cache, demo, standin, fetch-model (and --version)."""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import sys
from importlib import metadata
from pathlib import Path

import httpx
import orjson
import yaml

from proxy.config import DEFAULT_MODEL_SOURCE, ConfigError, SavingsConfig, StoreConfig, load_config, masked


def version() -> str:
    """The installed package's version; from a source tree that is not installed, pyproject.toml's."""
    try:
        return metadata.version("keel-proxy")
    except metadata.PackageNotFoundError:
        pyproject = Path(__file__).resolve().parents[1] / "pyproject.toml"
        found = re.search(r'^version\s*=\s*"([^"]+)"', pyproject.read_text(), re.MULTILINE) if pyproject.is_file() else None
        return found.group(1) if found else "unknown"


def _print_progress(name: str, done: int, total: int | None) -> None:
    of = f"/{total:,} bytes ({done * 100 // total}%)" if total else " bytes"
    print(f"{name}: {done:,}{of}", file=sys.stderr, flush=True)


def listen_address(host: str | None, port: int | None) -> tuple[str | None, int | None]:
    """`keel serve`'s address: the flags, else KEEL_HOST / KEEL_PORT (the container image sets them),
    else None (the config's server.host/port, or the quickstart's 127.0.0.1:8080)."""
    host = host or os.environ.get("KEEL_HOST") or None
    if port is None and os.environ.get("KEEL_PORT"):
        value = os.environ["KEEL_PORT"]
        if not value.isdigit() or int(value) > 65535:
            raise ConfigError(f"KEEL_PORT: {value!r} is not a port number (0-65535)")
        port = int(value)
    return host, port


def port_number(value: str) -> int:
    """A TCP port for argparse: 0 (any free port) to 65535; anything else is a usage error (exit 2)."""
    if not value.isdigit() or int(value) > 65535:
        raise argparse.ArgumentTypeError(f"{value!r} is not a port number (0-65535)")
    return int(value)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="keel", description="Keel: an OpenAI-compatible proxy that cuts prompt cost")
    parser.add_argument("--version", action="version", version=f"keel {version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the proxy")
    serve.add_argument("--config", help="YAML config; without it: quickstart (stand-in, or OpenAI if OPENAI_API_KEY)")
    serve.add_argument("--host", help="address to listen on (default: $KEEL_HOST, else the config's server.host)")
    serve.add_argument("--port", type=port_number, help="port (default: $KEEL_PORT, else the config's server.port)")
    serve.add_argument("--workers", type=int)
    serve.add_argument("--store", default="sqlite:///keel.db", help="store URL for the quickstart")
    check = sub.add_parser("check-config", help="validate a config and print it, secrets masked")
    check.add_argument("file")
    standin = sub.add_parser("standin", help="run the stand-in model provider")
    standin.add_argument("--host", default="127.0.0.1")
    standin.add_argument("--port", type=port_number, default=8090)
    standin.add_argument("--rules", choices=["auto", "openai", "anthropic", "none"], default="auto",
                         help="prompt-cache rules to simulate for chat completions (responses and messages follow "
                              "their provider's; none: skip for all, for overhead benchmarks)")
    standin.add_argument("--log-level", choices=["debug", "info", "warning", "error"], default="info")
    standin.add_argument("--gzip", action="store_true", help="gzip every reply a client accepts gzip for, streams "
                                                             "included (a provider behind a CDN)")
    report = sub.add_parser("report", help="savings per tenant: tokens and dollars direct vs through Keel, by cause")
    report.add_argument("--config", help="the config whose store to read (default: the quickstart's --store)")
    report.add_argument("--store", default="sqlite:///keel.db", help="store URL without --config")
    report.add_argument("--tenant", help="tenant id (default: the config's first; 'local' for the quickstart)")
    report.add_argument("--since", default="7d", help="how far back: 24h, 7d, 30d, 90m or a date (YYYY-MM-DD)")
    report.add_argument("--json", action="store_true", help="print the figures as JSON (what /keel/api/summary says)")
    purge = sub.add_parser("purge-cache", help="forget every answer and vector Keel's response cache keeps for a tenant")
    purge.add_argument("--config", help="the config whose store to purge (default: the quickstart's --store)")
    purge.add_argument("--store", default="sqlite:///keel.db", help="store URL without --config")
    purge.add_argument("--tenant", help="tenant id (default: the config's first; 'local' for the quickstart)")
    demo = sub.add_parser("demo", help="run an agent conversation direct and through Keel, print what each cost")
    demo.add_argument("--url", default="http://127.0.0.1:8080", help="a running Keel (else the quickstart starts)")
    demo.add_argument("--key", default="keel-local", help="a Keel key that is also an admin key (the page)")
    demo.add_argument("--store", default="sqlite:///keel.db", help="the quickstart's store when the demo starts it")
    demo.add_argument("--no-wait", action="store_true", help="exit after the demo instead of serving the page")
    demo.add_argument("--yes", action="store_true", help="run even when OPENAI_API_KEY is set (it costs cents)")
    fetch = sub.add_parser("fetch-model", help="download the local ranker's model (int8 ONNX + tokenizer) once")
    fetch.add_argument("dir", nargs="?", help="model directory (default: keel/all-MiniLM-L6-v2 in the user's cache)")
    fetch.add_argument("--source", help="base URL of the model's files (default: its hub repository)")
    fetch.add_argument("--no-verify", action="store_true",
                       help="accept files whose sha256 differs from the published ones (another build at --source)")
    args = parser.parse_args(argv)

    try:
        if args.command == "check-config":
            config = load_config(args.file)
            print(yaml.safe_dump(masked(config), sort_keys=False), end="")
            return 0
        if args.command == "report":
            return asyncio.run(_report(args))
        if args.command == "purge-cache":
            return asyncio.run(_purge(args))
        if args.command == "demo":
            from proxy.demo import main as demo_main

            demo_port = int(args.url.rsplit(":", 1)[1].split("/")[0]) if args.url.count(":") == 2 else 8080
            return demo_main(args.url.rstrip("/"), args.key, demo_port, args.store, not args.no_wait, args.yes)
        if args.command == "fetch-model":
            from proxy.tools.model_fetch import ModelFetchError, default_model_dir, fetch_model

            try:
                path = fetch_model(args.dir or default_model_dir(), args.source or DEFAULT_MODEL_SOURCE,
                                   verify=not args.no_verify, progress=_print_progress)
            except ModelFetchError as exc:
                print(f"keel fetch-model: {exc}", file=sys.stderr)
                return 1
            print(f"model ready in {path}")
            return 0
        if args.command == "standin":
            from proxy.server import serve_standin

            serve_standin(args.host, args.port, args.rules, args.log_level, args.gzip)
            return 0
        from proxy.server import serve as run
        from proxy.server import serve_quickstart

        host, port = listen_address(args.host, args.port)
        if args.config:
            run(args.config, host, port, args.workers)
        else:
            asyncio.run(serve_quickstart(host or "127.0.0.1", port or 8080, args.store))
        return 0
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    except (httpx.HTTPError, OSError) as exc:
        print(f"keel {args.command}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


def _store_and_tenant(args: argparse.Namespace) -> tuple[StoreConfig, str, SavingsConfig]:
    """The store, tenant and savings settings a command on the store acts on (the config's, else
    the quickstart's store URL and tenant)."""
    from pydantic import ValidationError

    if args.config:
        config = load_config(args.config)
        where, tenants, savings = config.store, [t.id for t in config.tenants], config.savings
    else:
        try:
            where, tenants, savings = StoreConfig(url=args.store), ["local"], SavingsConfig()
        except ValidationError as err:
            raise ConfigError(f"--store: {err.errors()[0]['msg']}") from None
    tenant = args.tenant or tenants[0]
    if tenant not in tenants:
        raise ConfigError(f"no tenant {tenant!r}; the config has {', '.join(tenants)}")
    return where, tenant, savings


async def _purge(args: argparse.Namespace) -> int:
    from proxy.defaults import open_store
    from proxy.respcache.entries import Entries

    where, tenant, _ = _store_and_tenant(args)
    from proxy.stores import StoreError

    store = open_store(where)
    try:
        purged = await Entries(store, store).purge(tenant)
    except StoreError as exc:
        print(f"keel purge-cache: {exc}", file=sys.stderr)
        return 1
    finally:
        await store.close()
    print(f"purged {purged} cached answers and vectors of tenant {tenant}")
    return 0


async def _report(args: argparse.Namespace) -> int:

    from proxy.defaults import open_store
    from proxy.savings.ledger import Ledger
    from proxy.savings.report import parse_since, render_text, summary
    from proxy.stores import StoreError
    from proxy.stores.redis_url import masked_url

    where, tenant, savings = _store_and_tenant(args)
    try:
        since = parse_since(args.since)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    store = open_store(where)
    try:
        figures = await summary(Ledger(store, savings), tenant, since)
    except StoreError as exc:
        print(f"keel report: the store at {masked_url(where.url)} did not answer: {exc}", file=sys.stderr)
        return 1
    finally:
        await store.close()
    print(orjson.dumps(figures, option=orjson.OPT_INDENT_2).decode() if args.json else render_text(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
