"""Recorded client traffic, stored small: every JSON object, array or long string that recurs
(a CLI resends its system prompt, tools and history on every request) is kept once.

`pack(value)` -> {"table": [...], "root": ...}, where a recurring node is replaced by {"$r": index}
into the table; `unpack` restores the value exactly (key order included). `save` and `load` add gzip.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

MIN_CHARS = 64  # nodes shorter than this (as JSON) stay inline


def pack(value: Any) -> dict[str, Any]:
    table: list[Any] = []
    index: dict[str, int] = {}

    def walk(node: Any) -> Any:
        if isinstance(node, dict):
            node = {k: walk(v) for k, v in node.items()}
        elif isinstance(node, list):
            node = [walk(v) for v in node]
        elif not isinstance(node, str):
            return node
        text = json.dumps(node, separators=(",", ":"), ensure_ascii=False)
        if len(text) < MIN_CHARS:
            return node
        if text not in index:
            index[text] = len(table)
            table.append(node)
        return {"$r": index[text]}

    return {"table": table, "root": walk(value)}


def unpack(data: dict[str, Any]) -> Any:
    table: list[Any] = data["table"]
    done: dict[int, Any] = {}

    def walk(node: Any) -> Any:
        if isinstance(node, dict):
            if len(node) == 1 and isinstance(node.get("$r"), int):
                at = node["$r"]
                if at not in done:
                    done[at] = walk(table[at])
                return done[at]
            return {k: walk(v) for k, v in node.items()}
        if isinstance(node, list):
            return [walk(v) for v in node]
        return node

    return walk(data["root"])


def save(path: Path, value: Any) -> None:
    path.write_bytes(gzip.compress(json.dumps(pack(value), separators=(",", ":"), ensure_ascii=False).encode(), 9,
                                   mtime=0))


def load(path: Path) -> Any:
    return unpack(json.loads(gzip.decompress(path.read_bytes())))
