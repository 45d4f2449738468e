"""Who a stored object belongs to: what a provider keeps under a keyed tenant's one key is opened
only for the caller it was shown to.

The provider stores responses, their items, stored chat completions, conversations, files…
per provider key, and a keyed tenant sends every caller's requests with its one key: without
this, anyone who learns an id (logs, a shared link, a support ticket) reads, continues or
deletes someone else's. So every id a keyed caller is shown (a response, its output items, a
stored completion, an object it created, an item list it read) is recorded with its `Owner`
(a digest of the caller's Keel key, and the end user it acted for), and every request that
names a stored object (`proxy.stored`: in its path or in its body) is checked against it.

Records are kept per provider account (a digest of the upstream's base URL, key and headers),
not per tenant: two tenants on one provider key reach each other's objects at the provider. An
account more than one Keel key reaches is *shared*, and its callers are *scoped*: an id Keel
cannot prove is theirs (never recorded, or a store that cannot answer) is refused, listings of
stored objects are refused (they would show every key's), and a path Keel does not know to be
stateless is refused. The one key of an account of its own is its holder: its unknown ids and
listings go as sent, and only an id recorded for another end user is refused. A passthrough
tenant's callers send their own provider keys: the provider separates them, nothing is checked.

A record that cannot be written within the request's store budget is retried in the
background; until it lands the id is refused to scoped callers (closed, never open).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import AsyncIterable, AsyncIterator, Iterable
from dataclasses import dataclass

import orjson
from starlette.responses import Response, StreamingResponse

from proxy import jsontext
from proxy.background import Background
from proxy.clock import SYSTEM_CLOCK, Clock
from proxy.config import TenantConfig
from proxy.encoding import Decoder, ReplyEncodingError, decode_all
from proxy.errors import BadRequestError, ForbiddenError, NotFoundError, StoreUnavailableError
from proxy.jsontext import Json, JsonObject
from proxy.shapes import ShownIds
from proxy.sse import EventParser, EventTooLargeError
from proxy.stored import MAX_REFERENCES, Route, references
from proxy.stores import KeyValue, StoreError, key

log = logging.getLogger("keel.owners")
OWNER_SECONDS = 400 * 86400  # longer than a provider keeps a response; files and conversations may live long
RETRIES = (0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0)  # seconds before each background retry of an unwritten record
Chunk = str | bytes | memoryview  # what a StreamingResponse body yields


def provider_account(tenant: TenantConfig) -> str:
    """Which provider account a keyed tenant's requests reach: its upstream's URL, key and headers."""
    upstream = tenant.upstream
    parts = [upstream.base_url, upstream.api_key() or "", *sorted(f"{k.lower()}:{v}" for k, v in upstream.headers.items())]
    return hashlib.blake2b("\0".join(parts).encode(), digest_size=16, person=b"keel-account").hexdigest()


@dataclass(frozen=True)
class Owner:
    """A caller as the owner of what it stores: its Keel key's digest and the end user it acts for."""

    account: str  # the provider account its objects live in
    credential: str  # `Caller.scope`
    user: str | None  # the end user it states (a user key's own), None when it states none
    scoped: bool  # its account is shared: an id it cannot be shown to own is refused

    def value(self) -> bytes:
        return f"{self.credential}\0{self.user or ''}".encode()

    def owns(self, recorded: bytes) -> bool:
        """The same key, and the same end user unless this request states none (a tenant key acts for
        all its users: one that names no user may reach any of them)."""
        credential, _, user = recorded.decode(errors="replace").partition("\0")
        return credential == self.credential and (self.user is None or user == self.user)


