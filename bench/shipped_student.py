"""What float16 storage costs the shipped student: nDCG@10 of the shipped weights against the
float32 student they were made from (`make student`'s out/student), on every backend, DL19 and
DL21 (BM25 top 100, all judged queries).

The shipped files (`cisrank-student`) are out/student with every weight rounded to float16
(`cisrank distill ship`) and widened back to float32 on load, so each backend computes on them
exactly as on the original, from weights that moved by at most half a float16 ulp. The backends:
torch float32 (exact), torch bf16 (the default on a CPU with native bf16 where onnxruntime is
absent), ONNX Runtime float32 and ONNX Runtime int8 (the default where it is installed). Each row
is one reranker over the same candidates; the bar is the shipped weights within 0.002
of the float32 student on each backend.

    CISRANK_DATA_DIR=../shared/data .venv/bin/python bench/shipped_student.py --student out/student
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from common import add_tag_option, machine_info, result_name, write_result

from cisrank.data.datasets import load_named
from cisrank.data.runs import Run
from cisrank.env import data_dir
from cisrank.eval.metrics import evaluate
from cisrank.rerank.registry import load_reranker

BACKENDS = {
    "torch float32": {"backend": "torch", "dtype": "float32"},
    "torch bf16": {"backend": "torch", "dtype": "bfloat16"},
    "onnx float32": {"backend": "onnx", "dtype": "float32"},
    "onnx int8": {"backend": "onnx", "dtype": "int8"},
}
DATASETS = ("trec-dl19", "trec-dl21")


def ndcg10(reranker, dataset, depth: int) -> float:
    requests = [
        (dataset.topics[q], [h.text for h in dataset.candidates[q][:depth]]) for q in dataset.qids
    ]
    scores = reranker.score_batch(requests)
    run = {
        q: [(h.docid, s) for h, s in zip(dataset.candidates[q][:depth], values, strict=True)]
        for q, values in zip(dataset.qids, scores, strict=True)
    }
    return evaluate(Run.from_scores("student", run), dataset.qrels, ["nDCG@10"])["nDCG@10"]


def ulp_copies(student: Path, root: Path, count: int, seed: int) -> list[Path]:
    """Copies of the float32 student whose every weight moved by one float32 ulp, up or down at
    random: a change about 10,000 times smaller than float16 rounding, to see how far int8
    quantization alone moves nDCG (each copy quantizes to other int8 weights near rounding
    boundaries)."""
    import shutil

    import numpy as np
    import torch
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(student / "model.safetensors"))
    rng = np.random.default_rng(seed)
    out = []
    for i in range(count):
        folder = root / f"ulp-{i}"
        shutil.copytree(student, folder, ignore=shutil.ignore_patterns("checkpoints"))
        moved = {}
        for name, t in tensors.items():
            if not t.is_floating_point():
                moved[name] = t
                continue
            a = t.float().numpy()
            way = np.where(rng.random(a.shape) < 0.5, -np.inf, np.inf).astype(np.float32)
            moved[name] = torch.from_numpy(np.nextafter(a, way).astype(np.float32))
        save_file(moved, str(folder / "model.safetensors"), metadata={"format": "pt"})
        out.append(folder)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--student", type=Path, default=Path("out/student"), help="float32 student")
    ap.add_argument("--shipped", default="cisrank-student")
    ap.add_argument("--depth", type=int, default=100)
    ap.add_argument("--backends", default=",".join(BACKENDS))
    ap.add_argument(
        "--int8-noise",
        type=int,
        default=0,
        help="also int8 nDCG of this many one-ulp perturbations of the float32 student",
    )
    add_tag_option(ap)
    args = ap.parse_args()
    root = data_dir()
    if root is None:
        raise SystemExit("set CISRANK_DATA_DIR to the folder holding trec-dl19/ and trec-dl21/")
    datasets = {name: load_named(name, root / name) for name in DATASETS}
    weights = {"float32 student": str(args.student), "shipped (float16)": args.shipped}
    rows: dict[str, dict[str, dict[str, float]]] = {}
    for backend in args.backends.split(","):
        rows[backend] = {}
        for label, model in weights.items():
            started = time.perf_counter()
            reranker = load_reranker("cross-encoder", model, **BACKENDS[backend])
            rows[backend][label] = {
                d: ndcg10(reranker, ds, args.depth) for d, ds in datasets.items()
            }
            took = time.perf_counter() - started
            print(f"{backend:14s} {label:18s} {rows[backend][label]}  ({took:.0f} s)", flush=True)
    print(f"\nCPU flags {machine_info()['cpu_flags']}; BM25 top {args.depth}")
    print("| backend | DL19 float32 | DL19 shipped | diff | DL21 float32 | DL21 shipped | diff |")
    print("|---|---|---|---|---|---|---|")
    worst = 0.0
    for backend, by in rows.items():
        cells = []
        for d in DATASETS:
            a, b = by["float32 student"][d], by["shipped (float16)"][d]
            worst = max(worst, abs(a - b))
            cells += [f"{a:.4f}", f"{b:.4f}", f"{b - a:+.4f}"]
        print(f"| {backend} | " + " | ".join(cells) + " |")
    print(f"largest |shipped - float32| = {worst:.4f} (bar: 0.002)")
    noise: list[dict[str, float]] = []
    if args.int8_noise:
        import tempfile

        with tempfile.TemporaryDirectory() as tmp:
            for folder in ulp_copies(args.student, Path(tmp), args.int8_noise, seed=0):
                reranker = load_reranker("cross-encoder", str(folder), **BACKENDS["onnx int8"])
                noise.append({d: ndcg10(reranker, ds, args.depth) for d, ds in datasets.items()})
                print(f"onnx int8, one-ulp copy {len(noise)}: {noise[-1]}", flush=True)
        base = rows.get("onnx int8", {}).get("float32 student")
        if base:
            for d in DATASETS:
                moves = [n[d] - base[d] for n in noise]
                print(
                    f"{d}: int8 nDCG@10 of one-ulp copies moves {min(moves):+.4f} .. {max(moves):+.4f}"
                )
    write_result(
        result_name("shipped_student", args.tag),
        {
            "student": str(args.student),
            "depth": args.depth,
            "rows": rows,
            "max_abs_diff": worst,
            "int8_one_ulp_copies": noise,
        },
    )


if __name__ == "__main__":
    main()
