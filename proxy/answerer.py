"""A parsed turn planned, sent, and its answer relayed or made: the part of one request after
ingress (`app.Keel.forward` hands it the parsed turn, its `Sender` and its `Writer`).

Planning goes through the pipeline (a passthrough key the provider has not accepted yet is
planned from the request alone); what waits for the upstream's acceptance is registered on the
sender; a planned body Keel cannot write goes as the client sent it; a turn placed in a
conversation is metered (savings) and accounted (cache usage, proofs); a planner's responder
answers when there is one, guarded: one that fails before answering leaves the turn to the
client's own request.
"""

from __future__ import annotations

import logging
from functools import partial

from starlette.responses import Response

from proxy.accounting import CacheAccounting
from proxy.callers import ProvenCallers
from proxy.errors import ProxyError
from proxy.metrics import Metrics
from proxy.pipeline import Pipeline
from proxy.proofs import Proofs
from proxy.relay import Writer
from proxy.savings.meter import TRACE, Meter, Trace
from proxy.sender import Sender
from proxy.turn import Exchange, Turn

log = logging.getLogger("keel.access")


class Answerer:
    def __init__(self, pipeline: Pipeline, callers: ProvenCallers, meter: Meter | None, metrics: Metrics,
                 proofs: Proofs, log_bodies: bool = False) -> None:
        self.pipeline, self.callers, self.meter, self.metrics = pipeline, callers, meter, metrics
        self.proofs, self.log_bodies = proofs, log_bodies

    async def answer(self, parsed: Turn, raw: bytes, send: Sender, writer: Writer) -> Response:
        tenant = parsed.tenant
        if self.log_bodies and log.isEnabledFor(logging.DEBUG):
            log.debug("request_body", extra={"request_id": writer.request_id, "body": raw[:16384].decode(errors="replace")})
        trace = Trace()
        TRACE.set(trace)  # this request's task only: the rankers report their scores to it
        unproven = tenant.auth.passthrough and not await self.callers.known(tenant.id, parsed.scope)
        if unproven:  # a key the provider has not accepted yet: planned from the request alone, nothing stored
            send.when_accepted(partial(self.callers.prove, tenant.id, parsed.scope))
        planned = await self.pipeline.run(parsed, stateless=unproven)
        trace.planning = False
        for step in planned.on_accepted:  # nothing a refused turn asked for is kept (a memory job, a model run)
            send.when_accepted(self.pipeline.guarded("accepted", planned, step))
        content = await self.pipeline.guard("encode", planned, _encoded(planned, parsed))
        if content is None:  # a body Keel could not write back: the client's own
            planned, content = parsed, raw
        account = None
        if planned.location is not None:
            planned = planned.with_headers(**{"x-keel-conversation": planned.location.conversation})
            meter = self.meter.turn(parsed, planned, trace) if self.meter is not None else None
            account = CacheAccounting(self.metrics, planned, meter, self.proofs)
            if meter is not None:
                writer.then(meter.ended)
        if planned.responder is not None:
            return await self.respond(planned, Exchange(send, writer, content, raw, account))
        return await writer.relay(await send(content), planned.response_headers, account, parsed.stream)

    async def respond(self, planned: Turn, exchange: Exchange) -> Response:
        """A planner's responder, guarded like every stage: one that fails before it has answered
        leaves the turn to the client's own request, relayed as usual."""
        assert planned.responder is not None
        try:
            return await planned.responder.respond(planned, exchange)
        except ProxyError:
            raise
        except Exception as exc:
            log.warning("responder_failed", exc_info=exc, extra={"tenant": planned.tenant.id,
                                                                  "request_id": planned.request_id})
            self.metrics.planner_failures.labels(planned.tenant.id, "responder").inc()
            return await exchange.writer.relay(await exchange.send(exchange.client_raw))


async def _encoded(planned: Turn, parsed: Turn) -> bytes:
    return planned.encoded(parsed)
