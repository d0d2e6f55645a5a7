"""A reranker on every core: one copy in this process and one in each of N - 1 worker processes.

Why: a 135M causal LM on a CPU runs near one core's matmul peak with one thread; a second torch
thread adds about 40%, a second process about 100% (bench/RESULTS.md). `PooledReranker` builds
one copy of a reranker spec (`cisrank.rerank.registry.RerankerSpec.build`, which makes one where
more than one process is asked) per process and scores each `score_batch` call's pairs on all
copies at once: this process's copy (which also answers what callers ask of the reranker:
its name, model, tokenizer, LM) takes one share, each worker another.

Pairs are dealt by passage, all pairs of one passage to one copy (the reverse CIS estimator runs
a passage's context once for every query that has it), in shares of near-equal characters;
every copy scores the parts of its pairs (`Reranker.score_parts`: what a passage's score owes to
itself, the same in any grouping), the parts come back in input order, and each whole request is
combined here, once (`Reranker.combine`: the hybrid's per-query fusion needs every passage of
its query, which no single copy holds).

Workers only where they pay (`when_it_pays`, what `cisrank rerank` and `eval` get when no
`--workers` is given). A worker costs its start: a spawned process imports torch and loads the
model before it scores anything (`cisrank rerank` of three passages took 23.8 s on two workers
against 12.0 s on one). It pays when the time the pool saves on the work left exceeds that
start (`PoolCost.pays`): `work_s * (1 - 1 / speedup) > start_s`, with `work_s` the work left at
this process's own rate, measured on the first pairs it scores, `start_s` this process's own
load time of the model (imports included: what a worker repeats) and `speedup` the pool's
measured gain over one process of the same threads per worker (two single-threaded workers
scored DL19 CIS at 4.01 pairs/s against 2.25 for one, 1.78x: each extra worker adds 0.78 of
one). Until then the reranker scores in this process exactly as `--workers 1` does; the work
left counts the pairs the caller says are coming (`expected_chars`), so an evaluation starts its
workers at its first batch.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from cisrank.jobs.pool import WorkerOptions, WorkerPool, balanced_split, set_threads
from cisrank.rerank.base import CombiningReranker, Part, Request, Reranker

log = logging.getLogger(__name__)

EXTRA_WORKER_GAIN = 0.78
"""What each worker beyond this process adds, in units of one single-threaded process: two
workers scored DL19 CIS at 4.01 pairs/s against 2.25 for one thread (bench/RESULTS.md,
`bench/cis_workers.py`)."""
SPAWN_S = 0.5
"""A worker's start beyond this process's model load: spawning Python and unpickling its job."""
PROBE_PAIRS = 8
"""Most pairs scored in this process before the pool is decided on: enough to time, at most a
few seconds of a causal LM's work that the pool would not have taken anyway."""


@dataclass(frozen=True)
class PoolCost:
    """When a pool of workers finishes sooner than this process alone, its start included."""

    start_s: float
    """A worker's start: spawn, imports and model load (the workers start side by side)."""
    extra_worker_gain: float = EXTRA_WORKER_GAIN

    def speedup(self, workers: int) -> float:
        return 1.0 + (workers - 1) * self.extra_worker_gain

    def pays(self, workers: int, work_s: float) -> bool:
        """Whether `workers` processes (this one included) save more than their start on
        `work_s` seconds of this process's work."""
        return workers > 1 and work_s * (1.0 - 1.0 / self.speedup(workers)) > self.start_s


class Buildable(Protocol):
    """What a pool builds each copy from (a `RerankerSpec`, which pickles to every worker):
    `build()` is one copy in the calling process."""

    def build(self) -> Reranker: ...


@dataclass(frozen=True)
class RerankerJob:
    """What a worker process loads (one copy of `spec`) and runs."""

    spec: Buildable

    def load(self) -> Reranker:
        return self.spec.build()

    def score(self, reranker: Reranker, requests: list[Request]) -> list[list[Part]]:
        return reranker.score_parts(requests)


