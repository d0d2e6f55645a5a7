"""LM backends and compute types against the torch engine, interleaved, on one set of real pairs.

Every backend scores the same (query, passage) pairs with the reverse CIS estimator (UPR
template, the configuration reported on DL19), one query at a time, in a rotating order so that
a change of machine load hits every backend alike. Per backend: pairs/s and the speedup over
torch float32 (same threads), the largest score difference from torch float32, and, with qrels,
nDCG@10 of its ranking with a paired randomization test against torch float32 (the bar
for adopting an int8 type: within 0.01 on DL21, p > 0.05).

    python bench/lm_backends.py --model smollm2-135m-instruct --dataset trec-dl21 --depth 20
    python bench/lm_backends.py --model smollm2-135m-instruct --queries 4 --depth 20   # speed only

Prints the CPU flags that decide int8 speed (avx2, avx512*, vnni) and writes
bench/results/lm_backends[_NAME].json.
"""

from __future__ import annotations

import argparse
import itertools
import time
from pathlib import Path

import numpy as np
from common import cpu_flags, write_result

from cisrank.data.datasets import load_named
from cisrank.data.runs import Run
from cisrank.eval import metrics as M
from cisrank.jobs.pool import set_threads
from cisrank.lm.backends import load_engine
from cisrank.rerank.cis import CISReranker

DEFAULT = (
    "torch:float32",
    "onnx:float32",
    "onnx:int8",
    "ctranslate2:float32",
    "ctranslate2:int8_float32",
    "ctranslate2:int8",
)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--dataset", default="trec-dl21")
    p.add_argument("--depth", type=int, default=20)
    p.add_argument("--queries", type=int, default=None, help="first N judged queries (all)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--backends", default=",".join(DEFAULT))
    p.add_argument("--name", default="")
    p.add_argument(
        "--runs",
        type=Path,
        default=None,
        help="also write each backend's TREC run here (NAME.trec)",
    )
    args = p.parse_args()

    set_threads(args.threads)
    ds = load_named(args.dataset)
    qids = ds.qids[: args.queries] if args.queries else ds.qids
    requests = {q: (ds.topics[q], [h.text for h in ds.candidates[q][: args.depth]]) for q in qids}
    pairs = sum(len(ps) for _, ps in requests.values())
    names = args.backends.split(",")
    rerankers = {}
    for name in names:
        backend, dtype = name.split(":")
        started = time.perf_counter()
        engine = load_engine(args.model, backend=backend, dtype=dtype, threads=args.threads)
        rerankers[name] = CISReranker(args.model, engine=engine, estimator="reverse")
        print(f"loaded {name} in {time.perf_counter() - started:.1f} s", flush=True)
    seconds = dict.fromkeys(names, 0.0)
    scores: dict[str, dict[str, list[float]]] = {n: {} for n in names}
    order = itertools.cycle(range(len(names)))
    for i, q in enumerate(qids):
        first = next(order)
        for name in names[first:] + names[:first]:
            started = time.perf_counter()
            scores[name][q] = rerankers[name].score(*requests[q])
            seconds[name] += time.perf_counter() - started
        print(f"query {i + 1}/{len(qids)}", flush=True)

    base = names[0]
    out: dict[str, dict] = {}
    per_query: dict[str, dict[str, float]] = {}
    judged = bool(ds.qrels)
    qrels = {q: ds.qrels[q] for q in qids if q in ds.qrels}
    for name in names:
        diff = max(
            float(np.max(np.abs(np.subtract(scores[name][q], scores[base][q])))) for q in qids
        )
        row = {
            "pairs": pairs,
            "seconds": round(seconds[name], 2),
            "pairs_per_s": round(pairs / seconds[name], 3),
            "speedup": round(seconds[base] / seconds[name], 3),
            "max_abs_diff": diff,
        }
        if judged:
            ranked = {
                q: list(
                    zip(
                        [h.docid for h in ds.candidates[q][: args.depth]],
                        scores[name][q],
                        strict=True,
                    )
                )
                for q in qids
            }
            run = Run.from_scores(name, ranked)
            if args.runs is not None:
                run.write_trec(args.runs / f"{name.replace(':', '-')}.trec")
            per_query[name] = M.per_query(run, qrels, ["nDCG@10"])["nDCG@10"]
            row["nDCG@10"] = round(float(np.mean(list(per_query[name].values()))), 4)
        out[name] = row
    for name in names[1:] if judged else []:
        test = M.paired_test(per_query[base], per_query[name])
        out[name]["delta_nDCG@10"] = round(float(test["mean_delta"]), 4)
        out[name]["p_randomization"] = float(test["p_randomization"])
    print(f"\nCPU flags: {' '.join(cpu_flags())}")  # write_result records them (machine_info)
    print(
        f"{args.dataset}, {len(qids)} queries x top {args.depth} = {pairs} pairs, {args.threads} thread(s), interleaved"
    )
    head = "| backend:compute | pairs/s | speedup | max abs diff |"
    head += " nDCG@10 | delta | p |" if judged else ""
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    for name, row in out.items():
        line = f"| {name} | {row['pairs_per_s']:.2f} | {row['speedup']:.2f}x "
        line += f"| {row['max_abs_diff']:.2g} |"
        if judged:
            line += f" {row['nDCG@10']:.4f} | {row.get('delta_nDCG@10', 0.0):+.4f} "
            line += f"| {row.get('p_randomization', 1.0):.3g} |"
        print(line)
    suffix = f"_{args.name}" if args.name else ""
    write_result(
        f"lm_backends{suffix}",
        {
            "command": "python bench/lm_backends.py "
            + " ".join(
                f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if v not in (None, "")
            ),
            "dataset": args.dataset,
            "queries": len(qids),
            "depth": args.depth,
            "threads": args.threads,
            "backends": out,
        },
    )


if __name__ == "__main__":
    main()
