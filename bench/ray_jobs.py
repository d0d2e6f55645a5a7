"""Throughput of `--engine ray` against `--engine local` for the prior job and the dense build, on
the same corpus and model, on this machine.

Corpus: the first --passages passages of the DL19 pool (real text). Models, random weights (no
checkpoint of these shapes installs offline; the arithmetic is the same): a GPT-2 124M-shaped
causal LM (12 layers, 768 wide, word-level vocabulary padded to GPT-2's 50,257) for the priors,
and an all-MiniLM-L6-v2-shaped BERT (6 layers, 384 wide) for the dense encoding.

Both engines run the real build (`build_index`, manifest and all). The Ray cluster is started
before the clock (a cluster outlives jobs); its start is reported apart. The Ray figure includes
what a job pays on a running cluster: the describe task and the actors' start (each loads the
model), shipping blocks through the object store, and writing the shards.

    python bench/ray_jobs.py [--passages 192] [--dense-passages 1024] [--actors 2]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import GPT2_VOCAB, dl19_dir, machine, write_result

from cisrank import testing
from cisrank.data.datasets import load_folder
from cisrank.indexes.build import build_index
from cisrank.jobs.ray import RayOptions


def corpus_file(folder: Path, n: int) -> tuple[Path, list[str]]:
    ds = load_folder(dl19_dir())
    seen: dict[str, str] = {}
    for q in ds.qids:
        for h in ds.candidates[q]:
            seen.setdefault(h.docid, h.text)
    rows = list(seen.items())[:n]
    path = folder / f"corpus-{n}.jsonl"
    path.write_text("".join(json.dumps({"id": d, "text": t}) + "\n" for d, t in rows))
    return path, [t for _, t in rows]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--passages", type=int, default=192, help="prior job passages")
    ap.add_argument("--dense-passages", type=int, default=1024, help="dense build passages")
    ap.add_argument("--max-doc-tokens", type=int, default=64)
    ap.add_argument("--actors", type=int, default=2, help="Ray actors (1 CPU each)")
    ap.add_argument("--shard-size", type=int, default=32, help="prior shard (passages)")
    args = ap.parse_args()

    import ray
    import torch

    threads = torch.get_num_threads()
    print(f"machine: {machine()}; load average {os.getloadavg()}")
    results: dict[str, object] = {"args": vars(args), "local_threads": threads}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        _, texts = corpus_file(root, max(args.passages, args.dense_passages))
        prior_corpus, _ = corpus_file(root, args.passages)
        dense_corpus, _ = corpus_file(root, args.dense_passages)
        tok = testing.word_level_tokenizer(testing.words(texts), vocab_size=GPT2_VOCAB)
        lm = testing.build_causal_lm(root / "gpt2", tok, "gpt2", layers=12, hidden=768, heads=12)
        bert = testing.build_bert(
            root / "bert", testing.words(texts), layers=6, hidden=384, heads=6
        )

        t = time.perf_counter()
        ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
        start_s = time.perf_counter() - t
        results["ray_cluster_start_s"] = round(start_s, 2)
        print(f"ray local cluster start: {start_s:.1f} s")
        ray_opts = RayOptions(actors=args.actors, num_cpus=1)
        try:
            for job, corpus_path, n, params, options in (
                (
                    "prior",
                    prior_corpus,
                    args.passages,
                    {"model": str(lm), "max_doc_tokens": args.max_doc_tokens},
                    {"batch_size": 16},
                ),
                (
                    "dense",
                    dense_corpus,
                    args.dense_passages,
                    {"model": str(bert), "shard_size": 128, "batch_size": 32},
                    {},
                ),
            ):
                extra = {"shard_size": args.shard_size} if job == "prior" else {}
                t = time.perf_counter()
                build_index(
                    job, corpus_path, root / f"{job}-local", params, progress=False,
                    options=options,
                )  # fmt: skip
                local_s = time.perf_counter() - t
                t = time.perf_counter()
                m = build_index(
                    job, corpus_path, root / f"{job}-ray", params, progress=False,
                    options={**options, **extra, "engine": "ray", "ray": ray_opts},
                )  # fmt: skip
                ray_s = time.perf_counter() - t
                row = {
                    "passages": n,
                    "local_s": round(local_s, 2),
                    "ray_s": round(ray_s, 2),
                    "local_passages_per_s": round(n / local_s, 2),
                    "ray_passages_per_s": round(n / ray_s, 2),
                    "ray_over_local": round(local_s / ray_s, 3),
                    "shards": m.build.get("shards"),
                }
                results[job] = row
                print(
                    f"{job:5s} {n:5d} passages: local {local_s:6.1f} s "
                    f"({n / local_s:6.1f}/s, {threads} threads), ray {ray_s:6.1f} s "
                    f"({n / ray_s:6.1f}/s, {args.actors} actors x 1 CPU): "
                    f"ray/local throughput {local_s / ray_s:.2f}"
                )
        finally:
            ray.shutdown()
    results["load_average_after"] = os.getloadavg()
    print(f"wrote {write_result('ray_jobs', results)}")


if __name__ == "__main__":
    main()
