"""How far a passage's embedding moves with the texts batched with it, per dense runtime: what
decides where the passage cache (`cisrank.rerank.passage_cache`) may keep vectors.

One DL19 query's BM25 top `--depth` passages embedded by all-MiniLM-L6-v2 three ways on the same
runtime: all in batches of 16 (the CPU default), in two halves (other batches of 16), and one
text a batch. Prints the largest |component difference| between them and how many rows came out
bit-identical, per runtime; writes bench/results/embedding_company[_TAG].json.

    CISRANK_DATA_DIR=../shared/data OMP_NUM_THREADS=1 .venv/bin/python bench/embedding_company.py
"""

from __future__ import annotations

import argparse

import numpy as np
import torch
from common import add_tag_option, cpu_flags, dl19_dir, machine, report, result_name

from cisrank.data.datasets import load_folder
from cisrank.rerank.dense import DenseReranker

MODEL = "all-MiniLM-L6-v2"
RUNTIMES = {"torch float32": ("torch", "float32"), "torch bf16 autocast": ("torch", "bfloat16")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--depth", type=int, default=100)
    ap.add_argument("--threads", type=int, default=1)
    add_tag_option(ap)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    dataset = load_folder(dl19_dir())
    qid = next(q for q in dataset.qids if len(dataset.candidates[q]) >= args.depth)
    texts = [h.text for h in dataset.candidates[qid][: args.depth]]
    half = len(texts) // 2
    rows: dict[str, object] = {"machine": machine(), "cpu_flags": " ".join(cpu_flags())}
    for name, (backend, dtype) in RUNTIMES.items():
        runner = DenseReranker(MODEL, backend=backend, dtype=dtype, passage_cache_mb=0).runner
        full = runner.embed(texts, 16)
        halves = np.concatenate([runner.embed(texts[:half], 16), runner.embed(texts[half:], 16)])
        alone = np.stack([runner.embed([t], 1)[0] for t in texts])
        rows[name] = (
            f"max |d| batch 16 vs halves {np.abs(full - halves).max():.2g}, vs one a batch "
            f"{np.abs(full - alone).max():.2g}; rows bit-identical to one a batch "
            f"{int((full == alone).all(axis=1).sum())}/{len(texts)}"
        )
    report(result_name("embedding_company", args.tag), rows)


if __name__ == "__main__":
    main()
