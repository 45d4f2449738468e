"""`DELETE /v1/keel/cache`: forget every answer and vector Keel keeps for a tenant (its admin key).

`keel purge-cache` does the same from the command line, on the config's store. Nothing purged
is served again from the moment the call returns, on any replica (see `proxy.respcache.entries`).
"""

from __future__ import annotations

import orjson
from starlette.requests import Request
from starlette.responses import Response

from proxy.errors import ForbiddenError, StoreUnavailableError
from proxy.ingress import Authenticator
from proxy.respcache.entries import Entries


class CacheAdmin:
    def __init__(self, auth: Authenticator, entries: Entries) -> None:
        self.auth, self.entries = auth, entries

    async def purge(self, request: Request) -> Response:
        caller = self.auth.authenticate(request.headers)
        if not caller.keyed or not caller.admin:
            raise ForbiddenError("purging the response cache needs a tenant admin key", code="not_admin")
        try:
            purged = await self.entries.purge(caller.tenant.id)
        except Exception as exc:  # the store's failures: say so (a purge that stopped halfway is safe to repeat)
            raise StoreUnavailableError(f"the store did not answer: {exc}") from None
        return Response(orjson.dumps({"tenant": caller.tenant.id, "purged": purged}), media_type="application/json")
