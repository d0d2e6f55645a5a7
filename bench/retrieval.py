"""First-stage benchmark: BM25 build time and query latency (single and batched) for bm25s versus
rank-bm25 versus Lucene (pyserini) on a synthetic 100k-passage corpus, and dense encode throughput.

    .venv/bin/python bench/retrieval.py [--docs 100000] [--queries 100] [--json out.json]

Synthetic text: words drawn from a Zipf distribution over a 50k pseudo-word vocabulary (the shape
of natural text frequencies), 20-80 words per passage; queries are 2-5 words of mid frequency.
All engines index the same terms (bm25s and rank-bm25 get the same analyzed tokens; Lucene analyzes
the same text itself). The acceptance bar: bm25s >= 50x faster per query than rank-bm25.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import string
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import write_result

from cisrank.indexes.build import build_index
from cisrank.indexes.kinds import open_index
from cisrank.retrieval.analysis import Analyzer


def synthetic(n_docs: int, n_queries: int, seed: int = 0) -> tuple[list[str], list[str]]:
    rng = np.random.default_rng(seed)
    letters = np.array(list(string.ascii_lowercase))
    vocab = ["".join(rng.choice(letters, size=rng.integers(4, 10))) for _ in range(50_000)]
    ranks = np.arange(1, len(vocab) + 1)
    p = 1.0 / ranks**1.07
    p /= p.sum()
    lengths = rng.integers(20, 81, size=n_docs)
    words = rng.choice(len(vocab), size=int(lengths.sum()), p=p)
    docs, pos = [], 0
    for n in lengths:
        docs.append(" ".join(vocab[w] for w in words[pos : pos + n]))
        pos += n
    mid = np.arange(100, 5000)
    queries = [
        " ".join(vocab[w] for w in rng.choice(mid, size=rng.integers(2, 6)))
        for _ in range(n_queries)
    ]
    return docs, queries


def timed(fn, *args, **kwargs):
    t = time.perf_counter()
    out = fn(*args, **kwargs)
    return out, time.perf_counter() - t


def per_query_ms(search, queries: list[str], k: int) -> float:
    search(queries[0], k)  # warm-up (numba JIT, JVM class loading)
    t = time.perf_counter()
    for q in queries:
        search(q, k)
    return (time.perf_counter() - t) / len(queries) * 1e3


def batched_ms(batch_search, queries: list[str], k: int) -> float:
    batch_search(queries[:2], k)
    t = time.perf_counter()
    batch_search(queries, k)
    return (time.perf_counter() - t) / len(queries) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--docs", type=int, default=100_000)
    ap.add_argument("--queries", type=int, default=100)
    ap.add_argument("--rank-bm25-queries", type=int, default=20, help="it is slow: fewer")
    ap.add_argument("--encode", type=int, default=1024, help="passages for dense throughput")
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--skip-lucene", action="store_true")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()

    docs, queries = synthetic(args.docs, args.queries)
    results: dict = {
        "docs": args.docs,
        "queries": args.queries,
        "k": args.k,
        "machine": f"{platform.machine()}, {os.cpu_count()} cpus",
    }
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        corpus = root / "corpus.tsv"
        corpus.write_text("".join(f"d{i}\t{t}\n" for i, t in enumerate(docs)), encoding="utf-8")

        # bm25s (numba backend), build through the real build job (analysis + index + docstore)
        _, build_s = timed(build_index, "bm25", corpus, root / "bm25", progress=False)
        bm = open_index(root / "bm25", backend="numba")
        results["bm25s"] = {
            "backend": bm.backend,
            "build_s": build_s,
            "single_ms": per_query_ms(bm.search, queries, args.k),
            "batched_ms": batched_ms(bm.batch_search, queries, args.k),
        }
        numpy_bm = open_index(root / "bm25", backend="numpy")
        results["bm25s_numpy"] = {"single_ms": per_query_ms(numpy_bm.search, queries, args.k)}
        same = all(
            [h.docid for h in a] == [h.docid for h in b]
            for a, b in zip(
                bm.batch_search(queries, args.k),
                numpy_bm.batch_search(queries, args.k),
                strict=True,
            )
        )
        results["bm25s"]["numba_equals_numpy"] = same
        print(f"bm25s: {results['bm25s']}", flush=True)

        # rank-bm25 on the same analyzed tokens
        from rank_bm25 import BM25Okapi

        analyzer = Analyzer()
        tokenized, analyze_s = timed(lambda: [analyzer.analyze(t) for t in docs])
        rb, rb_build = timed(BM25Okapi, tokenized, k1=0.9, b=0.4)

        def rb_search(q: str, k: int) -> list[int]:
            scores = rb.get_scores(analyzer.analyze(q))
            top = np.argpartition(-scores, k)[:k]
            return top[np.argsort(-scores[top])].tolist()

        rq = queries[: args.rank_bm25_queries]
        results["rank_bm25"] = {
            "build_s": analyze_s + rb_build,
            "single_ms": per_query_ms(rb_search, rq, args.k),
            "queries_timed": len(rq),
        }
        print(f"rank-bm25: {results['rank_bm25']}", flush=True)
        results["speedup_bm25s_vs_rank_bm25"] = (
            results["rank_bm25"]["single_ms"] / results["bm25s"]["single_ms"]
        )

        if not args.skip_lucene:
            try:
                _, lb = timed(build_index, "lucene", corpus, root / "lucene", progress=False)
                lu = open_index(root / "lucene")
                results["lucene"] = {
                    "build_s": lb,
                    "single_ms": per_query_ms(lu.search, queries, args.k),
                    "batched_ms": batched_ms(lu.batch_search, queries, args.k),
                }
                print(f"lucene: {results['lucene']}", flush=True)
            except Exception as exc:  # the extra may be missing: report, do not fail the bench
                results["lucene"] = {"error": f"{type(exc).__name__}: {exc}"}

        # dense encode throughput (all-MiniLM-L6-v2, CPU float32 here)
        from cisrank.models.encoders import load_sentence_transformer
        from cisrank.retrieval.dense import DenseIndexConfig, encode

        defaults = DenseIndexConfig()

        enc = load_sentence_transformer("all-MiniLM-L6-v2")
        sample = docs[: args.encode]
        encode(enc, sample[:64], defaults, "")
        _, enc_s = timed(encode, enc, sample, defaults, "")
        ids = enc.tokenizer(sample, truncation=True, max_length=enc.max_seq_length)["input_ids"]
        results["dense_encode"] = {
            "model": "all-MiniLM-L6-v2",
            "passages": len(sample),
            "mean_tokens": sum(map(len, ids)) / len(ids),
            "passages_per_s": len(sample) / enc_s,
            "tokens_per_s": sum(map(len, ids)) / enc_s,
        }

    ok = results["speedup_bm25s_vs_rank_bm25"] >= 50
    results["bar_50x"] = ok
    print(json.dumps(results, indent=2))
    write_result("retrieval", results)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    print(
        f"bm25s is {results['speedup_bm25s_vs_rank_bm25']:.0f}x faster per query than rank-bm25 "
        f"({'meets' if ok else 'MISSES'} the >= 50x bar)"
    )


if __name__ == "__main__":
    main()
