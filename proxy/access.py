"""The access log line and the request metrics of one request, written once its response is
complete (the `relay.Writer` reports to it): status, latency, bytes both ways, the error if
any, and Keel's id beside the provider's id of each upstream call (filled as they come)."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass

from proxy.metrics import Metrics
from proxy.relay import Outcome

log = logging.getLogger("keel.access")


@dataclass(frozen=True)
class AccessReport:
    metrics: Metrics
    tenant: str  # "-" before the caller is known
    route: str
    method: str
    path: str
    request_id: str
    started: float  # time.perf_counter() when the request arrived
    bytes_in: int
    upstream_ids: Sequence[str] = ()  # the provider's ids, appended as its replies come

    def __call__(self, outcome: Outcome) -> None:
        elapsed = time.perf_counter() - self.started
        self.metrics.observe_request(self.tenant, self.route, outcome.status, elapsed, self.bytes_in,
                                     outcome.bytes_out)
        if log.isEnabledFor(logging.INFO):
            log.info("request", extra={
                "request_id": self.request_id, "upstream_request_ids": list(self.upstream_ids),
                "tenant": self.tenant, "method": self.method, "path": self.path, "status": outcome.status,
                "latency_ms": round(elapsed * 1000, 2), "bytes_in": self.bytes_in, "bytes_out": outcome.bytes_out,
                "error": outcome.error,
            })