class PooledReranker(CombiningReranker):
    """One copy of `spec` on each of `workers.count` processes of `workers.threads_per_worker`
    torch threads (this one included): parts scored on every copy, requests combined by this
    process's copy. With `when_it_pays`, the workers start only
    once they pay for their start (module docstring); `expected_chars` is the work the caller
    will ask for in all, as characters of (query, passage) pairs."""

    def __init__(
        self,
        spec: Buildable,
        workers: WorkerOptions | None = None,
        *,
        when_it_pays: bool = False,
        expected_chars: float | None = None,
    ) -> None:
        self.workers = workers or WorkerOptions()
        set_threads(self.workers.threads_per_worker)
        self.job = RerankerJob(spec)
        started = time.perf_counter()
        self.local = self.job.load()
        self.cost = PoolCost(time.perf_counter() - started + SPAWN_S)
        self.name = self.local.name
        self.model_name = self.local.model_name
        self.keeps_order = self.local.keeps_order
        self.combines_request = self.local.combines_request
        self.passage_major = self.local.passage_major
        # Capabilities: the local copy's (its tokenizer and LM run in this process; its prior
        # store counts the lookups of this process's share only).
        self.fast_tokenizer = self.local.fast_tokenizer
        self.pair_token_limit = self.local.pair_token_limit
        self.passage_window = self.local.passage_window
        self.causal_lm = self.local.causal_lm
        self.prior_store = self.local.prior_store
        self.passage_cache = self.local.passage_cache  # this process's share, as the store's
        self.compute_type = self.local.compute_type
        self.runtime = self.local.runtime
        self.embedder = self.local.embedder  # embeds in this process (the API's model thread)
        self.processes = self.workers.count
        self.pool: WorkerPool | None = None
        # until the pool pays: this process's own scoring, timed, and the work still expected
        self.deciding = when_it_pays and self.workers.count > 1
        self.expected_chars = expected_chars
        self.warmed = False
        self.done_chars = 0.0  # scored here in all
        self.scored_chars = 0.0  # of which timed, in `scored_s`
        self.scored_s = 0.0
        if not self.deciding:
            self._start()

    def _start(self) -> WorkerPool | None:
        """The worker processes (started again after `close`: a server whose lifespan runs
        twice keeps its workers), each loaded before the first batch goes out."""
        extra = self.workers.count - 1
        if self.pool is None and extra > 0 and not self.deciding:
            self.pool = WorkerPool(self.job, extra, self.workers.threads_per_worker)
            self.pool.warm()
        return self.pool

    def combine(self, query: str, passages: Sequence[str], parts: Sequence[Part]) -> list[float]:
        return self.local.combine(query, passages, parts)

    def score_parts(self, requests: Sequence[Request]) -> list[list[Part]]:
        lists = [(q, list(ps)) for q, ps in requests]
        if self.deciding:
            return self._score_until_it_pays(lists)
        pool = self._start()
        if pool is None:
            return self.local.score_parts(lists)
        return self._deal(lists, pool)

    def _score_until_it_pays(self, lists: list[tuple[str, list[str]]]) -> list[list[Part]]:
        """This call's first pairs in this process, timed; the rest on the workers if they pay
        for their start on the work left, else here too."""
        pairs = [(r, j) for r, (_, ps) in enumerate(lists) for j in range(len(ps))]
        out: list[list[Part]] = [[None] * len(ps) for _, ps in lists]
        if not pairs:
            return out
        first = 0
        if not self.warmed:  # the first pair pays for first-call allocations: not in the rate
            self._score_here(lists, pairs[:1], out, timed=False)
            self.warmed, first = True, 1
        probe = first + max(1, min(PROBE_PAIRS, math.ceil(len(pairs) / 16)))
        self._score_here(lists, pairs[first:probe], out)
        rest = pairs[probe:]
        left = sum(len(lists[r][0]) + len(lists[r][1][j]) for r, j in rest)
        coming = (self.expected_chars or 0.0) - self.done_chars - left
        work_s = self.scored_s / max(self.scored_chars, 1.0) * (left + max(coming, 0.0))
        if rest and self.cost.pays(self.workers.count, work_s):
            log.info(
                "starting %d workers: about %.0f s of work left here, a worker starts in %.1f s",
                self.workers.count - 1,
                work_s,
                self.cost.start_s,
            )
            self.deciding = False
            pool = self._start()
            assert pool is not None
            sub = _subrequests(lists, rest)
            for (r, positions), values in zip(sub[1], self._deal(sub[0], pool), strict=True):
                for j, v in zip(positions, values, strict=True):
                    out[r][j] = v
        elif rest:
            self._score_here(lists, rest, out)
        return out

    def _score_here(
        self,
        lists: list[tuple[str, list[str]]],
        pairs: list[tuple[int, int]],
        out: list[list[Part]],
        timed: bool = True,
    ) -> None:
        """Parts of `pairs` by this process's copy, into `out`, counted in its measured rate
        where `timed`."""
        if not pairs:
            return
        started = time.perf_counter()
        subrequests, where = _subrequests(lists, pairs)
        for (r, positions), values in zip(where, self.local.score_parts(subrequests), strict=True):
            for j, v in zip(positions, values, strict=True):
                out[r][j] = v
        chars = sum(len(lists[r][0]) + len(lists[r][1][j]) for r, j in pairs)
        self.done_chars += chars
        if timed:
            self.scored_s += time.perf_counter() - started
            self.scored_chars += chars

    def _deal(self, lists: list[tuple[str, list[str]]], pool: WorkerPool) -> list[list[Part]]:
        """Parts of every pair, dealt by passage to this copy and the workers."""
        # every (request, position) of one passage text in one group, one group to one copy
        groups: dict[str, list[tuple[int, int]]] = {}
        for r, (_, passages) in enumerate(lists):
            for j, passage in enumerate(passages):
                groups.setdefault(passage, []).append((r, j))
        keys = list(groups)
        costs = [sum(len(lists[r][0]) + len(k) for r, _ in groups[k]) for k in keys]
        shares = balanced_split(costs, self.workers.count)
        plans = [_plan([groups[keys[g]] for g in share], lists) for share in shares]
        busy = [i for i, (subrequests, _) in enumerate(plans) if subrequests]
        futures = {i: pool.submit(plans[i][0]) for i in busy if i > 0}
        results = {0: self.local.score_parts(plans[0][0])} if 0 in busy else {}
        results.update({i: f.result() for i, f in futures.items()})
        out: list[list[Part]] = [[None] * len(ps) for _, ps in lists]
        for i in busy:
            for (r, positions), values in zip(plans[i][1], results[i], strict=True):
                for j, v in zip(positions, values, strict=True):
                    out[r][j] = v
        return out

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()
            self.pool = None

    def __repr__(self) -> str:
        return f"PooledReranker({self.local!r}, workers={self.workers.count})"


def _plan(
    groups: list[list[tuple[int, int]]], requests: list[tuple[str, list[str]]]
) -> tuple[list[tuple[str, list[str]]], list[tuple[int, list[int]]]]:
    """One copy's sub-requests (its pairs, grouped by request in input order) and where each
    sub-request's scores go: (request index, passage positions)."""
    return _subrequests(requests, [ref for refs in groups for ref in refs])


def _subrequests(
    requests: list[tuple[str, list[str]]], pairs: list[tuple[int, int]]
) -> tuple[list[tuple[str, list[str]]], list[tuple[int, list[int]]]]:
    """The sub-requests that hold `pairs` ((request, position) each), grouped by request in
    input order, and where each sub-request's parts go: (request index, passage positions)."""
    by_request: dict[int, list[int]] = {}
    for r, j in pairs:
        by_request.setdefault(r, []).append(j)
    where = [(r, sorted(js)) for r, js in sorted(by_request.items())]
    subrequests = [(requests[r][0], [requests[r][1][j] for j in js]) for r, js in where]
    return subrequests, where
