"""Prometheus metrics of one app instance: requests, latency, batches, queue depth, prior-store
hits, passage-cache hits.

Each app gets its own `CollectorRegistry` so that several apps in one process (tests) do not
collide. Under `--workers N` each worker process exports its own figures (a scrape sees one of
them); run one worker per host and scale out, or aggregate per pod, when exact totals matter.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from cisrank.rerank.base import Reranker

CLIENT_CLOSED_REQUEST = 499
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048)


def prior_store_stats(reranker: Reranker) -> dict[str, int] | None:
    """`{"hits", "misses"}` of the prior store a reranker declares (CIS caches log p(K)), or
    None where it declares none."""
    store = reranker.prior_store
    if store is None:
        return None
    stats = store.stats()
    return {"hits": int(stats.get("hits", 0)), "misses": int(stats.get("misses", 0))}


class _PriorStoreCollector(Collector):
    """Reads the prior stores at scrape time: the hit rate is always current, never stale."""

    def __init__(self, rerankers: Callable[[], Mapping[str, Reranker]]) -> None:
        self._rerankers = rerankers

    def collect(self) -> Iterable:
        rate = GaugeMetricFamily(
            "cisrank_prior_store_hit_rate",
            "Share of log p(K) lookups answered from the prior store (hits / (hits + misses)).",
            labels=["reranker"],
        )
        hits = CounterMetricFamily(
            "cisrank_prior_store_hits", "Prior-store lookups answered.", labels=["reranker"]
        )
        misses = CounterMetricFamily(
            "cisrank_prior_store_misses", "Prior-store lookups computed.", labels=["reranker"]
        )
        for name, reranker in self._rerankers().items():
            stats = prior_store_stats(reranker)
            if stats is None:
                continue
            total = stats["hits"] + stats["misses"]
            rate.add_metric([name], stats["hits"] / total if total else 0.0)
            hits.add_metric([name], stats["hits"])
            misses.add_metric([name], stats["misses"])
        yield from (rate, hits, misses)


PASSAGE_CACHE_COUNTERS = {
    "hits": "Passage embeddings read from the passage cache.",
    "misses": "Passage embeddings not in the passage cache, so encoded.",
    "evictions": "Passage embeddings evicted from the passage cache to keep its byte budget.",
}
PASSAGE_CACHE_GAUGES = {
    "bytes": "Bytes the passage cache holds (vectors plus a fixed overhead an entry).",
    "entries": "Passage embeddings the passage cache holds.",
    "budget_bytes": "The passage cache's byte budget (passage_cache_mb).",
}


class _PassageCacheCollector(Collector):
    """Reads each served reranker's passage cache (`Reranker.passage_cache`, a bi-encoder's
    embeddings by content) at scrape time, labelled by the reranker's served name."""

    def __init__(self, rerankers: Callable[[], Mapping[str, Reranker]]) -> None:
        self._rerankers = rerankers

    def collect(self) -> Iterable:
        label = ["reranker"]
        rate = GaugeMetricFamily(
            "cisrank_passage_cache_hit_rate",
            "Share of passage embeddings read from the passage cache (hits / (hits + misses)).",
            labels=label,
        )
        counters = {
            k: CounterMetricFamily(f"cisrank_passage_cache_{k}", text, labels=label)
            for k, text in PASSAGE_CACHE_COUNTERS.items()
        }
        gauges = {
            k: GaugeMetricFamily(f"cisrank_passage_cache_{k}", text, labels=label)
            for k, text in PASSAGE_CACHE_GAUGES.items()
        }
        for name, reranker in self._rerankers().items():
            cache = reranker.passage_cache
            if cache is None:
                continue
            stats = cache.stats()
            total = stats["hits"] + stats["misses"]
            rate.add_metric([name], stats["hits"] / total if total else 0.0)
            for k, counter in counters.items():
                counter.add_metric([name], stats[k])
            for k, gauge in gauges.items():
                gauge.add_metric([name], stats[k])
        yield rate
        yield from counters.values()
        yield from gauges.values()


class Metrics:
    """The app's metrics; also the batcher's `BatchObserver`."""

    def __init__(self, rerankers: Callable[[], Mapping[str, Reranker]] | None = None) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "cisrank_requests",
            "HTTP requests by route and status.",
            ["route", "status"],
            registry=r,
        )
        self.latency = Histogram(
            "cisrank_request_latency_seconds",
            "HTTP request latency by route.",
            ["route"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.batch_passages = Histogram(
            "cisrank_batch_passages",
            "Passages per model batch.",
            ["reranker"],
            buckets=_BATCH_BUCKETS,
            registry=r,
        )
        self.batch_requests = Histogram(
            "cisrank_batch_requests",
            "Requests sharing one model batch.",
            ["reranker"],
            buckets=_BATCH_BUCKETS,
            registry=r,
        )
        self.batch_seconds = Histogram(
            "cisrank_batch_seconds",
            "Model time per batch.",
            ["reranker"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.queue_depth = Gauge(
            "cisrank_queue_depth",
            "Requests accepted and not yet answered, per reranker.",
            ["reranker"],
            registry=r,
        )
        self.client_aborts = Counter(
            "cisrank_client_aborts",
            "Requests whose client hung up before the server answered (also counted in "
            "cisrank_requests with status 499): client behaviour, not a server error.",
            ["route"],
            registry=r,
        )
        self.passages = Counter(
            "cisrank_scored_passages", "Passages scored.", ["reranker"], registry=r
        )
        if rerankers is not None:
            r.register(_PriorStoreCollector(rerankers))
            r.register(_PassageCacheCollector(rerankers))

    def observe_request(self, route: str, status: int, seconds: float) -> None:
        self.requests.labels(route, str(status)).inc()
        self.latency.labels(route).observe(seconds)

    def observe_client_abort(self, route: str, seconds: float) -> None:
        """A request its client abandoned before any answer: status 499 (nginx's "client closed
        request"), apart from the 5xx of server errors."""
        self.client_aborts.labels(route).inc()
        self.observe_request(route, CLIENT_CLOSED_REQUEST, seconds)

    def observe_batch(self, reranker: str, passages: int, requests: int, seconds: float) -> None:
        self.batch_passages.labels(reranker).observe(passages)
        self.batch_requests.labels(reranker).observe(requests)
        self.batch_seconds.labels(reranker).observe(seconds)
        self.passages.labels(reranker).inc(passages)

    def set_queue_depth(self, reranker: str, depth: int) -> None:
        self.queue_depth.labels(reranker).set(depth)

    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
