"""People see and control what is kept: /v1/keel/memory, for one user at a time.

Who may act for whom (the same rule as on chat):
- a tenant key (`auth.keys`) is an app's key: it acts for the end user it names in
  `X-Keel-User`, as the app does on chat;
- a user key (`auth.user_keys`) acts only as its own user: naming anyone else is a 403;
- an admin key (`auth.admin_keys`) may also name any user of its tenant with `?user=`, and
  reads the audit trail and the dead letters;
- a passthrough tenant's provider key proves no user: no memory API for it.
Nobody reaches another tenant's memory. A store that does not answer is a 503.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

import orjson
from starlette.requests import Request
from starlette.responses import Response

from proxy.errors import AuthenticationError, BadRequestError, BodyTooLargeError, ForbiddenError, StoreUnavailableError
from proxy.ingress import Authenticator, Caller
from proxy.memory.book import MemoryBook, MemoryLimitError
from proxy.memory.jobs import MemoryJob, MemoryJobs
from proxy.memory.worker import limits
from proxy.stores import StoreError

ENTRY_BODY_LIMIT = 1024 * 1024  # a PUT body larger than this is refused before it is read whole


class MemoryApi:
    def __init__(self, auth: Authenticator, book: MemoryBook, jobs: MemoryJobs,
                 read_body: Callable[[Request, int], Awaitable[bytes]]) -> None:
        self.auth, self.book, self.jobs, self.read_body = auth, book, jobs, read_body

    def _who(self, request: Request, admin: bool = False) -> tuple[Caller, str]:
        caller = self.auth.authenticate(request.headers)
        if not caller.keyed:
            raise AuthenticationError("the memory API needs a Keel key, not a provider key")
        if not caller.tenant.memory.enabled:
            raise BadRequestError(f"memory is not enabled for tenant {caller.tenant.id!r}", code="memory_off")
        if admin and not caller.admin:
            raise ForbiddenError("this needs a tenant admin key", code="not_admin")
        named = request.query_params.get("user")
        header = request.headers.get("x-keel-user")
        if caller.bound_user is not None:
            other = next((n for n in (named, header) if n and n != caller.bound_user), None)
            if other is not None:
                raise ForbiddenError(f"this key acts only for its own user, not {other!r}", code="user_mismatch")
            return caller, caller.bound_user
        if named is not None and not caller.admin:
            raise ForbiddenError("only a tenant admin key may name a user with ?user=", code="not_admin")
        user = named or header
        if not user:
            raise BadRequestError("say whose memory: send X-Keel-User (or ?user= with an admin key)", param="user")
        return caller, user

    async def list(self, request: Request) -> Response:
        caller, user = self._who(request)
        records = await _store(self.book.records(caller.tenant.id, user))
        return _json({"user": user, "entries": {k: e.value for k, e in records.items()},
                      "details": {k: {"updated_at": e.updated_at, "source": e.source} for k, e in records.items()}})

    async def put(self, request: Request) -> Response:
        caller, user = self._who(request)
        raw = await self.read_body(request, ENTRY_BODY_LIMIT)
        try:
            body = orjson.loads(raw)
            value = body["value"]
            assert isinstance(value, str)
        except (orjson.JSONDecodeError, KeyError, TypeError, AssertionError):
            raise BadRequestError('send {"value": "<text>"}', param="value") from None
        name = request.path_params["key"]
        try:
            await _store(self.book.put(caller.tenant.id, user, name, value, limits(caller.tenant)))
        except MemoryLimitError as exc:
            raise BodyTooLargeError(str(exc), code="memory_limit") from None
        return _json({"user": user, "key": name, "value": value})

    async def delete(self, request: Request) -> Response:
        caller, user = self._who(request)
        name = request.path_params.get("key")
        if name is None:
            await _store(self.book.clear(caller.tenant.id, user))
            return _json({"user": user, "deleted": "all"})
        deleted = await _store(self.book.delete(caller.tenant.id, user, name))
        return _json({"user": user, "key": name, "deleted": deleted}, 200 if deleted else 404)

    async def audit(self, request: Request) -> Response:
        """What was set, changed, refused or deleted for this user, when, and from which turn."""
        caller, user = self._who(request, admin=True)
        trail = await _store(self.book.trail(caller.tenant.id, user))
        return _json({"user": user, "trail": [line.__dict__ for line in trail]})

    async def dead_letters(self, request: Request) -> Response:
        """The tenant's memory jobs that failed for good, with the reason."""
        caller = self.auth.authenticate(request.headers)
        if not caller.admin:
            raise ForbiddenError("this needs a tenant admin key", code="not_admin")
        dead = await _store(self.jobs.dead(caller.tenant.id))
        out = []
        for job in dead:
            try:
                memory_job = MemoryJob.from_bytes(job.payload)
                user, queued_at = memory_job.owner, memory_job.queued_at
            except Exception:
                user, queued_at = job.queue.split("/", 1)[-1], job.enqueued_at
            out.append({"id": job.id, "user": user, "attempts": job.attempts, "reason": job.reason,
                        "queued_at": queued_at})
        return _json({"dead": out})


T = TypeVar("T")


async def _store(work: Awaitable[T]) -> T:
    try:
        return await work
    except StoreError as exc:
        raise StoreUnavailableError(f"the memory store is unavailable ({exc}); nothing was changed") from None


def _json(data: object, status: int = 200) -> Response:
    return Response(orjson.dumps(data), status_code=status, media_type="application/json")
