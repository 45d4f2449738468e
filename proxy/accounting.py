"""Cache accounting: what the upstream says it served from its prompt cache, per request.

Read from a whole JSON body or watched on an SSE stream (the usage chunk), counted per
tenant in /metrics, logged per conversation, and explained when a turn Keel expected to hit
the cache did not.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import orjson

from proxy.conversations import TurnKind
from proxy.metrics import Metrics
from proxy.sse import EventParser
from proxy.turn import Turn

log = logging.getLogger("keel.cache")
MIN_CACHEABLE = 1024  # below this no provider caches anything: a miss is no news


class CacheAccounting:
    def __init__(self, metrics: Metrics, request: Turn) -> None:
        self.metrics = metrics
        self.request = request
        self._parser: EventParser | None = None
        self._usage: Any = None

    def from_body(self, body: bytes) -> Mapping[str, str]:
        try:
            usage = orjson.loads(body).get("usage")
        except (orjson.JSONDecodeError, AttributeError):
            return {}
        return self.record(usage)

    def watch(self, chunk: bytes) -> None:
        """Feed a streamed chunk; the last usage seen is recorded by `finish`."""
        if self._parser is None:
            self._parser = EventParser()
        for event in self._parser.feed(chunk):
            if event.data and b'"usage":{' in event.data:
                data = event.json()
                if isinstance(data, dict) and isinstance(data.get("usage"), dict):
                    self._usage = data["usage"]

    def finish(self) -> None:
        if self._usage is not None:
            self.record(self._usage)
            self._usage = None

    def record(self, usage: Any) -> Mapping[str, str]:
        headers = self.metrics.observe_usage(self.request.tenant.id, usage)
        if not headers:
            return headers
        cached, prompt = (int(v) for v in headers["x-keel-cache"].split("/"))
        location = self.request.location
        fields = {"tenant": self.request.tenant.id, "request_id": self.request.request_id,
                  "conversation": location.conversation if location else None,
                  "segment": location.segment if location else None, "prompt_tokens": prompt, "cached_tokens": cached}
        log.info("cache_usage", extra=fields)
        if location is not None and location.kind is not TurnKind.NEW and cached == 0 and prompt >= MIN_CACHEABLE:
            reasons = [k for k, v in self.request.notes.items() if v] or ["none Keel can see (evicted upstream?)"]
            log.warning("cache_miss", extra={**fields, "reasons": reasons})
        return headers
