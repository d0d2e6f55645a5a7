"""Dense reranker throughput and latency on 100 BM25 candidates of real DL19 queries.

Baseline, in the same process on identical inputs: sentence-transformers `encode` with its default
settings (batch 32) and a cosine, the code a user would write by hand. The ratio shows what the
reranker adds or saves over it.

    CISRANK_DATA_DIR=../shared/data .venv/bin/python bench/dense_reranker.py [--queries 5 --repeats 3]
"""

from __future__ import annotations

import argparse
import datetime as dt
import statistics

import numpy as np
from common import dl19_dir, machine, percentile, time_calls, write_result

from cisrank.data.datasets import load_folder
from cisrank.rerank import load_reranker


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="all-MiniLM-L6-v2")
    ap.add_argument("--queries", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=None, help="default: the reranker's")
    args = ap.parse_args()

    ds = load_folder(dl19_dir())
    qids = ds.qids[: args.queries]
    reranker = load_reranker("dense", args.model, batch_size=args.batch_size)
    encoder = reranker.encoder

    def baseline(query: str, passages: list[str]) -> list[float]:
        q = encoder.encode([query], normalize_embeddings=True)
        p = encoder.encode(passages, normalize_embeddings=True)
        return (p @ q[0]).tolist()

    ours, base, max_diff = [], [], 0.0
    for qid in qids:
        query, passages = ds.topics[qid], [h.text for h in ds.candidates[qid][:100]]
        max_diff = max(
            max_diff,
            float(
                np.max(
                    np.abs(np.subtract(reranker.score(query, passages), baseline(query, passages)))
                )
            ),
        )
        ours += time_calls(lambda q=query, p=passages: reranker.score(q, p), args.repeats)
        base += time_calls(lambda q=query, p=passages: baseline(q, p), args.repeats)

    n = 100
    print(
        f"# dense reranker, {args.model}, {len(qids)} DL19 queries x 100 passages x {args.repeats} repeats"
    )
    print(f"machine: {machine()}; date {dt.date.today()}")
    print(f"max |score difference| vs baseline: {max_diff:.2e}")
    for name, times in (
        ("cisrank DenseReranker", ours),
        ("sentence-transformers encode (baseline)", base),
    ):
        print(
            f"{name:42s} p50 {percentile(times, 50) * 1000:8.1f} ms  p90 {percentile(times, 90) * 1000:8.1f} ms"
            f"  {n / statistics.median(times):7.1f} passages/s"
        )
    print(
        f"speed ratio (baseline p50 / ours p50): {statistics.median(base) / statistics.median(ours):.2f}x"
    )
    write_result(
        "dense_reranker",
        {
            "model": args.model,
            "queries": len(qids),
            "passages_per_query": n,
            "repeats": args.repeats,
            "max_abs_score_diff": max_diff,
            "ours_p50_s": percentile(ours, 50),
            "ours_p90_s": percentile(ours, 90),
            "baseline_p50_s": percentile(base, 50),
            "baseline_p90_s": percentile(base, 90),
            "speed_ratio": statistics.median(base) / statistics.median(ours),
        },
    )


if __name__ == "__main__":
    main()
