"""Passthrough callers the provider has accepted: Keel plans (and stores) only for them.

A passthrough tenant's callers bring their own provider key, which Keel cannot check. A caller
whose key the provider refuses must cost Keel nothing: no anchor, no turn record, no shared
content stored for 30 days (five refused 1.9 MB requests once grew the store by 25 MB). So a
credential's requests are planned from the request alone (the tool cut; a memory ask, queued
once the provider accepts the turn), with nothing stored, until the provider has accepted one
(a 2xx); from then on the credential is remembered and its requests are planned in full. The
cost: one turn per credential without a frozen prompt, a cache miss, never a loss.
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict

from proxy.stores import KeyValue, StoreError, key


class ProvenCallers:
    def __init__(self, store: KeyValue, ttl_seconds: float, size: int = 65_536) -> None:
        self.store = store
        self.ttl = ttl_seconds
        self._size = size
        self._known: OrderedDict[tuple[str, str], None] = OrderedDict()  # this process's, newest last

    @staticmethod
    def _key(tenant: str, scope: str) -> str:
        return key(f"callers:{tenant}", scope)

    def _remember(self, found: tuple[str, str]) -> None:
        self._known[found] = None
        self._known.move_to_end(found)
        if len(self._known) > self._size:
            self._known.popitem(last=False)

    async def known(self, tenant: str, scope: str) -> bool:
        """Has the provider accepted this credential before? (A store that cannot say: no.)"""
        if (tenant, scope) in self._known:
            return True
        try:
            found = await self.store.get(self._key(tenant, scope)) is not None
        except StoreError:
            return False
        if found:
            self._remember((tenant, scope))
        return found

    async def prove(self, tenant: str, scope: str) -> None:
        """The provider accepted a request made with this credential."""
        if (tenant, scope) in self._known:
            return
        self._remember((tenant, scope))
        with contextlib.suppress(StoreError):  # this process knows; another replica plans one turn later
            await self.store.set(self._key(tenant, scope), b"1", self.ttl)
