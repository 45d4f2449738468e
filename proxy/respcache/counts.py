"""What Keel's own caches did and saved: /metrics, and the savings figures (page and `keel report`).

    keel_response_cache_requests_total{tenant, cache, outcome}  hit, coalesced, miss, refresh, bypass
                                                               (embeddings: per input item, hit or miss)
    keel_response_cache_saved_usd_total{tenant, cache}          what the upstream calls not made cost
    keel_response_cache_saved_tokens_total{tenant, cache}       their tokens, input and output
    keel_response_cache_served_bytes_total{tenant, cache}       bytes answered from the cache
    keel_response_cache_stored_bytes_total{tenant}              bytes written to the store
    keel_response_cache_evicted_bytes_total{tenant}             bytes a sweep let go (the bound)

A hit saved what its original call cost: the original's usage at the model's prices. (A repeat
sent direct might have read more of its prompt from the provider's cache: the figure is what the
call cost when it was made.)
"""

from __future__ import annotations

import asyncio

from prometheus_client import CollectorRegistry, Counter

from proxy.config import TenantConfig
from proxy.savings.ledger import Ledger
from proxy.usage import Usage

FLUSH_SECONDS = 1.0  # the savings ledger gets a second's hits in one write per tenant, not one write a hit


class CacheCounts:
    def __init__(self, registry: CollectorRegistry, ledger: Ledger) -> None:
        self.ledger = ledger
        self._unwritten: dict[tuple[str, str], tuple[int, float, int]] = {}  # (tenant, cache) -> hits, $, tokens
        self._flushing = False
        r = registry
        self.requests = Counter("keel_response_cache_requests", "Requests by what Keel's response cache did "
                                "(embeddings: input items)", ["tenant", "cache", "outcome"], registry=r)
        self.saved_usd = Counter("keel_response_cache_saved_usd", "What the upstream calls answered from the cache "
                                 "cost when they were made", ["tenant", "cache"], registry=r)
        self.saved_tokens = Counter("keel_response_cache_saved_tokens", "Their tokens, input and output",
                                    ["tenant", "cache"], registry=r)
        self.served_bytes = Counter("keel_response_cache_served_bytes", "Bytes answered from the cache",
                                    ["tenant", "cache"], registry=r)
        self.stored_bytes = Counter("keel_response_cache_stored_bytes", "Bytes written to the cache", ["tenant"],
                                    registry=r)
        self.evicted_bytes = Counter("keel_response_cache_evicted_bytes", "Bytes evicted to keep the bound",
                                     ["tenant"], registry=r)

    def outcome(self, tenant: str, cache: str, outcome: str, count: int = 1) -> None:
        if count:
            self.requests.labels(tenant, cache, outcome).inc(count)

    def saved(self, tenant: TenantConfig, cache: str, model: str, usage: Usage | None, served: int,
              hits: int = 1) -> float:
        """Count `hits` answered from the cache (`served` bytes) whose upstream calls would have used `usage`."""
        usd = tenant.prices.price(model).cost(usage) if usage is not None else 0.0
        tokens = usage.input + usage.output if usage is not None else 0
        self.saved_usd.labels(tenant.id, cache).inc(usd)
        self.saved_tokens.labels(tenant.id, cache).inc(tokens)
        self.served_bytes.labels(tenant.id, cache).inc(served)
        was = self._unwritten.get((tenant.id, cache), (0, 0.0, 0))
        self._unwritten[(tenant.id, cache)] = (was[0] + hits, was[1] + usd, was[2] + tokens)
        if not self._flushing:
            self._flushing = True
            self.ledger.spawn(self._flush())
        return usd

    async def _flush(self) -> None:
        await asyncio.sleep(FLUSH_SECONDS)
        self._flushing = False
        unwritten, self._unwritten = self._unwritten, {}
        for (tenant, cache), (hits, usd, tokens) in unwritten.items():
            await self.ledger.answered(tenant, cache, hits, usd, tokens)

    def stored(self, tenant: str, written: int, evicted: int) -> None:
        self.stored_bytes.labels(tenant).inc(written)
        self.evicted_bytes.labels(tenant).inc(evicted)
