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

With `--st-python`, sentence-transformers' own paths (`st torch`, `st onnx`, `st onnx int8`:
bench/st_peer.py) run in a peer process under that interpreter, on the same weights (the same
model folder), in the same rotation, each timed inside the peer. sentence-transformers'
`backend="onnx"` needs optimum-onnx, which pins transformers < 4.58, so its interpreter is a
virtual environment of its own:

    python3.11 -m venv /tmp/stvenv && /tmp/stvenv/bin/pip install torch==2.13.0 \
        "transformers<4.58" sentence-transformers==5.1.2 "optimum-onnx[onnxruntime]==0.1.0"

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
import json
import statistics
import subprocess
import time
from pathlib import Path

import numpy as np
import torch
from common import add_tag_option, dl19_dir, machine, report, result_name

from cisrank.data.datasets import load_folder
from cisrank.models.resolve import resolve_model
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


ST_RUNTIMES = ("st torch", "st onnx", "st onnx int8")
PEER = Path(__file__).resolve().parent / "st_peer.py"


class Peer:
    """sentence-transformers in its own interpreter (bench/st_peer.py): `score` as a reranker's,
    `last` the seconds the peer timed for its last answer."""

    def __init__(self, python: str, model: str, work: Path, threads: int, names: list[str]):
        folder = resolve_model(model)
        self.proc = subprocess.Popen(
            [python, str(PEER), folder, str(work), str(threads), ",".join(names)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        self.loads = self._read()["loads"]
        self.last = 0.0

    def _read(self) -> dict:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit(f"the sentence-transformers peer exited ({self.proc.wait()})")
        return json.loads(line)

    def scorer(self, name: str):
        def score(query: str, passages: list[str]) -> list[float]:
            assert self.proc.stdin is not None
            ask = {"name": name, "query": query, "passages": passages}
            self.proc.stdin.write(json.dumps(ask) + "\n")
            self.proc.stdin.flush()
            got = self._read()
            self.last = got["seconds"]
            return got["scores"]

        return score


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--queries", type=int, default=2)
    ap.add_argument("--depth", type=int, default=100)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--model", default=MODEL, help="a bi-encoder (catalogue name, id or folder)")
    ap.add_argument(
        "--runtimes", default=",".join(RUNTIMES), help=f"comma-separated, of: {', '.join(RUNTIMES)}"
    )
    ap.add_argument("--st-python", default=None, help="an interpreter with sentence-transformers")
    ap.add_argument("--st-runtimes", default=",".join(ST_RUNTIMES))
    ap.add_argument("--st-work", type=Path, default=Path("out/st-peer"), help="its export copy")
    add_tag_option(ap)
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
    scorers = {name: r.score for name, r in rerankers.items()}
    peer = None
    if args.st_python:
        st = [r.strip() for r in args.st_runtimes.split(",")]
        if not set(st) <= set(ST_RUNTIMES):
            ap.error(f"--st-runtimes: any of {', '.join(ST_RUNTIMES)}")
        work = args.st_work / Path(args.model).name
        peer = Peer(args.st_python, args.model, work, args.threads, st)
        loads.update(peer.loads)
        scorers.update({name: peer.scorer(name) for name in st})
    names = list(scorers)
    seconds: dict[str, list[float]] = {n: [] for n in names}
    scores: dict[str, list[float]] = {n: [] for n in names}
    for k, qid in enumerate(qids):
        query = dataset.topics[qid]
        passages = [h.text for h in dataset.candidates[qid][: args.depth]]
        for name in names[k % len(names) :] + names[: k % len(names)]:
            t = time.perf_counter()
            got = scorers[name](query, passages)
            took = time.perf_counter() - t
            seconds[name].append(peer.last if name in ST_RUNTIMES and peer else took)
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
    fastest_st = min(
        (n for n in names if n in ST_RUNTIMES),
        key=lambda n: statistics.median(seconds[n]),
        default=None,
    )
    if fastest_st is not None:
        best = statistics.median(seconds[fastest_st])
        rows["sentence-transformers' fastest"] = fastest_st
        rows["speed vs sentence-transformers' fastest"] = {
            n: f"{best / statistics.median(seconds[n]):.2f}x" for n in names if n not in ST_RUNTIMES
        }
    base = "dense_runtimes" if args.model == MODEL else f"dense_runtimes-{args.model}"
    report(result_name(base, args.tag), rows)


if __name__ == "__main__":
    main()
