"""The dense reranker on each runtime (all-MiniLM-L6-v2, or `--model`) over DL19's BM25 top 100.

Each (backend, dtype) of the runtime table's feature-extraction task reranks the same queries'
top `--depth` candidates, the order of the runtimes rotated query by query (`interleaved`) so
that load from other processes hits every one alike:

- torch float32: sentence-transformers' `encode`, the default and the reference of every ratio;
- torch bfloat16 under autocast (what `--dtype bfloat16` runs), and with bf16 weights (the
  other way to compute bf16, kept here to show why autocast was chosen);
- onnx float32 and onnx int8: the model's module stack exported once (into the user's export
  cache, reused by later runs and by `cisrank eval --backend onnx`) and run by ONNX Runtime,
  int8 one text a batch.

Prints, per runtime: p50 seconds per query (one query embedding plus `--depth` passages), its
ratio to torch float32 (time over time: under 1 is faster), and the largest |score difference|
from torch float32 over every (query, passage) of the run; the first load's seconds (an export
included where one was made). Everything runs on `--threads` torch threads (ONNX Runtime's too).

    CISRANK_DATA_DIR=../shared/data OMP_NUM_THREADS=1 .venv/bin/python bench/dense_runtimes.py \
        [--queries 2 --depth 100 --threads 1 --model all-mpnet-base-v2 \
         --runtimes "torch float32,onnx int8"]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch
from common import dl19_dir, machine, report

from cisrank.data.datasets import load_folder
from cisrank.rerank.dense import DenseReranker
from cisrank.runtimes import embedder_torch

MODEL = "all-MiniLM-L6-v2"
TORCH_FP32 = "torch float32"
RUNTIMES = {
    TORCH_FP32: {"backend": "torch", "dtype": "float32"},
    "torch bf16 autocast": {"backend": "torch", "dtype": "bfloat16"},
    "torch bf16 weights": {"backend": "torch", "dtype": "bfloat16"},
    "onnx float32": {"backend": "onnx", "dtype": "float32"},
    "onnx int8": {"backend": "onnx", "dtype": "int8"},
}


def load(model: str, name: str, options: dict[str, str]) -> tuple[DenseReranker, float]:
    t = time.perf_counter()
    reranker = DenseReranker(model, **options)
    if name.endswith("weights"):  # the reranker's runner swapped for the bf16-weights one
        reranker.runner = embedder_torch.load(model, "bfloat16", options={"bf16": "weights"})
    return reranker, time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--queries", type=int, default=2)
    ap.add_argument("--depth", type=int, default=100)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--model", default=MODEL, help="a bi-encoder (catalogue name, id or folder)")
    ap.add_argument(
        "--runtimes", default=",".join(RUNTIMES), help=f"comma-separated, of: {', '.join(RUNTIMES)}"
    )
    args = ap.parse_args()
    asked = [r.strip() for r in args.runtimes.split(",")]
    if TORCH_FP32 not in asked or not set(asked) <= set(RUNTIMES):
        ap.error(f"--runtimes: {TORCH_FP32} (the reference) and any of {', '.join(RUNTIMES)}")
    torch.set_num_threads(args.threads)
    dataset = load_folder(dl19_dir())
    qids = [q for q in dataset.qids if len(dataset.candidates[q]) >= args.depth][: args.queries]
    rerankers: dict[str, DenseReranker] = {}
    loads: dict[str, float] = {}
    for name in asked:
        rerankers[name], loads[name] = load(args.model, name, RUNTIMES[name])
    names = list(rerankers)
    seconds: dict[str, list[float]] = {n: [] for n in names}
    scores: dict[str, list[float]] = {n: [] for n in names}
    for k, qid in enumerate(qids):
        query = dataset.topics[qid]
        passages = [h.text for h in dataset.candidates[qid][: args.depth]]
        for name in names[k % len(names) :] + names[: k % len(names)]:
            t = time.perf_counter()
            got = rerankers[name].score(query, passages)
            seconds[name].append(time.perf_counter() - t)
            scores[name] += got
    base_p50 = statistics.median(seconds[TORCH_FP32])
    reference = np.array(scores[TORCH_FP32])
    rows: dict[str, object] = {
        "machine": machine(),
        "model": args.model,
        "queries": len(qids),
        "depth": args.depth,
        "threads": args.threads,
    }
    for name in names:
        p50 = statistics.median(seconds[name])
        gap = float(np.abs(np.array(scores[name]) - reference).max())
        rows[name] = (
            f"p50 {p50:.2f} s / {args.depth} passages, {p50 / base_p50:.2f}x torch float32's "
            f"time, max |score - float32| {gap:.2g}, first load {loads[name]:.1f} s"
        )
    report("dense_runtimes" if args.model == MODEL else f"dense_runtimes-{args.model}", rows)


if __name__ == "__main__":
    main()
