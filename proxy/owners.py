"""Who a /v1/responses id belongs to: a `previous_response_id` continues only for the key and
end user that were shown it.

The provider stores responses per provider key, and a keyed tenant sends every user's turns
with its one key: without this, any caller who learns a response id (logs, a shared link, a
support ticket) continues from someone else's conversation. Each response id a client is
shown is recorded with its owner (a digest of the caller's credential and the end user)
before the client reads it (one store write, within the store's budget); a request naming an
id recorded for another owner gets a 403 in the Responses shape. An id Keel never saw, or a
store that cannot answer, lets the request go as sent (fail-open: the provider still refuses
ids of other provider keys). A passthrough tenant's callers send their own provider keys, and
whoever holds a key can name any of its responses at the provider directly: nothing is recorded.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import AsyncIterable, AsyncIterator

import orjson
from fastapi import Response
from fastapi.responses import StreamingResponse

from proxy.errors import ForbiddenError
from proxy.jsontext import Json
from proxy.stores import Store, StoreError, key
from proxy.turn import Turn

log = logging.getLogger("keel.owners")
CREATED = b'"response.created"'
LEADING_ID = re.compile(rb'\s*\{\s*"id"\s*:\s*"([A-Za-z0-9_.:-]{1,256})"')
Chunk = str | bytes | memoryview  # what a StreamingResponse body yields


class ResponseOwners:
    def __init__(self, store: Store, ttl: float) -> None:
        self.store = store
        self.ttl = ttl

    @staticmethod
    def _key(tenant: str, response_id: str) -> str:
        return key(f"responses:{tenant}", hashlib.blake2b(response_id.encode(), digest_size=16).hexdigest())

    async def check(self, turn: Turn) -> None:
        """Refuse a `previous_response_id` recorded for another key or end user."""
        shown = turn.body.get("previous_response_id")
        if not isinstance(shown, str):
            return
        try:
            recorded = await self.store.get(self._key(turn.tenant.id, shown))
        except StoreError:
            return
        if recorded is not None and recorded.decode() != turn.owner:
            raise ForbiddenError("previous_response_id names a response of another key or user",
                                 param="previous_response_id")

    async def watch(self, turn: Turn, response: Response) -> Response:
        """Record the id of the response the client gets, read from the body or the stream (not
        for `store: false`: the provider keeps no such response to continue from)."""
        if response.status_code != 200 or turn.body.get("store") is False:
            return response
        if isinstance(response, StreamingResponse):
            response.body_iterator = self._stream(turn, response.body_iterator)
        else:
            await self._record(turn, bytes(response.body))
        return response

    async def _stream(self, turn: Turn, body: AsyncIterable[Chunk]) -> AsyncIterator[Chunk]:
        seen: bytes | None = b""
        async for chunk in body:
            if seen is not None:
                seen += chunk if isinstance(chunk, bytes) else str(chunk).encode()
                at = seen.find(CREATED)
                end = seen.find(b"\n\n", at) if at >= 0 else -1
                if end >= 0:
                    line = seen[:end].rsplit(b"data:", 1)[-1]
                    await self._record(turn, line, nested=True)
                    seen = None
                elif len(seen) > 65536:  # no response.created up front: not a Responses stream to record
                    seen = None
            yield chunk

    async def _record(self, turn: Turn, data: bytes, nested: bool = False) -> None:
        leading = None if nested else LEADING_ID.match(data)  # a Responses body opens with its id
        if leading is not None:
            shown: Json = leading.group(1).decode()
        else:
            try:
                parsed = orjson.loads(data)
            except orjson.JSONDecodeError:
                return
            holder = parsed.get("response") if nested and isinstance(parsed, dict) else parsed
            shown = holder.get("id") if isinstance(holder, dict) else None
        if isinstance(shown, str):
            try:
                await self.store.set(self._key(turn.tenant.id, shown), turn.owner.encode(), self.ttl)
            except StoreError as exc:  # the id stays unrecorded: any caller of this tenant may name it
                log.warning("response_owner_not_recorded", extra={"tenant": turn.tenant.id, "error": repr(exc)})
