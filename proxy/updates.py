"""Updates stored on a user message, put back at the start of its content on every later request.

The context planner's `<context_update>` and the tool planner's `<tools_update>` are each stored
on the turn record of the user message they were first sent with (by its chain hash), and every
later request of the segment renders them there again, byte for byte. Both planners use this
module; it sits below both (and below `proxy.context` and `proxy.tools`, which it keeps apart).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from proxy.jsontext import JsonObject
from proxy.turn import Turn


def prepend_updates(request: Turn, messages: Sequence[JsonObject],
                    updates: Mapping[str, str]) -> tuple[list[JsonObject], Turn]:
    """Put each stored update (by the user message's chain hash) at the start of its message.

    A user message is found by a stable index, its place among the request's user messages: the
    n-th user message in `messages` is the chain's n-th user link. `messages` holds every user
    message of the request in order (planners insert only assistant and tool messages, the hidden
    exchanges, and replace only the leading system ones). The returned request's `client_messages`
    hold the rewritten messages, so a later planner reads the client's messages as sent upstream."""
    assert request.location is not None
    links = request.location.chain.user_links
    client = list(request.client_messages)
    rendered: list[JsonObject] = []
    users = 0
    for message in messages:
        if message.get("role") == "user":
            link = links[users] if users < len(links) else None
            users += 1
            update = updates.get(link.hash) if link is not None else None
            if link is not None and update is not None:
                message = with_update(message, update)
                if link.index < len(client):
                    client[link.index] = message
        rendered.append(message)
    return rendered, replace(request, client_messages=tuple(client))


def with_update(message: JsonObject, update: str) -> JsonObject:
    """The user message with the update block at the start of its content (a new dict)."""
    content = message.get("content")
    if isinstance(content, list):
        return {**message, "content": [{"type": "text", "text": update}, *content]}
    text = content if isinstance(content, str) else ""
    return {**message, "content": update + "\n\n" + text}
