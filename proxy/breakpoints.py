"""The breakpoint budget: no request Keel changes carries more `cache_control` marks than the
provider allows (Anthropic: 4; a fifth is a 400 the client's own request never got).

Marks come from three hands: the client's current request, Keel's cache planner, and a
frozen system prompt or a stored turn rendered as the client first sent it (whose marks the
client may since have moved: Claude Code moves its marks every turn). The budget is checked
once, on the wire body that goes out (the planned request and every call of the tool_search
round loop), where every mark is visible, tool_result blocks and system blocks included. Over
the limit, the client's current marks are kept and the others dropped, earliest first: the
later a mark, the longer the prefix it writes for the next turn.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import TYPE_CHECKING

import orjson

from proxy.jsontext import Json, JsonObject

if TYPE_CHECKING:
    from proxy.shapes import Shape

MAX_BREAKPOINTS = 4
Path = tuple[str | int, ...]


def takes_cache_control(shape: Shape, upstream_kind: str, model: Json) -> bool:
    """Does this request's upstream cache only at `cache_control` breakpoints? Every Messages
    request does; a chat request does for Anthropic-compatible upstreams and Claude on OpenRouter."""
    if shape.always_cache_control:
        return True
    name = str(model or "").lower()
    return upstream_kind == "anthropic-compatible" or (upstream_kind == "openrouter" and
                                                       ("claude" in name or "anthropic" in name))


def marks(body: JsonObject) -> Iterator[tuple[Path, JsonObject]]:
    """Every object carrying `cache_control`, in the order the provider reads them: tools,
    system blocks, then message content (nested content of tool results included)."""
    for section in ("tools", "system", "messages", "input"):
        yield from _marked(body.get(section), (section,))


def _marked(value: Json, path: Path) -> Iterator[tuple[Path, JsonObject]]:
    """Every object under `value` that carries a mark, at any depth (a document's nested content,
    a tool_result's blocks): the provider counts them all."""
    if isinstance(value, list):
        for i, item in enumerate(value):
            yield from _marked(item, (*path, i))
    elif isinstance(value, dict):
        if "cache_control" in value:
            yield path, value
        for name, item in value.items():
            if name != "cache_control" and isinstance(item, (dict, list)):
                yield from _marked(item, (*path, name))


def _signature(path: Path, value: JsonObject) -> bytes:
    """What a mark marks, whatever else moved: its section and the marked object less the mark."""
    rest = {k: v for k, v in value.items() if k != "cache_control"}
    return str(path[0]).encode() + b"\0" + orjson.dumps(rest, option=orjson.OPT_SORT_KEYS)


def within_budget(body: JsonObject, client: JsonObject, limit: int = MAX_BREAKPOINTS) -> JsonObject:
    """`body` with at most `limit` marks: the client's current ones first (`client`: its request
    as sent; a block marked twice counts as the client's only as often as the client marks it),
    then the latest of the others. Unchanged (the same object) when within the limit."""
    found = list(marks(body))
    if len(found) <= limit:
        return body
    own = Counter(_signature(path, value) for path, value in marks(client))
    mine: list[Path] = []
    others: list[Path] = []
    for path, value in reversed(found):  # the client's own marks are the latest of their kind
        signature = _signature(path, value)
        if own[signature] > 0:
            own[signature] -= 1
            mine.append(path)
        else:
            others.append(path)
    others.reverse()
    spare = max(0, limit - len(mine))
    for path in others[:max(0, len(others) - spare)]:
        body = _unmarked(body, path)
    return body


def _unmarked(value: Json, path: Path) -> Json:
    """A copy of `value` along `path` (and only there) with the mark at its end removed."""
    if not path:
        assert isinstance(value, dict)
        return {k: v for k, v in value.items() if k != "cache_control"}
    step, rest = path[0], path[1:]
    if isinstance(value, list) and isinstance(step, int):
        return [*value[:step], _unmarked(value[step], rest), *value[step + 1:]]
    assert isinstance(value, dict)
    return {**value, step: _unmarked(value[step], rest)}
