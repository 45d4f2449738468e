"""Which requests reach objects a provider stores under its key, and which objects they name.

A keyed tenant sends every caller's requests with one provider key, and the provider cannot
tell those callers apart: whatever one of them stored (a response and its input items, a
stored chat completion, a conversation, a file, a batch…) any other could read, continue or
delete by id. `proxy.owners` decides who may; this module only reads requests.

`route(method, path)` reads a /v1 path the way a provider may (percent-decoded, empty segments
dropped, the family in any letter case) as one `Route`:

    shaped     POST to /v1/chat/completions, /v1/responses or /v1/messages however spelled:
               the codec's route, which checks and records what it names
    stateless  models, embeddings, moderations, audio, images, token counts: nothing stored
    create     POST on a stored family's collection: the reply's id is the caller's
    list       any other method on a collection: every caller's objects at once
    object     a path under one object's id (its items, content, cancel, …)
    action     a collection-level verb whose body names objects (responses/input_tokens)
    unknown    anything else: nothing says it is stateless

`references(body)` lists the stored objects a request body names: `previous_response_id`, the
`conversation`, `item_reference` input items, file ids (in content parts, a batch's
`input_file_id`, a vector store's `file_id`/`file_ids`), vector stores and containers in tools.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal
from urllib.parse import unquote

from proxy.jsontext import Json, JsonObject

RouteKind = Literal["shaped", "stateless", "create", "list", "object", "action", "unknown"]
SHAPED = frozenset({("chat", "completions"), ("responses",), ("messages",)})  # an API shape's route, spelled otherwise
# Families of stored objects, and the words after the family that are verbs, not ids.
STORED: dict[tuple[str, ...], frozenset[str]] = {
    ("responses",): frozenset({"input_tokens", "compact"}),
    ("chat", "completions"): frozenset(),
    ("conversations",): frozenset(),
    ("files",): frozenset(),
    ("uploads",): frozenset(),
    ("batches",): frozenset(),
    ("vector_stores",): frozenset(),
    ("containers",): frozenset(),
    ("messages", "batches"): frozenset(),
    ("skills",): frozenset(),
}
STATELESS = (("models",), ("embeddings",), ("moderations",), ("completions",), ("audio", "speech"),
             ("audio", "transcriptions"), ("audio", "translations"), ("images", "generations"),
             ("images", "edits"), ("images", "variations"), ("messages", "count_tokens"))
HOSTED_TOOLS = frozenset({"file_search", "code_interpreter", "container", "shell"})  # tools that name stored objects
MAX_REFERENCES = 1000  # ids one body may name; each is one owner lookup


@dataclass(frozen=True)
class Route:
    kind: RouteKind
    family: str = ""  # e.g. "responses", "chat/completions"
    object_id: str | None = None  # the object a path names (kind "object")
    shape: str | None = None  # the API shape's route, e.g. "/v1/chat/completions" (kind "shaped")
    items: bool = False  # the reply lists an object's items (ids a caller may reference later)


def segments(path: str) -> list[str]:
    """A path after /v1/ as a provider may read it: decoded (through double encoding), no empty segments."""
    for _ in range(3):
        path, previous = unquote(path), path
        if path == previous:
            break
    return [s for s in path.split("/") if s]


def route(method: str, path: str) -> Route:
    parts = segments(path)
    lowered = tuple(p.lower() for p in parts)
    if method == "POST" and lowered in SHAPED:
        return Route("shaped", "/".join(lowered), shape="/v1/" + "/".join(lowered))
    if any(lowered[:len(prefix)] == prefix for prefix in STATELESS):
        return Route("stateless")
    family = max((f for f in STORED if lowered[:len(f)] == f), key=len, default=None)
    if family is None:
        return Route("unknown", "/".join(lowered))
    name, rest = "/".join(family), parts[len(family):]
    if not rest:
        return Route("create" if method == "POST" else "list", name)
    if rest[0].lower() in STORED[family]:
        return Route("action", name)
    items = len(rest) == 2 and rest[1].lower() in ("input_items", "items")
    return Route("object", name, object_id=rest[0], items=items)


Reference = tuple[str, str]  # (the body field that names it, the object's id)


def references(body: JsonObject) -> list[Reference]:
    """Every stored object a request body names (see the module docstring)."""
    found: list[Reference] = []
    previous = body.get("previous_response_id")
    if isinstance(previous, str):
        found.append(("previous_response_id", previous))
    for field in ("conversation", "container", "input_file_id", "file_id"):
        named = _id(body.get(field))
        if named is not None:
            found.append((field, named))
    files = body.get("file_ids")
    found += [("file_ids", f) for f in files if isinstance(f, str)] if isinstance(files, list) else []
    for field in ("input", "messages"):
        items = body.get(field)
        if isinstance(items, list):
            for item in items:
                if isinstance(item, dict):
                    found += _item(field, item)
    tools = body.get("tools")
    for tool in tools if isinstance(tools, list) else ():
        if isinstance(tool, dict) and tool.get("type") in HOSTED_TOOLS:
            stores = tool.get("vector_store_ids")
            found += [("tools", s) for s in stores if isinstance(s, str)] if isinstance(stores, list) else []
            container = _id(tool.get("container"))
            if container is not None:
                found.append(("tools", container))
    return found


def _id(value: Json) -> str | None:
    """An object named by its id, or by `{"id": …}`."""
    if isinstance(value, dict):
        value = value.get("id")
    return value if isinstance(value, str) and value else None


def _item(field: str, item: JsonObject) -> list[Reference]:
    kind = item.get("type")
    if kind == "item_reference" or (kind is None and "role" not in item and isinstance(item.get("id"), str)):
        named = _id(item)
        return [(field, named)] if named is not None else []
    content = item.get("content")
    out = []
    for part in content if isinstance(content, list) else ():
        if isinstance(part, dict):
            for holder in (part, part.get("file"), part.get("source")):
                named = holder.get("file_id") if isinstance(holder, dict) else None
                if isinstance(named, str):
                    out.append((field, named))
    return out
