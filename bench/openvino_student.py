"""OpenVINO against ONNX Runtime for the distilled student, one core each, on this CPU.

The student was to be served through ONNX Runtime "or OpenVINO", int8 where the CPU rewards it.
cisrank serves it through ONNX Runtime (`--backend onnx`); this script measures whether OpenVINO
would pay instead, so that the choice rests on a figure. The OpenVINO runners reuse the reranker's
own tokenization, length batching and padding (they stand in for its ONNX Runtime session), so every
path scores the same batches:

- ONNX Runtime float32 and int8: cisrank's `backend="onnx"` (fused graph; int8 = dynamic,
  per-channel weights);
- OpenVINO float32: `openvino.convert_model` of the torch sequence-classification model, run
  with its precision named (`INFERENCE_PRECISION_HINT`), since OpenVINO's CPU default is bf16
  wherever the CPU computes it;
- on such a CPU (AVX512-BF16 or AMX), OpenVINO bf16 and cisrank's PyTorch bf16 (its default
  there) too, and the static int8 model with bf16 in its unquantized ops;
- OpenVINO int8 (static): NNCF post-training quantization (`ModelType.TRANSFORMER`) calibrated
  on another set's pairs (DL21 by default), never on the measured queries;
- OpenVINO int8 weights: NNCF weight compression (int8 asymmetric, per channel), float
  activations.

All run on one thread in this process, query by query, the order rotated query by query
(`common.interleaved`). Needs the `openvino` extra, which the default install leaves out:

    .venv/bin/pip install -e ".[openvino]"
    CISRANK_DATA_DIR=../shared/data .venv/bin/python bench/openvino_student.py \
        --student out/student [--queries 16 --depth 100]
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import sys
from typing import Any

import numpy as np
import torch
from common import add_tag_option, interleaved, machine, report, result_name

from cisrank.data.datasets import load_named
from cisrank.data.runs import Run
from cisrank.devices import cpu_has_native_bf16
from cisrank.eval.metrics import evaluate
from cisrank.rerank.cross_encoder import CrossEncoderReranker

REFERENCE = "ONNX Runtime int8 (cisrank)"


class OpenVinoRunner:
    """A compiled OpenVINO model in the place of the reranker's ONNX Runtime session."""

    def __init__(self, model: Any, names: list[str], precision: str) -> None:
        import openvino as ov

        # The precision is named: OpenVINO's CPU default is bf16 wherever the CPU has it, so an
        # unnamed "float32" row would run bf16 there (on int8 models, for the unquantized ops).
        config = {
            "INFERENCE_NUM_THREADS": 1,
            "NUM_STREAMS": 1,
            "PERFORMANCE_HINT": "LATENCY",
            "INFERENCE_PRECISION_HINT": precision,
        }
        self.request = ov.Core().compile_model(model, "CPU", config).create_infer_request()
        self.names = names

    def logits(self, batch: dict[str, np.ndarray]) -> np.ndarray:
        out = self.request.infer({k: v for k, v in batch.items() if k in self.names})
        return np.asarray(out[0])[:, 0].copy()


class BatchRecorder:
    """In the place of the session: keeps the collated batches the reranker would run."""

    def __init__(self) -> None:
        self.batches: list[dict[str, np.ndarray]] = []

    def logits(self, batch: dict[str, np.ndarray]) -> np.ndarray:
        self.batches.append(batch)
        return np.zeros(len(batch["input_ids"]))


