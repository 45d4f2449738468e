"""Each user's memory entries, by key, in the Store: durable user data, never expired silently."""

from __future__ import annotations

from proxy.stores import Store, key


class MemoryBook:
    def __init__(self, store: Store) -> None:
        self.store = store

    @staticmethod
    def _key(tenant: str, user: str) -> str:
        return key(f"memory:{tenant}:{user}", "entries")

    async def entries(self, tenant: str, user: str) -> dict[str, str]:
        raw = await self.store.hgetall(self._key(tenant, user))
        return {k: v.decode() for k, v in raw.items()}

    async def put(self, tenant: str, user: str, name: str, value: str) -> None:
        await self.store.hset(self._key(tenant, user), name, value.encode())

    async def delete(self, tenant: str, user: str, name: str) -> bool:
        return await self.store.hdel(self._key(tenant, user), name)

    async def clear(self, tenant: str, user: str) -> None:
        await self.store.delete(self._key(tenant, user))
