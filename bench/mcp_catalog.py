"""One server of the 8-server agent catalog as a stdio MCP server (for bench/agent_clis.py).

    python bench/mcp_catalog.py SERVER [CATALOG]

SERVER is one of the catalog's servers (dataforseo, github, filesystem, slack, google_maps, time,
fetch, sequential_thinking); CATALOG defaults to ../shared/data/catalogs/agent_8servers.json.
It lists that server's real tool schemas and answers every call with one line of text. The
protocol is MCP's stdio transport (newline-delimited JSON-RPC 2.0), written out so the bench needs
no MCP library and no network.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

CATALOG = Path(__file__).resolve().parents[2] / "shared" / "data" / "catalogs" / "agent_8servers.json"


def tools(server: str, catalog: Path) -> list[dict[str, Any]]:
    data = json.loads(catalog.read_text())
    return [{"name": t["function"]["name"], "description": t["function"].get("description", ""),
             "inputSchema": t["function"].get("parameters") or {"type": "object", "properties": {}}}
            for t in data["tools"] if data["index"].get(t["function"]["name"]) == server]


def answer(request: dict[str, Any], listed: list[dict[str, Any]], server: str) -> dict[str, Any] | None:
    method, rid = request.get("method"), request.get("id")
    if rid is None:  # a notification
        return None
    if method == "initialize":
        version = (request.get("params") or {}).get("protocolVersion") or "2025-06-18"
        result: dict[str, Any] = {"protocolVersion": version, "capabilities": {"tools": {"listChanged": False}},
                                  "serverInfo": {"name": server, "version": "1.0.0"}}
    elif method == "tools/list":
        result = {"tools": listed}
    elif method == "tools/call":
        name = (request.get("params") or {}).get("name")
        result = {"content": [{"type": "text", "text": f"{name}: done, all fine."}], "isError": False}
    elif method == "ping":
        result = {}
    elif method in ("resources/list", "prompts/list", "resources/templates/list"):
        key = method.split("/")[0] if "templates" not in method else "resourceTemplates"
        result = {key: []}
    else:
        return {"jsonrpc": "2.0", "id": rid, "error": {"code": -32601, "message": f"method not found: {method}"}}
    return {"jsonrpc": "2.0", "id": rid, "result": result}


def main() -> None:
    server = sys.argv[1]
    listed = tools(server, Path(sys.argv[2]) if len(sys.argv) > 2 else CATALOG)
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            request = json.loads(line)
        except json.JSONDecodeError:
            continue
        reply = answer(request, listed, server)
        if reply is not None:
            sys.stdout.write(json.dumps(reply) + "\n")
            sys.stdout.flush()


if __name__ == "__main__":
    main()
