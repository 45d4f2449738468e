"""Prometheus metrics, one registry per app (no process-global collectors).

With several worker processes (`keel serve --workers N`) each would count only its own requests,
and a scrape reaches one of them at random. There Keel runs prometheus_client's multiprocess
mode: `keel serve` sets PROMETHEUS_MULTIPROC_DIR before the workers start, every worker writes its
values to files there, and whichever worker answers /metrics adds up every worker's (gauges: the
live workers' sum, or minimum for `keel_store_up`).
"""

from __future__ import annotations

import os

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest, multiprocess

from proxy.usage import Usage

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


class Metrics:
    def __init__(self) -> None:
        self.multiprocess = bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("keel_requests", "Requests served", ["tenant", "route", "status"], registry=r)
        self.latency = Histogram(
            "keel_request_seconds", "Time to last byte", ["tenant", "route"], buckets=LATENCY_BUCKETS, registry=r
        )
        self.upstream_status = Counter(
            "keel_upstream_responses", "Upstream responses by status", ["tenant", "status"], registry=r
        )
        self.upstream_errors = Counter(
            "keel_upstream_errors", "Upstream failures before a status", ["tenant", "error"], registry=r
        )
        self.bytes_in = Counter("keel_request_bytes", "Request body bytes from clients", ["tenant"], registry=r)
        self.bytes_out = Counter("keel_response_bytes", "Response body bytes to clients", ["tenant"], registry=r)
        self.streams_open = Gauge("keel_streams_open", "Streaming responses in flight", ["tenant"], registry=r,
                                  multiprocess_mode="livesum")
        self.store_up = Gauge("keel_store_up", "1 while the store answers, 0 while it is bypassed", registry=r,
                              multiprocess_mode="livemin")
        self.breaker_open = Gauge("keel_store_breaker_open", "1 while this process bypasses the store after failed "
                                  "calls (requests pass through), 0 while it uses it", registry=r,
                                  multiprocess_mode="livemax")
        self.planner_failures = Counter(
            "keel_planner_failures", "Planner stages that failed and were skipped", ["tenant", "planner"], registry=r
        )

        self.tools_offered = Counter("keel_tools_offered", "Tools the client sent", ["tenant"], registry=r)
        self.tools_surfaced = Counter("keel_tools_surfaced", "Tools Keel shipped with full schemas", ["tenant"],
                                      registry=r)
        self.tool_tokens_saved = Counter("keel_tool_tokens_saved", "Schema tokens deferred (not sent)", ["tenant"],
                                         registry=r)
        self.tool_gate = Counter("keel_tool_gate_decisions", "Needs-tool gate: ranked tools shipped or withheld",
                                 ["tenant", "decision"], registry=r)
        self.tool_first_shot = Counter("keel_tool_first_shot", "Tools the model called: shipped first-shot (hit) or "
                                       "found by Keel's tool_search first (miss)", ["tenant", "result"], registry=r)
        self.tool_search_rounds = Counter("keel_tool_search_rounds", "tool_search calls Keel answered", ["tenant"],
                                          registry=r)
        self.judgment_seconds = Histogram("keel_judgment_seconds", "Time per judgment", ["tenant", "judgment"],
                                          buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5),
                                          registry=r)
        self.judgment_failures = Counter("keel_judgment_failures", "Judgments that failed or timed out",
                                         ["tenant", "judgment"], registry=r)
        self.prompt_tokens = Counter("keel_prompt_tokens", "Prompt tokens the upstream reported", ["tenant"],
                                     registry=r)
        self.cached_tokens = Counter("keel_cached_tokens", "Prompt tokens served from the provider's cache",
                                     ["tenant"], registry=r)
        self.cache_write_tokens = Counter("keel_cache_write_tokens", "Prompt tokens written to the provider's cache",
                                          ["tenant"], registry=r)
        self.memory_gate = Counter("keel_memory_gate_decisions", "Memory gate outcomes (run, skip, failed)",
                                   ["tenant", "outcome"], registry=r)
        self.memory_gate_audit = Counter("keel_memory_gate_audit", "Skipped turns the memory model ran on anyway: "
                                         "missed (it stored something) or confirmed (it stored nothing)",
                                         ["tenant", "outcome"], registry=r)
        self.memory_model_runs = Counter("keel_memory_model_runs", "Memory model runs by result", ["tenant", "result"],
                                         registry=r)
        self.memory_jobs = Counter("keel_memory_jobs", "Memory jobs by outcome (completed, retried, buried)",
                                   ["tenant", "outcome"], registry=r)
        self.memory_job_delay = Histogram("keel_memory_job_delay_seconds", "From the turn to its memory applied",
                                          ["tenant"], buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300),
                                          registry=r)
        self.worker_loops = Gauge("keel_worker_loops", "Background loops alive and beating (memory jobs)", ["loop"],
                                  registry=r, multiprocess_mode="livesum")
        self.worker_loop_restarts = Counter("keel_worker_loop_restarts", "Background loops restarted, by why: died "
                                            "(ended on an error) or stalled (stopped beating)", ["loop", "reason"],
                                            registry=r)
        self.memory_asks = Counter("keel_memory_asks", "Memory jobs of accepted turns: queued (in the store), "
                                   "spooled (kept in the local spool), replayed (queued from it), duplicate (its "
                                   "message judged already)", ["tenant", "outcome"], registry=r)
        self.memory_spooled = Gauge("keel_memory_spooled", "Memory jobs waiting in this process's spool for the store",
                                    registry=r, multiprocess_mode="livesum")
        self.memory_tokens = Counter("keel_memory_tokens", "Tokens the memory model used", ["tenant"], registry=r)
        self.judgment_cost = Counter("keel_judgment_cost_usd", "What judgments and the memory model cost, priced from "
                                     "the models table (never mixed into responses' usage)", ["tenant", "judgment"],
                                     registry=r)
        self._children: dict[tuple[str, str, int], tuple[Counter, Histogram, Counter, Counter]] = {}

    def observe_request(self, tenant: str, route: str, status: int, seconds: float, bytes_in: int,
                        bytes_out: int) -> None:
        """Count one finished request; label children are cached (a labels() call is not free)."""
        key = (tenant, route, status)
        children = self._children.get(key)
        if children is None:
            children = (self.requests.labels(tenant, route, str(status)), self.latency.labels(tenant, route),
                        self.bytes_in.labels(tenant), self.bytes_out.labels(tenant))
            self._children[key] = children
        requests, latency, b_in, b_out = children
        requests.inc()
        latency.observe(seconds)
        b_in.inc(bytes_in)
        b_out.inc(bytes_out)

    def observe_usage(self, tenant: str, usage: Usage) -> dict[str, str]:
        """Count an upstream usage (any shape, normalized); the `x-keel-cache: cached/input` header for it."""
        self.prompt_tokens.labels(tenant).inc(usage.input)
        self.cached_tokens.labels(tenant).inc(usage.cached)
        self.cache_write_tokens.labels(tenant).inc(usage.cache_write)
        return {"x-keel-cache": f"{usage.cached}/{usage.input}"}

    def render(self) -> bytes:
        if self.multiprocess:  # every worker's values, from the shared directory
            registry = CollectorRegistry()
            multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
            return generate_latest(registry)
        return generate_latest(self.registry)

    def close(self) -> None:
        """This worker is stopping: its live gauges leave the sums."""
        if self.multiprocess:
            multiprocess.mark_process_dead(os.getpid())  # type: ignore[no-untyped-call]
