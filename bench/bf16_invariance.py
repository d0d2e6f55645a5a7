"""How far a pair's bf16 score moves with its batch company and thread count, against what DL21's
rankings tolerate, for the CIS LM, the cross-encoder and the bi-encoder on torch.

On a CPU with native bf16 (AVX512-BF16, AMX), torch's reduced-precision kernels block a matmul by
its shape, so a row's result depends on the rows beside it: a (query, passage) score is then not a
function of the pair. This bench scores the same DL21 pairs several ways and reports, per way, the
largest |score - reference| over every pair, where the reference is the pair scored alone (one
request of one query, one torch thread):

- CIS (SmolLM2-135M-Instruct, reverse, `upr`): bf16 with fixed shapes (the engine's default on a
  CPU: one row a call), one query's request and every query in one call, 1 and 2 threads; bf16
  batched (the engine's length batches, `fixed_shapes=False`), the same company; float32 batched;
- the student cross-encoder and all-MiniLM-L6-v2 on torch bf16: each pair in its query's batch
  of `--depth` against the pair alone.

The tolerance of a ranking is read from DL21 itself: the 5th percentile of the gaps between
neighbours in each query's top 10 by the float32 score. A pair that moves by less leaves at least
95% of the top-10 neighbours in their order. The bench also gives the pairs/s of CIS bf16 fixed,
bf16 batched and float32, interleaved query by query.

    CISRANK_DATA_DIR=../shared/data OMP_NUM_THREADS=1 .venv/bin/python bench/bf16_invariance.py \
        [--queries 8 --depth 20]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Sequence

import numpy as np
from common import cpu_flags, write_result

from cisrank import load_reranker
from cisrank.data.datasets import load_named
from cisrank.jobs.pool import set_threads
from cisrank.rerank.cis import CISReranker

Requests = list[tuple[str, list[str]]]


def gap_bound(reference: Sequence[Sequence[float]], top: int = 10, pct: float = 5.0) -> float:
    """The `pct`th percentile of neighbour gaps in each ranking's top `top`; a gap of exactly 0
    (the same passage text twice among a query's candidates) is a tie no score can break."""
    gaps = []
    for scores in reference:
        s = np.sort(np.asarray(scores, dtype=np.float64))[::-1][:top]
        gaps.extend(g for g in np.abs(np.diff(s)) if g > 0)
    return float(np.percentile(gaps, pct))


def max_move(got: Sequence[Sequence[float]], ref: Sequence[Sequence[float]]) -> float:
    return max(
        float(np.max(np.abs(np.subtract(g, r)))) for g, r in zip(got, ref, strict=True) if len(r)
    )


def per_query(score: Callable[[str, list[str]], list[float]], requests: Requests):
    return [list(score(q, ps)) for q, ps in requests]


def alone(score: Callable[[str, list[str]], list[float]], requests: Requests):
    return [[score(q, [p])[0] for p in ps] for q, ps in requests]


def timed(fn: Callable[[], list[list[float]]]) -> tuple[list[list[float]], float]:
    started = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - started


def cis_rows(model: str, requests: Requests) -> dict[str, dict]:
    bf16 = CISReranker(model, estimator="reverse", reverse_template="upr", dtype="bfloat16")
    fp32 = CISReranker(model, estimator="reverse", reverse_template="upr", dtype="float32")
    assert bf16.engine.fixed_shapes and not fp32.engine.fixed_shapes

    def with_fixed(fixed: bool, fn: Callable[[], list[list[float]]]) -> list[list[float]]:
        bf16.engine.fixed_shapes = fixed
        try:
            return fn()
        finally:
            bf16.engine.fixed_shapes = True

    def one_call() -> list[list[float]]:
        return bf16.score_batch(requests)

    set_threads(1)
    ref = per_query(bf16.score, requests)  # fixed shapes, one query a call, one thread
    seconds = {"bf16 fixed": 0.0, "bf16 batched": 0.0, "float32 batched": 0.0}
    got: dict[str, list[list[float]]] = {k: [] for k in seconds}
    ways = {
        "bf16 fixed": lambda q, ps: bf16.score(q, ps),
        "bf16 batched": lambda q, ps: with_fixed(False, lambda: [bf16.score(q, ps)])[0],
        "float32 batched": lambda q, ps: fp32.score(q, ps),
    }
    names = list(ways)
    for i, (q, ps) in enumerate(requests):  # interleaved, the order rotated query by query
        for name in names[i % 3 :] + names[: i % 3]:
            started = time.perf_counter()
            got[name].append(list(ways[name](q, ps)))
            seconds[name] += time.perf_counter() - started
    rows: dict[str, dict] = {}
    pairs = sum(len(ps) for _, ps in requests)
    for name in names:
        rows[f"CIS {name}, one query a call, 1 thread"] = {
            "max_move": max_move(got[name], ref),
            "pairs_per_s": round(pairs / seconds[name], 3),
        }
    rows["CIS bf16 fixed, every query in one call, 1 thread"] = {
        "max_move": max_move(one_call(), ref)
    }
    rows["CIS bf16 batched, every query in one call, 1 thread"] = {
        "max_move": max_move(with_fixed(False, one_call), ref)
    }
    set_threads(2)
    rows["CIS bf16 fixed, one query a call, 2 threads"] = {
        "max_move": max_move(per_query(bf16.score, requests), ref)
    }
    rows["CIS bf16 fixed, every query in one call, 2 threads"] = {
        "max_move": max_move(one_call(), ref)
    }
    rows["CIS bf16 batched, one query a call, 2 threads"] = {
        "max_move": max_move(with_fixed(False, lambda: per_query(bf16.score, requests)), ref)
    }
    set_threads(1)
    bound = gap_bound(got["float32 batched"])
    for row in rows.values():
        row["bound"] = bound
    return rows


def encoder_rows(kind: str, model: str | None, requests: Requests) -> dict[str, dict]:
    options = {"model": model} if model else {}
    fp32 = load_reranker(kind, backend="torch", dtype="float32", **options)
    bf16 = load_reranker(kind, backend="torch", dtype="bfloat16", **options)
    set_threads(1)
    ref = alone(bf16.score, requests)
    bound = gap_bound(per_query(fp32.score, requests))
    label = model or kind
    rows = {
        f"{label} bf16, in its query's batch, 1 thread": max_move(
            per_query(bf16.score, requests), ref
        ),
        f"{label} float32, in its query's batch, 1 thread": max_move(
            per_query(fp32.score, requests), alone(fp32.score, requests)
        ),
    }
    set_threads(2)
    rows[f"{label} bf16, alone, 2 threads"] = max_move(alone(bf16.score, requests), ref)
    set_threads(1)
    return {k: {"max_move": v, "bound": bound} for k, v in rows.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--dataset", default="trec-dl21")
    p.add_argument("--queries", type=int, default=8)
    p.add_argument("--depth", type=int, default=20)
    p.add_argument("--skip-encoders", action="store_true")
    args = p.parse_args()
    ds = load_named(args.dataset)
    requests = [
        (ds.topics[q], [h.text for h in ds.candidates[q][: args.depth]])
        for q in ds.qids[: args.queries]
    ]
    started = time.perf_counter()
    rows = cis_rows(args.model, requests)
    if not args.skip_encoders:
        rows |= encoder_rows("student", None, requests)
        rows |= encoder_rows("dense", "all-MiniLM-L6-v2", requests)
    print(f"CPU flags: {' '.join(cpu_flags())}")
    print(f"{args.dataset}: {len(requests)} queries x top {args.depth}")
    print("| way | max abs move | DL21 bound (5th pct top-10 gap) | within | pairs/s |")
    print("|---|---|---|---|---|")
    for name, row in rows.items():
        within = "yes" if row["max_move"] <= row["bound"] else "**no**"
        speed = f"{row['pairs_per_s']:.2f}" if "pairs_per_s" in row else ""
        print(f"| {name} | {row['max_move']:.3g} | {row['bound']:.3g} | {within} | {speed} |")
    write_result(
        "bf16_invariance",
        {
            "command": "python bench/bf16_invariance.py "
            + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items()),
            "dataset": args.dataset,
            "queries": len(requests),
            "depth": args.depth,
            "seconds": round(time.perf_counter() - started, 1),
            "rows": rows,
        },
    )


if __name__ == "__main__":
    main()
