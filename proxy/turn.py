"""The turn: one request as the planners see it, and the plain data the response side hands on.

This is the bottom layer: the planners, the pipeline, the responders and the relay all meet
here and import nothing from each other.
"""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Protocol

from starlette.responses import Response

from proxy import client_ids, jsontext
from proxy.breakpoints import takes_cache_control, within_budget
from proxy.chain import CONTEXT_ROLES, caller_seed, namespace
from proxy.codecs import View
from proxy.config import TenantConfig
from proxy.conversations import Location
from proxy.jsontext import Json, JsonObject
from proxy.messages import message_text
from proxy.records import NO_PATCH, RecordPatch
from proxy.shapes import Shape
from proxy.shapes.chat import CHAT
from proxy.upstream import UpstreamResponse

if TYPE_CHECKING:
    from proxy.relay import Writer

MAX_LABEL = 128  # the longest conversation id shown (and stored) as the client sent it


class Accounting(Protocol):
    """Where a turn's usage goes once its answer is complete (see `proxy.accounting`)."""

    def record(self, usage: Json, rounds: int = 0, first: Json = None, calls: Sequence[Json] = (),
               found: Sequence[str] = (), shown: JsonObject | None = None) -> Mapping[str, str]: ...

    async def settled(self) -> None:
        """Wait (briefly) until what was relayed is on record: before the answer's last bytes."""
        ...


@dataclass(frozen=True)
class Exchange:
    """What a responder needs from the app: a way to call the upstream, and the one way out
    (`proxy.relay.Writer`: every answer the client gets, counted once)."""

    send: Callable[[bytes], Awaitable[UpstreamResponse]]
    writer: Writer
    content: bytes = b""  # the planned body, as encoded for the upstream
    client_raw: bytes = b""  # the client's own body: what a failing responder falls back to
    accounting: Accounting | None = None  # the turn's usage, metered once (None: metrics only)


class Responder(Protocol):
    """A planner's hand on the response: it calls the upstream (maybe several times) and
    builds what the client gets."""

    async def respond(self, request: Turn, exchange: Exchange) -> Response: ...


