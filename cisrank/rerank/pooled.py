"""A reranker on every core: one copy in this process and one in each of N - 1 worker processes.

Why: a 135M causal LM on a CPU runs near one core's matmul peak with one thread; a second torch
thread adds about 40%, a second process about 100% (bench/RESULTS.md). `PooledReranker` takes
the same kind, model and options as `load_reranker` and scores each `score_batch` call's pairs on
all copies at once: this process's copy (which also answers what callers ask of the reranker:
its name, model, tokenizer, LM) takes one share, each worker another.

Pairs are dealt by passage, all pairs of one passage to one copy (the reverse CIS estimator runs
a passage's context once for every query that has it), in shares of near-equal characters;
every copy scores the parts of its pairs (`Reranker.score_parts`: what a passage's score owes to
itself, the same in any grouping), the parts come back in input order, and each whole request is
combined here, once (`Reranker.combine`: the hybrid's per-query fusion needs every passage of
its query, which no single copy holds).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from cisrank.rerank.base import CombiningReranker, Part, Request, Reranker
from cisrank.workers import WorkerOptions, WorkerPool, balanced_split, for_device, set_threads


@dataclass(frozen=True)
class RerankerJob:
    """What a worker process loads (`load_reranker(kind, model, **options)`) and runs."""

    kind: str
    model: str | None
    options: dict[str, Any] = field(default_factory=dict)

    def load(self) -> Reranker:
        from cisrank.rerank.registry import load_reranker

        return load_reranker(self.kind, self.model, **self.options)

    def score(self, reranker: Reranker, requests: list[Request]) -> list[list[Part]]:
        return reranker.score_parts(requests)


class PooledReranker(CombiningReranker):
    """`load_reranker(kind, model, **options)` on `workers.count` processes of
    `workers.threads_per_worker` torch threads each (this one included): parts scored on every
    copy, requests combined by this process's copy."""

    def __init__(
        self,
        kind: str,
        model: str | None = None,
        workers: WorkerOptions | None = None,
        **options: Any,
    ) -> None:
        self.workers = workers or WorkerOptions()
        set_threads(self.workers.threads_per_worker)
        self.job = RerankerJob(kind, model, dict(options))
        self.local = self.job.load()
        self.name = self.local.name
        self.model_name = self.local.model_name
        self.keeps_order = self.local.keeps_order
        self.combines_request = self.local.combines_request
        self.passage_major = self.local.passage_major
        # Capabilities: the local copy's (its tokenizer and LM run in this process; its prior
        # store counts the lookups of this process's share only).
        self.fast_tokenizer = self.local.fast_tokenizer
        self.pair_token_limit = self.local.pair_token_limit
        self.causal_lm = self.local.causal_lm
        self.prior_store = self.local.prior_store
        self.compute_type = self.local.compute_type
        self.pool: WorkerPool | None = None
        self._start()

    def _start(self) -> WorkerPool | None:
        """The worker processes (started again after `close`: a server whose lifespan runs
        twice keeps its workers), each loaded before the first batch goes out."""
        extra = self.workers.count - 1
        if self.pool is None and extra > 0:
            self.pool = WorkerPool(self.job, extra, self.workers.threads_per_worker)
            self.pool.warm()
        return self.pool

    def combine(self, query: str, passages: Sequence[str], parts: Sequence[Part]) -> list[float]:
        return self.local.combine(query, passages, parts)

    def score_parts(self, requests: Sequence[Request]) -> list[list[Part]]:
        lists = [(q, list(ps)) for q, ps in requests]
        pool = self._start()
        if pool is None:
            return self.local.score_parts(lists)
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
) -> tuple[list[Request], list[tuple[int, list[int]]]]:
    """One copy's sub-requests (its pairs, grouped by request in input order) and where each
    sub-request's scores go: (request index, passage positions)."""
    by_request: dict[int, list[int]] = {}
    for refs in groups:
        for r, j in refs:
            by_request.setdefault(r, []).append(j)
    where = [(r, sorted(js)) for r, js in sorted(by_request.items())]
    subrequests: list[Request] = [
        (requests[r][0], [requests[r][1][j] for j in js]) for r, js in where
    ]
    return subrequests, where


def load_on_workers(
    kind: str, model: str | None = None, workers: WorkerOptions | None = None, **options: Any
) -> Reranker:
    """`load_reranker(kind, model, **options)` spread over `workers` (a `PooledReranker`), or
    one copy in this process when one worker is asked or the work runs on a GPU (where one
    process already fills the device). The reranker `none` has no model: always one copy."""
    from cisrank.rerank.registry import NO_RERANKER, load_reranker

    workers = for_device(workers or WorkerOptions(), options.get("device"))
    if kind == NO_RERANKER:
        return load_reranker(kind, model, **options)
    if workers.count <= 1:
        set_threads(workers.threads_per_worker)
        return load_reranker(kind, model, **options)
    return PooledReranker(kind, model, workers, **options)
