"""A worker per core against one process with two threads, for the CIS reranker, in one run.

The workers' bar: the default (`--workers` = cores, one torch thread each) against
`--workers 1 --threads-per-worker 2` (the behaviour before workers), with identical scores. Both
rerankers are loaded once, as `cisrank eval` loads them (`RerankerSpec.build`), and score the same
DL19 queries' BM25 top `--depth`, alternating which goes first query by query so that load from
other processes hits both alike. The torch thread count of this process is set before each call (the
pooled reranker's own copy runs one thread, the single one two).

    CISRANK_DATA_DIR=../shared/data .venv/bin/python bench/cis_workers.py \
        --model smollm2-135m-instruct [--queries 10 --depth 100]
"""

from __future__ import annotations

import argparse
import sys

from common import interleaved, machine, report

from cisrank.data.datasets import load_named
from cisrank.jobs.pool import WorkerOptions, cores, set_threads
from cisrank.rerank.registry import RerankerSpec


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--dataset", default="trec-dl19")
    ap.add_argument("--queries", type=int, default=10)
    ap.add_argument("--depth", type=int, default=100)
    args = ap.parse_args(argv)

    n = cores()
    options = {"estimator": "reverse", "reverse_template": "upr", "backend": "torch"}
    setups = {
        f"{n} workers x 1 thread (default)": (WorkerOptions(workers=n, threads_per_worker=1), 1),
        f"1 worker x {n} threads": (WorkerOptions(workers=1, threads_per_worker=n), n),
    }
    rerankers = {}
    for name, (workers, threads) in setups.items():
        set_threads(threads)
        spec = RerankerSpec(kind="cis", model=args.model, options=options)
        rerankers[name] = (spec.build(workers), threads)

    ds = load_named(args.dataset)
    qids = ds.qids[: args.queries]
    seconds, scores = interleaved(rerankers, ds, qids, args.depth)
    names = list(rerankers)
    for reranker, _ in rerankers.values():
        if hasattr(reranker, "close"):
            reranker.close()

    pairs = len(scores[names[0]])
    diff = max(abs(a - b) for a, b in zip(scores[names[0]], scores[names[1]], strict=True))
    result = {
        "model": args.model,
        "dataset": args.dataset,
        "queries": len(qids),
        "depth": args.depth,
        "pairs": pairs,
        "seconds": {k: round(v, 1) for k, v in seconds.items()},
        "pairs_per_second": {k: round(pairs / v, 2) for k, v in seconds.items()},
        "speedup_of_default": round(seconds[names[1]] / seconds[names[0]], 3),
        "max_abs_score_diff": diff,
        "machine": machine(),
    }
    report(f"cis_workers_{args.model}_{args.dataset}", result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
