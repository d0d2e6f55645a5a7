"""The floor under a CIS evaluation: the model FLOPs of every pair, against this CPU's matmul peak.

The target is DL19 at depth 100 (reverse estimator, SmolLM2-135M) in 12 minutes on two cores.
Whether any float32 engine can get there is arithmetic, not tuning: count the matmul FLOPs of
exactly the rows the engine runs (BOS, the UPR template around the passage cut to `max_doc_tokens`,
the query; the LM head at the query's positions only, as `reverse_batch` does), divide by the
attainable float32 matmul rate, and compare with the wall time of a real run.

    CISRANK_DATA_DIR=../shared/data .venv/bin/python bench/cis_floor.py \
        --model smollm2-135m-instruct --dataset trec-dl19 --depth 100 \
        [--peak-gflops 225.7] [--wall-seconds 1129]

Without `--peak-gflops` the peak is measured here (best of 2048^3 matmuls at the current torch
thread count): run it on a quiet machine. `--wall-seconds` turns a run's wall time into its model
FLOP utilization.
"""

from __future__ import annotations

import argparse
import sys

import torch
from cis_engine import FlopCounter, matmul_peak_flops
from common import machine, report

from cisrank.data.datasets import load_named
from cisrank.models.resolve import resolve_model
from cisrank.rerank.registry import load_reranker


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--dataset", default="trec-dl19")
    ap.add_argument("--depth", type=int, default=100)
    ap.add_argument("--template", default="upr")
    ap.add_argument("--peak-gflops", type=float, default=None)
    ap.add_argument("--wall-seconds", type=float, default=None)
    args = ap.parse_args(argv)

    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(resolve_model(args.model))
    reranker = load_reranker(
        "cis", args.model, estimator="reverse", reverse_template=args.template, backend="torch"
    )
    max_doc = reranker.config.max_doc_tokens
    ds = load_named(args.dataset)
    requests = [
        (ds.topics[qid], [h.text for h in ds.candidates[qid][: args.depth]]) for qid in ds.qids
    ]
    flops = FlopCounter(config)
    total = tokens = pairs = 0.0
    for context, target in reranker.reverse_spans(requests):  # the rows reverse_batch scores
        total += flops.forward(len(context) + len(target), 0, len(target))
        tokens += len(context) + len(target)
        pairs += 1
    peak = (
        args.peak_gflops * 1e9
        if args.peak_gflops
        else matmul_peak_flops(torch.device("cpu"), torch.float32)
    )
    result = {
        "model": args.model,
        "dataset": args.dataset,
        "depth": args.depth,
        "template": args.template,
        "max_doc_tokens": max_doc,
        "pairs": int(pairs),
        "tokens": int(tokens),
        "mean_tokens_per_pair": round(tokens / pairs, 1),
        "model_gflop": round(total / 1e9, 1),
        "peak_gflops": round(peak / 1e9, 1),
        "peak_measured_here": args.peak_gflops is None,
        "minutes_at_100pct_of_peak": round(total / peak / 60, 2),
        "minutes_at_76pct_of_peak": round(total / (0.76 * peak) / 60, 2),
        "machine": machine(),
    }
    if args.wall_seconds:
        result["wall_seconds"] = args.wall_seconds
        result["mfu_of_that_run"] = round(total / args.wall_seconds / peak, 3)
    report(f"cis_floor_{args.model}_{args.dataset}_d{args.depth}", result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