@dataclass(frozen=True)
class Turn:
    """One turn as the planners see it, whatever the API shape it came in.

    `body` is the wire-neutral view its codec made (Chat-Completions-shaped; for
    /v1/chat/completions the client's body itself). `raw` is the client's body; it is forwarded
    untouched unless a planner returns a turn with a different `body`, which the codec then
    renders back into the shape, unchanged parts as sent (invariants 1 and 7).
    """

    tenant: TenantConfig
    raw: bytes
    body: JsonObject
    headers: Mapping[str, str]
    request_id: str
    shape: Shape = CHAT  # its API shape: the codec, framings, errors and capabilities (`proxy.shapes`)
    view: View | None = None  # what the shape's codec made of the client's body (None: not read)
    scope: str = ""  # the caller's credential digest, see `Caller.scope`
    memory_scope: str | None = ""  # see `Caller.memory_scope` (None: a caller with no credential)
    bound_user: str | None = None  # the end user a user key acts as (overrides what the body says)
    plannable: bool = True  # False: a body Keel cannot hold (too deep); forwarded as sent
    client_messages: tuple[JsonObject, ...] = ()  # the client's own message objects, as parsed
    location: Location | None = None  # where the turn sits in its conversation (features on only)
    responder: Responder | None = None  # set by a planner that must see the response (tool_search)
    response_headers: Mapping[str, str] = field(default_factory=dict)
    record: RecordPatch = NO_PATCH  # for the newest turn record, written once
    notes: Mapping[str, Json] = field(default_factory=dict)  # why the prompt prefix may have changed (logs)
    # Work that waits until the upstream accepts the turn (its first 2xx): nothing a refused turn asked for is kept.
    on_accepted: tuple[Callable[[], Awaitable[None]], ...] = ()

    @property
    def stream(self) -> bool:
        return bool(self.body.get("stream"))

    @property
    def messages(self) -> list[JsonObject]:
        messages: list[JsonObject] = self.body["messages"]
        return messages

    @property
    def owner(self) -> str:
        """The caller's credential and end user as one digest: who state outside the chain (a
        response id, Keel's alias for it) belongs to."""
        return hashlib.blake2b(f"{self.scope}\0{self.end_user or ''}".encode(), digest_size=16).hexdigest()

    @property
    def end_user(self) -> str | None:
        """The end user: a user key's own, else what the client names (`proxy.client_ids`)."""
        if self.bound_user is not None:
            return self.bound_user
        return client_ids.end_user(self.headers, self.body)

    @property
    def conversation_id(self) -> str | None:
        """The conversation the client names, if it names one (`proxy.client_ids`)."""
        return client_ids.conversation_id(self.headers, self.body)

    @property
    def conversation_label(self) -> str | None:
        """The conversation id as Keel shows it (`x-keel-conversation`, the page, the ledger's keys):
        the client's own when it is short printable ASCII, else `id-` and a digest of it, so a
        unicode, multi-line or very long id never reaches a response header or a store key as sent."""
        value = self.conversation_id
        if value is None or (len(value) <= MAX_LABEL and value == value.strip()
                                  and all(" " <= c <= "~" for c in value)):
            return value
        return "id-" + hashlib.blake2b(value.encode(errors="surrogatepass"), digest_size=16).hexdigest()

    @property
    def cache_key(self) -> str | None:
        """The client's own `prompt_cache_key`: it separates conversations, but an app may
        send one constant for all its users, so it never stands in for the system prompt."""
        value = self.body.get("prompt_cache_key")
        return str(value) if isinstance(value, str) and value else None

    @property
    def context_text(self) -> str:
        """The system and developer messages that open the conversation, joined: context, not
        chain links (later system messages stay in place and are not frozen)."""
        out = []
        for message in self.messages:
            if message.get("role") not in CONTEXT_ROLES:
                break
            out.append(message_text(message))
        return "\n\n".join(out)

    @property
    def content_scope(self) -> str:
        """Who may name content stored once by hash (`proxy.blobs`): the tenant, and a
        passthrough caller's credential."""
        return self.tenant.id + "\x00" + self.scope

    @property
    def caller_seed(self) -> str:
        """Who is asking (see `proxy.chain`): tenant, credential, end user, the ids the client sent, shape."""
        return caller_seed(self.tenant.id, self.end_user, self.conversation_id, scope=self.scope,
                           cache_key=self.cache_key, tag=self.shape.chain_tag)

    @property
    def caches_at_breakpoints(self) -> bool:
        """Does this turn's upstream cache only at `cache_control` breakpoints? (`breakpoints.takes_cache_control`)"""
        return takes_cache_control(self.shape, self.tenant.upstream.kind, self.body.get("model"))

    def chain_seed(self, context_digest: str) -> str:
        """The namespace of this caller's conversation begun under the system prompt `context_digest`."""
        return namespace(self.caller_seed, context_digest)

    def with_body(self, body: JsonObject, **changes: Any) -> Turn:  # Any: dataclasses.replace's field values
        return replace(self, body=body, **changes)

    def with_record(self, patch: RecordPatch) -> Turn:
        """Fields for the newest user message's turn record (the pipeline writes it once)."""
        return replace(self, record=self.record.then(patch))

    def with_note(self, **notes: Json) -> Turn:
        return replace(self, notes={**self.notes, **notes})

    def with_on_accepted(self, work: Callable[[], Awaitable[None]]) -> Turn:
        return replace(self, on_accepted=(*self.on_accepted, work))

    def with_headers(self, **headers: str) -> Turn:
        return replace(self, response_headers={**self.response_headers, **headers})

    def encoded(self, original: Turn) -> bytes:
        """The bytes to send upstream: the client's own unless a planner changed the body;
        then the body in its own key order, numbers as the client wrote them (invariant 7)."""
        if self.body is original.body:
            return self.raw
        return encode(self.wire_body())

    def wire_body(self, body: JsonObject | None = None) -> JsonObject:
        """A view body (this turn's, or one derived from it) in the client's API shape: the one
        path out of every planned request, so the provider's breakpoint limit is kept here."""
        body = self.body if body is None else body
        if self.view is None:
            return body
        wire = self.shape.codec.render(body, self.view)
        if takes_cache_control(self.shape, self.tenant.upstream.kind, wire.get("model")):
            wire = within_budget(wire, self.view.wire)
        return wire


def encode(body: JsonObject) -> bytes:
    return jsontext.dumps(body)