def with_runner(reranker: CrossEncoderReranker, runner: Any) -> CrossEncoderReranker:
    """The reranker (its tokenizer, length batching, padding) with another runner in place of
    its ONNX Runtime session; the session is not loaded again."""
    other = copy.copy(reranker)
    other.runner = runner
    return other


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--student", required=True, help="the student's CrossEncoder folder")
    ap.add_argument("--dataset", default="trec-dl19")
    ap.add_argument("--calibration", default="trec-dl21", help="set whose pairs calibrate int8")
    ap.add_argument("--calibration-queries", type=int, default=8)
    ap.add_argument("--queries", type=int, default=16)
    ap.add_argument("--depth", type=int, default=100)
    add_tag_option(ap)
    args = ap.parse_args(argv)
    if importlib.util.find_spec("openvino") is None or importlib.util.find_spec("nncf") is None:
        print('needs the openvino extra: .venv/bin/pip install -e ".[openvino]"', file=sys.stderr)
        return 2
    import nncf
    import openvino as ov
    from transformers import AutoModelForSequenceClassification

    torch.set_num_threads(1)
    ort_fp32 = CrossEncoderReranker(model=args.student, backend="onnx")
    ort_int8 = CrossEncoderReranker(model=args.student, backend="onnx", dtype="int8")
    names = sorted(ort_fp32.runner.inputs)

    calib = load_named(args.calibration)
    calib_pairs = [
        (calib.topics[q], h.text)
        for q in calib.qids[: args.calibration_queries]
        for h in calib.candidates[q][:30]
    ]
    recorder = BatchRecorder()
    with_runner(ort_fp32, recorder).score_pairs(calib_pairs)
    calib_batches = [{k: b[k] for k in names} for b in recorder.batches]
    example = {k: torch.from_numpy(v) for k, v in calib_batches[0].items()}
    torch_model = AutoModelForSequenceClassification.from_pretrained(args.student).eval()
    with torch.inference_mode():
        ov_fp32 = ov.convert_model(torch_model, example_input=example)
    ov_static = nncf.quantize(
        ov_fp32.clone(),
        nncf.Dataset(calib_batches),
        model_type=nncf.ModelType.TRANSFORMER,
        subset_size=len(calib_batches),
    )
    ov_weights = nncf.compress_weights(ov_fp32.clone(), mode=nncf.CompressWeightsMode.INT8_ASYM)

    def on_openvino(model: Any, precision: str = "f32") -> CrossEncoderReranker:
        return with_runner(ort_fp32, OpenVinoRunner(model, names, precision))

    rerankers = {
        "ONNX Runtime float32 (cisrank)": (ort_fp32, 1),
        REFERENCE: (ort_int8, 1),
        "OpenVINO float32": (on_openvino(ov_fp32), 1),
        "OpenVINO int8 static (NNCF)": (on_openvino(ov_static), 1),
        "OpenVINO int8 weights (NNCF)": (on_openvino(ov_weights), 1),
    }
    bf16 = cpu_has_native_bf16()
    if bf16:
        rerankers["PyTorch bf16 (cisrank)"] = (
            CrossEncoderReranker(model=args.student, dtype="bfloat16"),
            1,
        )
        rerankers["OpenVINO bf16"] = (on_openvino(ov_fp32, "bf16"), 1)
        rerankers["OpenVINO int8 static, bf16 elsewhere"] = (on_openvino(ov_static, "bf16"), 1)
    ds = load_named(args.dataset)
    qids = [q for q in ds.qids if ds.qrels.get(q)][: args.queries]
    seconds, scores = interleaved(rerankers, ds, qids, args.depth, 1)

    qrels = {q: ds.qrels[q] for q in qids}

    def ndcg(values: list[float]) -> float:
        run, at = {}, 0
        for q in qids:
            hits = ds.candidates[q][: args.depth]
            run[q] = [(h.docid, v) for h, v in zip(hits, values[at : at + len(hits)], strict=True)]
            at += len(hits)
        return round(evaluate(Run.from_scores("x", run), qrels, ("nDCG@10",))["nDCG@10"], 4)

    pairs = len(scores[REFERENCE])
    fp32 = np.asarray(scores["ONNX Runtime float32 (cisrank)"])
    result = {
        "student": args.student,
        "dataset": args.dataset,
        "queries": len(qids),
        "depth": args.depth,
        "pairs": pairs,
        "threads": 1,
        "cpu_native_bf16": bf16,
        "openvino": ov.__version__,
        "nncf": nncf.__version__,
        "pairs_per_second": {k: round(pairs / v, 2) for k, v in seconds.items()},
        "speed_vs_onnxruntime_int8": {
            k: round(seconds[REFERENCE] / v, 2) for k, v in seconds.items()
        },
        "ndcg@10": {k: ndcg(v) for k, v in scores.items()},
        "max_abs_diff_vs_onnxruntime_float32": {
            k: round(float(np.abs(np.asarray(v) - fp32).max()), 4) for k, v in scores.items()
        },
        "machine": machine(),
    }
    report(result_name("openvino_student", args.dataset, args.tag), result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
