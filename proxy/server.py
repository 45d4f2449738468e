"""Running servers: uvicorn with graceful shutdown, and the no-config quickstart.

SIGTERM makes uvicorn stop accepting and wait up to `shutdown_grace_seconds` for in-flight
requests (streams included) before it closes what is left.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import socket
from typing import Any

import uvicorn

from proxy.app import create_app
from proxy.config import KeelConfig, ServerConfig, load_config, parse_config
from proxy.logs import configure_logging
from proxy.standin.app import create_standin_app

QUICKSTART_KEY = "keel-local"


def uvicorn_config(app: Any, host: str, port: int, server: ServerConfig, **extra: Any) -> uvicorn.Config:
    return uvicorn.Config(
        app, host=host, port=port, log_config=None, access_log=False, lifespan="on",
        timeout_graceful_shutdown=round(server.shutdown_grace_seconds), timeout_keep_alive=30, **extra,
    )


def app_from_env() -> Any:
    """Factory for multi-worker runs: each worker process loads the config itself."""
    config = load_config(os.environ["KEEL_CONFIG"])
    configure_logging(config.server.log_level)
    return create_app(config)


def quickstart_config(standin_url: str | None, store_url: str, host: str, port: int) -> KeelConfig:
    """One tenant: the real OpenAI when OPENAI_API_KEY is set, else the built-in stand-in."""
    upstream: dict[str, Any]
    if standin_url is None:
        upstream = {"base_url": "https://api.openai.com/v1", "api_key_env": "OPENAI_API_KEY"}
    else:
        upstream = {"base_url": standin_url}
    digest = hashlib.sha256(QUICKSTART_KEY.encode()).hexdigest()
    return parse_config({
        "server": {"host": host, "port": port},
        "store": {"url": store_url},
        "tenants": [{"id": "local", "auth": {"keys": [f"sha256:{digest}", "env:KEEL_API_KEY"]}, "upstream": upstream}],
    }, "quickstart")


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


async def serve_quickstart(host: str, port: int, store_url: str) -> None:
    servers = []
    standin_url = None
    if not os.environ.get("OPENAI_API_KEY"):
        standin_port = _free_port(host)
        standin_url = f"http://{host}:{standin_port}/v1"
        standin_cfg = uvicorn_config(create_standin_app(), host, standin_port, ServerConfig())
        servers.append(uvicorn.Server(standin_cfg))
    config = quickstart_config(standin_url, store_url, host, port)
    configure_logging(config.server.log_level)
    servers.append(uvicorn.Server(uvicorn_config(create_app(config), host, port, config.server)))
    where = "the built-in stand-in provider" if standin_url else "OpenAI (OPENAI_API_KEY is set)"
    print(
        f"Keel on http://{host}:{port}/v1 -> {where}; store {store_url}\n"
        f"  from openai import OpenAI\n"
        f"  client = OpenAI(base_url=\"http://{host}:{port}/v1\", api_key=\"{QUICKSTART_KEY}\")\n"
        f"  client.chat.completions.create(model=\"gpt-4o-mini\", messages=[{{\"role\": \"user\", \"content\": \"hi\"}}])",
        flush=True,
    )
    await asyncio.gather(*(s.serve() for s in servers))


def serve(config_path: str, host: str | None, port: int | None, workers: int | None) -> None:
    config = load_config(config_path)
    server = config.server
    host, port, workers = host or server.host, port if port is not None else server.port, workers or server.workers
    configure_logging(server.log_level)
    if workers > 1:
        os.environ["KEEL_CONFIG"] = os.path.abspath(config_path)
        uvicorn.run("proxy.server:app_from_env", factory=True, host=host, port=port, workers=workers,
                    log_config=None, access_log=False, timeout_graceful_shutdown=round(server.shutdown_grace_seconds))
        return
    uvicorn.Server(uvicorn_config(create_app(config), host, port, server)).run()


def serve_standin(host: str, port: int, rules: str, log_level: str = "info") -> None:
    configure_logging(log_level)
    app = create_standin_app(rules)  # type: ignore[arg-type]
    uvicorn.Server(uvicorn_config(app, host, port, ServerConfig())).run()
