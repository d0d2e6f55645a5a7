"""The distilled student against the torch CIS engine it replaces, as `cisrank eval` runs both.

The student's speed bar: its throughput is at least 20x the torch CIS engine's on this CPU (on a CPU
with native bf16, where CIS computes in bf16 by default, against that default too). Every reranker
is loaded as `cisrank eval` loads it with its defaults (`RerankerSpec.build`: a worker per core, one
torch thread each), CIS as the reverse estimator on torch float32, the student on PyTorch float32
and through ONNX Runtime float32 and int8; all score the same DL19 queries' BM25 top `--depth`, 8
queries to a call as `cisrank eval` sends them, the order rotated call by call, so that a ratio
holds whatever else the machine runs. Scores are compared too: each ONNX path against the PyTorch
student.

`--base NAME=MODEL` (repeatable) adds a cross-encoder of another base beside them, on PyTorch
float32 and ONNX Runtime int8: the base's encoder with a seeded, untrained one-logit head, which
costs exactly what a trained student of that base would (the bases' speeds side by side without
training them: a student of all-mpnet-base-v2 takes this CPU far longer to train than to time).

    CISRANK_DATA_DIR=../shared/data .venv/bin/python bench/student_speed.py \
        --student out/student [--cis-model smollm2-135m-instruct --queries 16 --depth 100] \
        [--base mpnet=all-mpnet-base-v2]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np
from common import add_tag_option, interleaved, machine, report, result_name

from cisrank.data.datasets import load_named
from cisrank.devices import cpu_has_native_bf16
from cisrank.eval.pipeline import QUERIES_PER_CALL
from cisrank.jobs.pool import WorkerOptions, cores
from cisrank.rerank.registry import RerankerSpec

CIS = "CIS reverse, torch float32"
CIS_BF16 = "CIS reverse, torch bf16 (the default on this CPU)"
F32, INT8 = "torch float32", "ONNX Runtime int8"
STUDENT = "student, torch float32"
BF16 = "student, torch bf16 (the default on this CPU)"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--student", required=True, help="the student's CrossEncoder folder")
    ap.add_argument("--cis-model", default="smollm2-135m-instruct")
    ap.add_argument("--dataset", default="trec-dl19")
    ap.add_argument("--queries", type=int, default=16)
    ap.add_argument("--depth", type=int, default=100)
    ap.add_argument("--base", action="append", default=[], metavar="NAME=MODEL")
    add_tag_option(ap)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        bases = {
            name: untrained_cross_encoder(model, Path(tmp) / name)
            for name, model in (b.split("=", 1) for b in args.base)
        }
        return measure(args, bases)


def untrained_cross_encoder(model: str, out: Path) -> str:
    """`model`'s encoder under a one-logit head seeded as `distill train` seeds it."""
    from sentence_transformers.cross_encoder import CrossEncoder
    from transformers import set_seed

    from cisrank.distill.config import TrainConfig
    from cisrank.models.resolve import resolve_model

    set_seed(TrainConfig().seed)
    CrossEncoder(resolve_model(model), num_labels=1, device="cpu").save_pretrained(str(out))
    return str(out)


def measure(args: argparse.Namespace, bases: dict[str, str]) -> int:
    workers = WorkerOptions(
        cores()
    )  # a worker per core, started at once: timed from the first call
    cis = {"estimator": "reverse", "backend": "torch"}
    setups = {
        # float32 asked for by name: on a CPU with native bf16 matmuls both defaults are bf16
        CIS: ("cis", args.cis_model, {**cis, "dtype": "float32"}),
        STUDENT: ("cross-encoder", args.student, {"dtype": "float32"}),
        "student, ONNX Runtime float32": ("cross-encoder", args.student, {"backend": "onnx"}),
        "student, ONNX Runtime int8": (
            "cross-encoder",
            args.student,
            {"backend": "onnx", "dtype": "int8"},
        ),
    }
    native_bf16 = cpu_has_native_bf16()
    if native_bf16:
        # Where bf16 is the default of both, the bar is against the CIS users would run.
        setups[CIS_BF16] = ("cis", args.cis_model, cis)
        setups[BF16] = ("cross-encoder", args.student, {})
    for name, folder in bases.items():
        setups[f"{name}, {F32}"] = ("cross-encoder", folder, {"dtype": "float32"})
        setups[f"{name}, {INT8}"] = ("cross-encoder", folder, {"backend": "onnx", "dtype": "int8"})
    rerankers = {
        name: (
            RerankerSpec(kind=kind, model=model, options=options).build(workers),
            workers.threads_per_worker,
        )
        for name, (kind, model, options) in setups.items()
    }
    ds = load_named(args.dataset)
    qids = ds.qids[: args.queries]
    try:
        seconds, scores = interleaved(rerankers, ds, qids, args.depth, QUERIES_PER_CALL)
    finally:
        for reranker, _ in rerankers.values():
            reranker.close()

    pairs = len(scores[CIS])
    arrays = {k: np.asarray(v) for k, v in scores.items()}
    student = arrays[STUDENT]
    result = {
        "student": args.student,
        "cis_model": args.cis_model,
        "dataset": args.dataset,
        "queries": len(qids),
        "depth": args.depth,
        "pairs": pairs,
        "workers": f"{workers.count} x {workers.threads_per_worker} thread",
        "pairs_per_second": {k: round(pairs / v, 2) for k, v in seconds.items()},
        "speed_vs_cis": {k: round(seconds[CIS] / v, 2) for k, v in seconds.items() if k != CIS},
        "speed_vs_cis_bf16": {
            k: round(seconds[CIS_BF16] / v, 2)
            for k, v in seconds.items()
            if k not in (CIS, CIS_BF16)
        }
        if native_bf16
        else {},
        "max_abs_diff_vs_torch_student": {
            k: round(float(np.abs(v - student).max()), 4)
            for k, v in arrays.items()
            if k.startswith("student, ") and k != STUDENT
        },
        "bases_int8_vs_their_torch_max_abs_diff": {
            name: round(
                float(np.abs(arrays[f"{name}, {INT8}"] - arrays[f"{name}, {F32}"]).max()), 4
            )
            for name in bases
        },
        "cpu_native_bf16": native_bf16,
        "machine": machine(),
    }
    # a run with other bases keeps its own record beside the student-only one
    report(result_name("student_speed", args.dataset, *bases, args.tag), result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
