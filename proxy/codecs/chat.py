"""/v1/chat/completions: the planners' view is the client's body itself."""

from __future__ import annotations

from proxy.codecs import View
from proxy.jsontext import JsonObject


class ChatCodec:
    def check(self, wire: JsonObject) -> None:
        messages = wire.get("messages")
        if not isinstance(messages, list):
            raise ValueError("'messages' must be a list of message objects")
        if not all(isinstance(m, dict) for m in messages):
            raise ValueError("every entry of 'messages' must be an object")

    def view(self, wire: JsonObject) -> View:
        self.check(wire)
        return View(wire, wire)

    def render(self, body: JsonObject, view: View) -> JsonObject:
        return body