class Owners:
    def __init__(self, store: KeyValue, background: KeyValue, clock: Clock = SYSTEM_CLOCK) -> None:
        self.store = store
        self.background = background  # retries, with a longer budget
        self.clock = clock  # waits between retries
        self.retries = Background("owner_retry_failed", log)  # owner records whose first write overran

    @staticmethod
    def _key(account: str, object_id: str) -> str:
        return key(f"owners:{account}", hashlib.blake2b(object_id.encode(errors="surrogatepass"), digest_size=16).hexdigest())

    async def admit(self, owner: Owner, route: Route) -> None:
        """Refuse a path that reaches stored objects its caller cannot be shown to own."""
        if route.kind == "list" and owner.scoped:
            raise ForbiddenError(f"listing {route.family} is not open to keys that share a provider account: it "
                                 "would show every key's objects", code="listing_refused")
        if route.kind == "unknown" and owner.scoped:
            raise ForbiddenError(f"/v1/{route.family} is not open to keys that share a provider account: Keel "
                                 "cannot tell whose stored objects it reaches", code="route_refused")
        if route.kind == "object" and route.object_id is not None and await self._refused(owner, [route.object_id]):
            raise NotFoundError(f"no {route.family} object with id {route.object_id!r} for this key")

    async def check(self, owner: Owner, body: JsonObject) -> None:
        """Refuse a body that names a stored object (`previous_response_id`, a conversation, an item
        reference, a file…) of another owner, or, for a scoped caller, one Keel cannot prove is its own."""
        named = references(body)
        if len(named) > MAX_REFERENCES:
            raise BadRequestError(f"the body names {len(named)} stored objects; at most {MAX_REFERENCES}",
                                  code="too_many_references")
        refused = await self._refused(owner, [object_id for _, object_id in named])
        if refused is not None:
            param = next(field for field, object_id in named if object_id == refused)
            raise ForbiddenError(f"{param} names {refused!r}, which is not an object of this key or user",
                                 param=param, code="not_owner")

    async def _refused(self, owner: Owner, ids: list[str]) -> str | None:
        if not ids:
            return None
        try:
            recorded = await self.store.get_many([self._key(owner.account, i) for i in ids])
        except StoreError:
            if owner.scoped:
                raise StoreUnavailableError("Keel cannot check who owns the stored objects this request names "
                                            "while its store is unavailable; try again") from None
            return None
        for object_id, found in zip(ids, recorded, strict=True):
            if (found is None and owner.scoped) or (found is not None and not owner.owns(found)):
                return object_id
        return None

    async def record(self, owner: Owner, ids: Iterable[str]) -> None:
        """Record these ids as the owner's (never another's: an id keeps its first owner)."""
        for object_id in dict.fromkeys(ids):
            try:
                await self.store.set_if_absent(self._key(owner.account, object_id), owner.value(), OWNER_SECONDS)
            except StoreError as exc:
                log.warning("owner_not_recorded", extra={"error": repr(exc), "retrying": True})
                self._retry(owner, object_id)

    def _retry(self, owner: Owner, object_id: str) -> None:
        async def again() -> None:
            for wait in RETRIES:
                await self.clock.sleep(wait)
                try:
                    await self.background.set_if_absent(self._key(owner.account, object_id), owner.value(), OWNER_SECONDS)
                    return
                except StoreError:
                    continue
            log.error("owner_never_recorded", extra={"account": owner.account[:8]})  # the id stays closed

        self.retries.spawn(again())

    async def drain(self) -> None:
        """Wait for the retries in flight (shutdown, tests)."""
        await self.retries.drain()

    async def watch(self, owner: Owner, response: Response, *, events: ShownIds | None = None,
                    items: bool = False) -> Response:
        """Record the ids the client is shown in this reply before it reads them: a whole JSON body's
        `id` (and, for a scoped caller, its output items and, with `items`, its listed items), or the
        ids a stream's events carry, as its shape reads them (`events`, `Shape.shown_ids`)."""
        if not 200 <= response.status_code < 300:
            return response
        coding = response.headers.get("content-encoding", "").strip().lower()
        coding = "" if coding in ("", "identity") else coding
        if isinstance(response, StreamingResponse):
            if events is not None and response.headers.get("content-type", "").startswith("text/event-stream"):
                response.body_iterator = self._stream(owner, response.body_iterator, coding, events)
            return response
        try:
            body = decode_all(bytes(response.body), coding) if coding else bytes(response.body)
            parsed = orjson.loads(body)
        except (ReplyEncodingError, orjson.JSONDecodeError):
            return response
        await self.record(owner, _ids(parsed, owner.scoped, items))
        return response

    async def _stream(self, owner: Owner, body: AsyncIterable[Chunk], coding: str, events: ShownIds) -> AsyncIterator[Chunk]:
        watching = True
        parser = EventParser()
        try:
            decoder = Decoder(coding) if coding else None
        except ReplyEncodingError:
            watching = False
        async for chunk in body:
            if watching:
                data = chunk if isinstance(chunk, bytes) else bytes(chunk) if isinstance(chunk, memoryview) else chunk.encode()
                try:
                    shown = [i for e in parser.feed(decoder.feed(data) if decoder else data)
                             if e.data and e.data != b"[DONE]" for i in events.read(e.data, owner.scoped)]
                except (ReplyEncodingError, EventTooLargeError):
                    watching, shown = False, []
                if shown:
                    await self.record(owner, shown)
                    watching = not events.once  # e.g. a chat stream names its one id in every event
            yield chunk


def checkable(raw: bytes, owner: Owner) -> JsonObject:
    """A body as the JSON object whose references are checked. One Keel cannot read (not JSON, too
    deep to hold) names nothing Keel can check: refused for a scoped caller, the provider's to judge
    for an account's one key."""
    try:
        body = jsontext.loads(raw) if raw else {}
    except ValueError:
        body = None
    if isinstance(body, dict):
        return body
    if owner.scoped:
        raise BadRequestError("the body is not a JSON object Keel can check for the stored objects it names",
                              code="invalid_json")
    return {}


def _ids(parsed: Json, scoped: bool, items: bool) -> list[str]:
    """The ids a whole reply shows: its own, and for a scoped caller its output items and listed items."""
    if not isinstance(parsed, dict):
        return []
    shown = [parsed["id"]] if isinstance(parsed.get("id"), str) else []
    if scoped:
        listed = [*(parsed.get("output") or []), *((parsed.get("data") or []) if items else [])]
        shown += [o["id"] for o in listed if isinstance(o, dict) and isinstance(o.get("id"), str)]
    return shown
