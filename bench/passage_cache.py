"""The dense reranker's passage cache: the p50 of a repeated 100-passage request, cached and not.

RAG clients send the same chunks again with another question. One DL19 query's BM25 top `--depth`
passages are scored by two all-MiniLM-L6-v2 dense rerankers on the same runtime, one with the
passage cache (the default 64 MiB) and one without (`passage_cache_mb` 0). The cached one is
warmed by one request (every passage a miss); then `--repeats` requests, each with the next
DL19 question over the same passages, go to both, the order alternated request by request
(interleaved, so load from other processes hits both alike). Prints each one's p50 seconds per
request, the speed-up, the largest |score difference| between them (0 when cached equals
uncached exactly), and the cache's counters; writes bench/results/passage_cache[_TAG].json.

    CISRANK_DATA_DIR=../shared/data OMP_NUM_THREADS=1 .venv/bin/python bench/passage_cache.py \
        [--depth 100 --repeats 8 --threads 1 --backend torch --dtype float32]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from common import add_tag_option, cpu_flags, dl19_dir, machine, report, result_name

from cisrank.data.datasets import load_folder
from cisrank.rerank.dense import DenseReranker

MODEL = "all-MiniLM-L6-v2"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--depth", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--backend", default="torch")
    ap.add_argument("--dtype", default="float32")
    add_tag_option(ap)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    dataset = load_folder(dl19_dir())
    qids = [q for q in dataset.qids if len(dataset.candidates[q]) >= args.depth]
    passages = [h.text for h in dataset.candidates[qids[0]][: args.depth]]
    questions = [dataset.topics[q] for q in qids[1 : 1 + args.repeats]]
    runtime = {"backend": args.backend, "dtype": args.dtype}
    rerankers = {
        "cached": DenseReranker(MODEL, passage_cache_mb=64, **runtime),
        "uncached": DenseReranker(MODEL, passage_cache_mb=0, **runtime),
    }
    cache = rerankers["cached"].passage_cache
    if cache is None:
        raise SystemExit(f"{args.backend} {args.dtype} keeps no passage cache")
    t = time.perf_counter()
    rerankers["cached"].score(dataset.topics[qids[0]], passages)  # the cold request: all misses
    cold = time.perf_counter() - t
    seconds: dict[str, list[float]] = {n: [] for n in rerankers}
    gap = 0.0
    for k, question in enumerate(questions):
        names = list(rerankers) if k % 2 == 0 else list(rerankers)[::-1]
        got = {}
        for name in names:
            t = time.perf_counter()
            got[name] = rerankers[name].score(question, passages)
            seconds[name].append(time.perf_counter() - t)
        gap = max(gap, max(abs(a - b) for a, b in zip(got["cached"], got["uncached"], strict=True)))
    p50 = {n: statistics.median(s) for n, s in seconds.items()}
    report(
        result_name("passage_cache", args.tag),
        {
            "machine": machine(),
            "cpu_flags": " ".join(cpu_flags()),
            "model": f"{MODEL} ({args.backend} {args.dtype})",
            "request": f"{args.depth} passages, {len(questions)} repeats with new questions",
            "cached p50": f"{p50['cached'] * 1000:.1f} ms (cold first request {cold:.2f} s)",
            "uncached p50": f"{p50['uncached'] * 1000:.1f} ms",
            "speed-up": f"{p50['uncached'] / p50['cached']:.1f}x",
            "max |cached - uncached|": gap,
            "cache": cache.stats(),
        },
    )


if __name__ == "__main__":
    main()
