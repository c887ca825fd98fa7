"""Prometheus metrics of a node, built with ``prometheus_client`` (docs/metrics.md lists each).

Two sources, nothing sprinkled through meshd/node: ``RequestMetrics.observe`` is an observer of
the entry chain, called once at the end of every request (control socket or HTTP) with its final
stats; ``NodeCollector`` reads ``node.status()`` and the peer table at scrape time (peers,
gossip, forwards, busy answers, attestation, queues, engine speed). Each node has its own
registry, so two nodes in one process (tests) do not collide.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from meshd.api.protocols import TelemetrySource

log = logging.getLogger(__name__)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
TTFT_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
ITL_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
DURATION_BUCKETS_S = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)


class RequestMetrics:
    """Per-request metrics, fed by the entry chain's observer hook and the HTTP app."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter(
            "meshd_requests", "Requests this node took in as entry node, by outcome ('ok' or the "
            "error code), routing strategy and origin ('control' or 'http')",
            ["outcome", "strategy", "origin"], registry=registry)
        self.ttft = Histogram(
            "meshd_time_to_first_token_seconds", "Time from taking a request in to its first "
            "token reaching this entry node", ["origin"], buckets=TTFT_BUCKETS_S,
            registry=registry)
        self.itl = Histogram(
            "meshd_inter_token_latency_seconds", "Mean gap between consecutive tokens of each "
            "request (one sample per request of two tokens or more)", ["origin"],
            buckets=ITL_BUCKETS_S, registry=registry)
        self.duration = Histogram(
            "meshd_request_duration_seconds", "Time from taking a request in to its last token",
            ["origin"], buckets=DURATION_BUCKETS_S, registry=registry)
        self.generated = Counter(
            "meshd_generated_tokens", "Tokens generated for requests that entered here",
            ["origin"], registry=registry)
        self.prompt = Counter(
            "meshd_prompt_tokens", "Prompt tokens of requests that entered here", ["origin"],
            registry=registry)
        self.failovers = Counter(
            "meshd_failovers", "Requests moved to another node after their node failed, went "
            "away or answered busy (retries of the entry node)", registry=registry)
        self.hedges = Counter(
            "meshd_hedges_fired", "Hedged attempts started because the first token was late",
            registry=registry)
        self.hedges_won = Counter(
            "meshd_hedges_won", "Hedged attempts whose node served the request", registry=registry)
        self.cached = Counter(
            "meshd_cached_answers", "Requests answered from the answer cache", registry=registry)
        self.http = Counter(
            "meshd_http_responses", "HTTP API responses by endpoint and status code",
            ["endpoint", "status"], registry=registry)
        self.http_streams = Gauge(
            "meshd_http_requests_in_progress", "HTTP API requests being answered now",
            registry=registry)
        self.disconnects = Counter(
            "meshd_http_client_disconnects", "HTTP API requests whose client went away before "
            "the answer ended (the request was cancelled across the mesh)", registry=registry)

    def observe(self, stats: Mapping[str, Any]) -> None:
        """The entry chain's observer: never raises (a metric must not fail a request)."""
        try:
            self._observe(stats)
        except Exception:
            log.exception("request metrics failed")

    def _observe(self, s: Mapping[str, Any]) -> None:
        origin = str(s.get("origin") or "control")
        self.requests.labels(str(s.get("outcome") or "ok"), str(s.get("strategy") or ""),
                             origin).inc()
        if s.get("outcome", "ok") != "ok":
            return
        ttft_ms = s.get("ttft_ms")
        if isinstance(ttft_ms, int | float):
            self.ttft.labels(origin).observe(ttft_ms / 1000.0)
        n = int(s.get("completion_tokens", s.get("tokens")) or 0)
        total_ms = s.get("total_ms")
        if isinstance(total_ms, int | float):
            self.duration.labels(origin).observe(total_ms / 1000.0)
            if isinstance(ttft_ms, int | float) and n > 1 and total_ms >= ttft_ms:
                self.itl.labels(origin).observe((total_ms - ttft_ms) / 1000.0 / (n - 1))
        self.generated.labels(origin).inc(n)
        self.prompt.labels(origin).inc(int(s.get("prompt_tokens") or 0))
        self.failovers.inc(int(s.get("retries") or 0))
        self.hedges.inc(int(s.get("hedges") or 0))
        if s.get("hedge_won"):
            self.hedges_won.inc()
        if s.get("cached"):
            self.cached.inc()


