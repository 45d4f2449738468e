"""One request's calls to its upstream, as an object the response side holds (`Exchange.send`).

Each call is counted by status (or by error), the provider's own request id is kept for the
access log, and the work that must wait until the upstream accepts the request (a passthrough
key proven, the turn's memory job queued: `Turn.on_accepted`) runs once, on its first 2xx,
before that reply goes any further: a request the upstream refused leaves nothing behind.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping

from proxy.errors import ProxyError
from proxy.metrics import Metrics
from proxy.relay import provider_request_id
from proxy.upstream import Upstream, UpstreamResponse


class Sender:
    def __init__(self, upstream: Upstream, metrics: Metrics, tenant: str, method: str, url: str,
                 headers: Mapping[str, str]) -> None:
        self.upstream, self.metrics, self.tenant = upstream, metrics, tenant
        self.method, self.url, self.headers = method, url, headers
        self.provider_ids: list[str] = []  # the provider's id of each reply, for the access log
        self._accepted: list[Callable[[], Awaitable[None]]] = []

    def when_accepted(self, work: Callable[[], Awaitable[None]]) -> None:
        """Run `work` once the upstream first accepts this request (a 2xx), in the order given."""
        self._accepted.append(work)

    async def __call__(self, content: bytes | None) -> UpstreamResponse:
        try:
            response = await self.upstream.open(self.method, self.url, self.headers, content)
        except ProxyError as exc:
            self.metrics.upstream_errors.labels(self.tenant, exc.code).inc()
            raise
        self.metrics.upstream_status.labels(self.tenant, str(response.status)).inc()
        provider_id = provider_request_id(response)
        if provider_id is not None:
            self.provider_ids.append(provider_id)
        if 200 <= response.status < 300 and self._accepted:
            work, self._accepted = self._accepted, []
            for step in work:
                await step()
        return response
