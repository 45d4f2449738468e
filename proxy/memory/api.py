"""People see and control what is kept: GET/PUT/DELETE /v1/keel/memory[/{key}].

Scoped by tenant (the key) and user (`X-Keel-User`); a tenant admin key may name any user of
its tenant with `?user=`, and nobody reaches another tenant's memory.
"""

from __future__ import annotations

import orjson
from starlette.requests import Request
from starlette.responses import Response

from proxy.errors import AuthenticationError, BadRequestError
from proxy.ingress import Authenticator, Caller
from proxy.memory.book import MemoryBook


class MemoryApi:
    def __init__(self, auth: Authenticator, book: MemoryBook) -> None:
        self.auth, self.book = auth, book

    def _who(self, request: Request) -> tuple[Caller, str]:
        caller = self.auth.authenticate(request.headers)
        if not caller.keyed:
            raise AuthenticationError("the memory API needs a Keel key, not a provider key")
        named = request.query_params.get("user")
        if named is not None and not caller.admin:
            raise AuthenticationError("only a tenant admin key may name another user", code="not_admin")
        user = named or request.headers.get("x-keel-user")
        if not user:
            raise BadRequestError("say whose memory: send X-Keel-User (or ?user= with an admin key)", param="user")
        return caller, user

    async def list(self, request: Request) -> Response:
        caller, user = self._who(request)
        entries = await self.book.entries(caller.tenant.id, user)
        return _json({"user": user, "entries": entries})

    async def put(self, request: Request) -> Response:
        caller, user = self._who(request)
        try:
            body = orjson.loads(await request.body())
            value = body["value"]
            assert isinstance(value, str)
        except (orjson.JSONDecodeError, KeyError, TypeError, AssertionError):
            raise BadRequestError('send {"value": "<text>"}', param="value") from None
        await self.book.put(caller.tenant.id, user, request.path_params["key"], value)
        return _json({"user": user, "key": request.path_params["key"], "value": value})

    async def delete(self, request: Request) -> Response:
        caller, user = self._who(request)
        key = request.path_params.get("key")
        if key is None:
            await self.book.clear(caller.tenant.id, user)
            return _json({"user": user, "deleted": "all"})
        deleted = await self.book.delete(caller.tenant.id, user, key)
        return _json({"user": user, "key": key, "deleted": deleted}, 200 if deleted else 404)


def _json(data: object, status: int = 200) -> Response:
    return Response(orjson.dumps(data), status_code=status, media_type="application/json")