def _num(d: Any, *path: str) -> float | None:
    for key in path:
        if not isinstance(d, Mapping):
            return None
        d = d.get(key)
    return float(d) if isinstance(d, int | float) and not isinstance(d, bool) else None


class NodeCollector(Collector):
    """Reads the node's status and peer table at each scrape."""

    def __init__(self, source: TelemetrySource) -> None:
        self.source = source

    def describe(self) -> list[Metric]:
        return []  # collected fresh at each scrape; no describe-time status read

    def collect(self) -> Iterator[Metric]:
        try:
            status = self.source.status()
            peers = self.source.peers_listing()
        except Exception:
            log.exception("status for metrics failed")
            return
        yield from self._node(status)
        yield from self._models(status)
        yield from self._peers(peers)
        yield from self._gossip(status)
        yield from self._attestation(status)
        yield from self._upstreams(status)
        yield from self._cache(status)

    def _node(self, st: Mapping[str, Any]) -> Iterator[Metric]:
        svc = st.get("services") or {}
        node = svc.get("node") or {}
        up = GaugeMetricFamily("meshd_uptime_seconds", "Seconds since the daemon started")
        up.add_metric([], _num(st, "uptime_s") or 0.0)
        yield up
        fw = CounterMetricFamily("meshd_forwards", "Request attempts this entry node sent to a "
                                 "peer to serve")
        fw.add_metric([], _num(node, "requests_forwarded") or 0.0)
        yield fw
        loc = CounterMetricFamily("meshd_local_attempts", "Request attempts this entry node "
                                  "served itself")
        loc.add_metric([], _num(node, "requests_local") or 0.0)
        yield loc
        stalls = CounterMetricFamily("meshd_peer_stalls", "Peers found stalled (a ping "
                                     "unanswered) and dropped")
        stalls.add_metric([], _num(svc, "links", "stalls") or 0.0)
        yield stalls

    def _models(self, st: Mapping[str, Any]) -> Iterator[Metric]:
        queue = GaugeMetricFamily("meshd_queue_depth", "Requests waiting for a slot, by model",
                                  labels=["model"])
        running = GaugeMetricFamily("meshd_in_flight", "Requests generating now, by model",
                                    labels=["model"])
        served = CounterMetricFamily("meshd_served", "Requests this node served (as the "
                                     "serving node), by model", labels=["model"])
        failed = CounterMetricFamily("meshd_serve_failures", "Requests this node failed while "
                                     "serving them, by model", labels=["model"])
        busy = CounterMetricFamily("meshd_busy_answers", "Requests this node refused as busy, by "
                                   "model and reason: queue_full, or wait_bound (it could not "
                                   "start within the wait the entry node allowed)",
                                   labels=["model", "reason"])
        step = GaugeMetricFamily("meshd_engine_decode_step_seconds", "Measured time of one "
                                 "decode step of a request (1 / decode rate), by model",
                                 labels=["model"])
        prefill = GaugeMetricFamily("meshd_engine_prefill_token_seconds", "Measured prompt "
                                    "processing time per prompt token (1 / prefill rate), by "
                                    "model", labels=["model"])
        for m in st.get("models") or []:
            name = str(m.get("model"))
            queue.add_metric([name], _num(m, "queue_depth") or 0.0)
            running.add_metric([name], _num(m, "in_flight") or 0.0)
            served.add_metric([name], _num(m, "served") or 0.0)
            failed.add_metric([name], _num(m, "failed") or 0.0)
            busy.add_metric([name, "queue_full"], _num(m, "busy_refusals") or 0.0)
            busy.add_metric([name, "wait_bound"], _num(m, "wait_refusals") or 0.0)
            tps = _num(m, "decode_tps")
            if tps:
                step.add_metric([name], 1.0 / tps)
            ptps = _num(m, "prefill_tps")
            if ptps:
                prefill.add_metric([name], 1.0 / ptps)
        yield from (queue, running, served, failed, busy, step, prefill)

    def _peers(self, peers: list[dict[str, Any]]) -> Iterator[Metric]:
        by_state = {"live": 0, "stalled": 0}
        age = GaugeMetricFamily("meshd_advert_age_seconds", "Age of the latest advert heard "
                                "from each peer", labels=["peer"])
        for p in peers:
            by_state["stalled" if p.get("stalled") else "live"] += 1
            a = _num(p, "advert_age_s")
            if a is not None:
                age.add_metric([str(p.get("name"))], a)
        g = GaugeMetricFamily("meshd_peers", "Peers in the peer table, by state", labels=["state"])
        for state, n in by_state.items():
            g.add_metric([state], n)
        yield g
        yield age

    def _gossip(self, st: Mapping[str, Any]) -> Iterator[Metric]:
        svc = st.get("services") or {}
        node = svc.get("node") or {}
        out = CounterMetricFamily("meshd_gossip_messages_out", "Gossip messages this node "
                                  "published (its adverts)")
        out.add_metric([], _num(node, "adverts_published") or 0.0)
        yield out
        received = CounterMetricFamily("meshd_gossip_messages_in", "Adverts heard by gossip or "
                                       "handed over by a new link, by result",
                                       labels=["result"])
        received.add_metric(["accepted"], _num(node, "adverts_accepted") or 0.0)
        received.add_metric(["rejected"], _num(node, "adverts_rejected") or 0.0)
        yield received
        rej = CounterMetricFamily("meshd_gossip_rejected", "Gossip messages rejected, by reason",
                                  labels=["reason"])
        for reason, n in sorted((svc.get("advert_rejections") or {}).items()):
            if isinstance(n, int | float):
                rej.add_metric([str(reason)], n)
        yield rej

    def _attestation(self, st: Mapping[str, Any]) -> Iterator[Metric]:
        att = (st.get("services") or {}).get("attestation") or {}
        fail = CounterMetricFamily("meshd_attestation_failures", "Connections refused because "
                                   "the peer failed attestation, by reason", labels=["reason"])
        for reason, n in sorted((att.get("rejected_by_reason") or {}).items()):
            if isinstance(n, int | float):
                fail.add_metric([str(reason)], n)
        yield fail
        peers = GaugeMetricFamily("meshd_attested_peers", "Peers attested on a live connection")
        peers.add_metric([], _num(att, "attested_peers") or 0.0)
        yield peers


    def _upstreams(self, st: Mapping[str, Any]) -> Iterator[Metric]:
        ups = (st.get("services") or {}).get("upstreams") or {}
        calls = CounterMetricFamily("meshd_upstream_requests", "Calls to the OpenAI-compatible "
                                    "server behind each upstream model", labels=["model"])
        errors = CounterMetricFamily("meshd_upstream_errors", "Failed upstream calls, by model "
                                     "and meshd error code (peer_gone: unreachable, reset, 5xx "
                                     "or stalled; busy: 429; others: the request was refused)",
                                     labels=["model", "code"])
        running = GaugeMetricFamily("meshd_upstream_in_flight", "Upstream calls in progress",
                                    labels=["model"])
        for name, u in sorted(ups.items()):
            calls.add_metric([name], _num(u, "requests") or 0.0)
            running.add_metric([name], _num(u, "in_flight") or 0.0)
            for code, n in sorted((u.get("errors_by_kind") or {}).items()):
                errors.add_metric([name, str(code)], n)
        yield from (calls, errors, running)


    def _cache(self, st: Mapping[str, Any]) -> Iterator[Metric]:
        c = (st.get("services") or {}).get("cache") or {}
        looked = CounterMetricFamily("meshd_cache_lookups", "Lookups of the entry node's answer "
                                     "cache, by result: exact (a repeat), semantic (a question "
                                     "meaning the same, within the error bound), refused (a "
                                     "candidate the bound did not let through), miss",
                                     labels=["result"])
        for result, key in (("exact", "exact_hits"), ("semantic", "semantic_hits"),
                            ("refused", "refused"), ("miss", "misses")):
            looked.add_metric([result], _num(c, key) or 0.0)
        yield looked
        fb = CounterMetricFamily("meshd_cache_feedback", "Feedback on answers the cache served "
                                 "or kept, by verdict (wrong: the entry was removed)",
                                 labels=["verdict"])
        fb.add_metric(["wrong"], _num(c, "feedback_wrong") or 0.0)
        fb.add_metric(["right"], _num(c, "feedback_right") or 0.0)
        yield fb
        entries = GaugeMetricFamily("meshd_cache_entries", "Answers in the entry node's cache")
        entries.add_metric([], _num(c, "entries") or 0.0)
        yield entries


class Metrics:
    """A node's registry: request metrics plus the status collector."""

    def __init__(self, source: TelemetrySource | None) -> None:
        disable_created_metrics()  # type: ignore[no-untyped-call]  # no *_created series (process-wide; they only add noise)
        self.registry = CollectorRegistry(auto_describe=False)
        self.requests = RequestMetrics(self.registry)
        if source is not None:
            self.registry.register(NodeCollector(source))

    def render(self) -> bytes:
        return generate_latest(self.registry)
