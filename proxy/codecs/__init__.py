"""One codec per API shape: the client's body in, a wire-neutral view for the planners, and back.

The planners work on one view of a turn, shaped like a Chat Completions body: `messages`
(roles system, developer, user, assistant with `tool_calls`, tool results as role `tool`;
content a string or parts), `tools` (function tools), `tool_choice`, `stream`, the ids. A codec
builds that view from its shape's body and renders a planned view back, and only what a
planner changed is rendered anew: every object the view took from the client is remembered
(`View.origin`), and an unchanged one goes back as the client sent it, key order, unknown
fields and number text included. Things a shape has that the view has not (Responses' hosted
tools and reasoning items, Messages' server tools and thinking blocks) ride along untouched.

    chat.py       /v1/chat/completions: the view is the body itself
    responses.py  /v1/responses: instructions, input items, flat function tools
    messages.py   /v1/messages: system blocks, content blocks, tool_use / tool_result
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from proxy.jsontext import Json, JsonObject

T = TypeVar("T")
KEEL = "_keel"  # a key on view objects that only Keel reads (where an object came from); never rendered


@dataclass(frozen=True)
class View:
    """The wire-neutral body a codec made, and where each of its objects came from."""

    body: JsonObject  # Chat-Completions-shaped: the planners' view
    wire: JsonObject  # the client's body as parsed
    origin: dict[int, Json] = field(default_factory=dict)  # id(view object) -> the client's object it stands for
    keep: tuple[Json, ...] = ()  # the view objects themselves, so their ids stay theirs while the turn lives

    def original(self, value: Json) -> Json | None:
        """The client's object behind a view object the planners did not replace, else None."""
        return self.origin.get(id(value))


class Codec(Protocol):
    def check(self, wire: JsonObject) -> None:
        """Raise ValueError for a body that is not of this shape (what `view` checks, no view made)."""
        ...

    def view(self, wire: JsonObject) -> View:
        """The planners' view of a client body (raises ValueError for a body of another shape)."""
        ...

    def render(self, body: JsonObject, view: View) -> JsonObject:
        """The wire body for a planned view: unchanged objects as the client sent them."""
        ...


class Origins:
    """Builds a view's origin table: `take(view_object, client_object)` remembers the pair."""

    def __init__(self) -> None:
        self.origin: dict[int, Json] = {}
        self.keep: list[Json] = []

    def take(self, mine: T, theirs: Json) -> T:
        self.origin[id(mine)] = theirs
        self.keep.append(mine)
        return mine


class ToolViews:
    """The view of a tools array, made once per array object: a tools array a client resends byte
    for byte is the same object each time (`jsontext.Resent`), so its view is too (and the
    catalog knows it by identity). Held arrays keep their ids; at most `size` of them."""

    def __init__(self, size: int = 32) -> None:
        self._size = size
        self._views: OrderedDict[int, tuple[list[Json], list[Json], dict[int, Json]]] = OrderedDict()

    def view(self, tools: list[Json], convert: Callable[[Json], Json | None], take: Origins) -> list[Json]:
        """`convert(tool)` for each tool it takes (None: left out), each pair remembered in `take`."""
        found = self._views.get(id(tools))
        if found is None or found[0] is not tools:
            pairs = [(view, tool) for tool in tools if (view := convert(tool)) is not None]
            found = (tools, [view for view, _ in pairs], {id(view): tool for view, tool in pairs})
            self._views[id(tools)] = found
            while len(self._views) > self._size:
                self._views.popitem(last=False)
        else:
            self._views.move_to_end(id(tools))
        take.origin.update(found[2])
        take.keep.extend(found[1])
        return found[1]


def strip_keel(value: Json) -> Json:
    """A view object as it may go on the wire: without Keel's own bookkeeping keys."""
    if isinstance(value, dict):
        return {k: strip_keel(v) for k, v in value.items() if k != KEEL}
    if isinstance(value, list):
        return [strip_keel(v) for v in value]
    return value


def view_body(wire: JsonObject, messages: list[JsonObject], replaced: tuple[str, ...], own: Callable[[Json], bool],
              to_view: Callable[[JsonObject], JsonObject], choice: Callable[[Json], Json], take: Origins,
              views: ToolViews) -> View:
    """The view of a shape's body: its other fields as sent, `messages` in place of the fields
    they came from (`replaced`), its tools (`view_tools`), and its tool_choice in chat's forms
    (`choice`; only the planners read it: the wire keeps the client's)."""
    body: JsonObject = {k: v for k, v in wire.items() if k not in replaced}
    body["messages"] = messages
    tools = wire.get("tools")
    if isinstance(tools, list):
        body.update(view_tools(tools, own, to_view, take, views))
    if "tool_choice" in wire:
        body["tool_choice"] = choice(wire["tool_choice"])
    return View(body, wire, take.origin, tuple(take.keep))


def view_tools(tools: list[Json], own: Callable[[Json], bool], to_view: Callable[[JsonObject], JsonObject],
               take: Origins, views: ToolViews) -> dict[str, list[Json]]:
    """A shape's tools in the view: its function tools as chat function tools (`tools`, made once
    per array object), the rest (server, hosted, custom tools) as sent (`foreign_tools`, only
    when there are any)."""
    out: dict[str, list[Json]] = {"tools": views.view(tools, lambda t: to_view(t) if own(t) else None, take)}
    if len(out["tools"]) != len(tools):
        out["foreign_tools"] = [t for t in tools if not own(t)]
    return out


def render_tools(body: JsonObject, view: View, own: Callable[[Json], bool],
                 to_wire: Callable[[JsonObject], Json]) -> list[Json] | None:
    """The wire tools for a planned view body; None when they are the client's, as sent. Function
    tools that are the client's one for one (a planner changed some in place: a breakpoint, a
    `defer_loading` removed) each take their own place among the foreign tools, in the client's
    order; a block of Keel's own comes after the foreign tools (as sent, less any a planner dropped)."""
    dropped = body.get("foreign_tools") is not view.body.get("foreign_tools")
    if body.get("tools") is view.body.get("tools") and not dropped:
        return None
    sent = view.wire.get("tools") or []
    foreign = list(body.get("foreign_tools") or []) if dropped else [t for t in sent if not own(t)]
    mine = [to_wire(t) for t in body.get("tools") or []]
    theirs = [t for t in sent if own(t)]
    if not dropped and [id(t) for t in mine] == [id(t) for t in theirs]:
        return None  # the same tools, as sent
    if [_name(t) for t in mine] == [_name(t) for t in theirs]:
        kept, places = {id(t) for t in foreign}, iter(mine)
        return [next(places) if own(t) else t for t in sent if own(t) or id(t) in kept]
    return [*foreign, *mine]


def _name(tool: Json) -> Json:
    return tool.get("name") if isinstance(tool, dict) else None
