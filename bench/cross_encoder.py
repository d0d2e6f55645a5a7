"""Cross-encoder reranker latency on 100 BM25 candidates of real DL19 queries, against `predict`.

Compared in one process on identical inputs, interleaved query by query so that load from other
processes hits every method alike:

- (a) sentence-transformers `CrossEncoder.predict` with its default settings (batch 32, length
  sorting, inference mode), the code a user would write by hand: the baseline of every ratio;
- (b) `CrossEncoderReranker` in float32, not quantized (the same numbers as (a): checked);
- (c) its fast paths: the default where it is not float32 (bf16 on GPU, and on CPUs with
  native bf16: AVX512-BF16 or AMX), and `quantize="int8"` on CPU (torch dynamic int8);
- (e) on CPU, `backend="onnx"`: the same reranker with the model exported once to ONNX and run
  by ONNX Runtime in float32 and in int8 (`dtype="int8"`, dynamic int8 weight products), with
  ONNX Runtime on torch's thread count (`--threads`); rows "speed vs torch float32" compare them
  with (b). sentence-transformers' own ONNX path (`CrossEncoder(..., backend="onnx")`) is not
  measured: it needs `optimum`, whose every release pins transformers < 4.58 (cisrank runs 5);
- (d) the CIS reranker with a GPT-2 124M-shaped model (random weights, the same model as
  bench/cis_engine.py) on the passages of the first `--cis-queries` queries.

Also prints how closely (b), (c) and (e) agree with (a) run in float32 with identity activation:
Pearson correlation of the scores of each query's 100 passages (mean and worst query) and over
all pairs, and the largest difference; and nDCG@10 of every path on the timed queries, with its
difference from torch float32. `--ndcg` scores all judged DL19 queries with (a), (c) and (e)
instead and prints nDCG@10 of each and the difference (meaningful with a trained `--model`).

Without `--model`, a MiniLM-size cross-encoder is built from the all-MiniLM-L6-v2 checkpoint
with a random one-logit head (as `cisrank distill train` starts its student): fine for timing
and for score agreement, not for nDCG; its ONNX exports are removed at the end.

    CISRANK_DATA_DIR=../shared/data .venv/bin/python bench/cross_encoder.py \
        [--model DIR] [--queries 5 --repeats 3 --cis-queries 1] [--ndcg] [--threads 2] \
        [--no-onnx]
"""

from __future__ import annotations

import argparse
import datetime as dt
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from common import dl19_dir, gpt2_124m, machine, percentile, time_calls, write_result

from cisrank.data.datasets import load_folder
from cisrank.data.runs import Run
from cisrank.eval.metrics import evaluate
from cisrank.rerank.cross_encoder import CrossEncoderReranker
from cisrank.runtimes.onnx_export import discard

TORCH_FP32 = "torch float32"


def build_minilm_cross_encoder(out: Path) -> Path:
    """all-MiniLM-L6-v2's encoder under a random one-logit head, saved as a CrossEncoder."""
    from sentence_transformers import CrossEncoder

    from cisrank.models.resolve import resolve_model

    torch.manual_seed(0)
    model = CrossEncoder(resolve_model("all-MiniLM-L6-v2"), num_labels=1, device="cpu")
    model.save_pretrained(str(out))
    return out


def build_cis_reranker(ds, device: torch.device):
    """CIS over the GPT-2 124M-shaped model of bench/cis_engine.py."""
    from cisrank.devices import resolve_dtype
    from cisrank.lm.engine import CausalLMEngine
    from cisrank.rerank.cis import CISReranker

    model, tokenizer, _ = gpt2_124m(ds, device, resolve_dtype(None, device))
    return CISReranker(template="qa", engine=CausalLMEngine(model, tokenizer))


def corr_summary(scores: list[np.ndarray], ref: list[np.ndarray]) -> str:
    per_query = [float(np.corrcoef(s, r)[0, 1]) for s, r in zip(scores, ref, strict=True)]
    pooled = float(np.corrcoef(np.concatenate(scores), np.concatenate(ref))[0, 1])
    return (
        f"Pearson per query mean {np.mean(per_query):.4f} (worst {min(per_query):.4f}), "
        f"over all pairs {pooled:.4f}; max |diff| "
        f"{max(float(np.abs(s - r).max()) for s, r in zip(scores, ref, strict=True)):.3g}"
    )


def ndcg10(runs: dict[str, dict[str, list[tuple[str, float]]]], qrels: dict) -> dict[str, float]:
    return {
        name: evaluate(Run.from_scores(name, run), qrels, ("nDCG@10",))["nDCG@10"]
        for name, run in runs.items()
    }


def onnx_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("onnxruntime") is not None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="CrossEncoder folder (default: see above)")
    ap.add_argument("--queries", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=None, help="default: the reranker's")
    ap.add_argument("--device", default=None)
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: all)")
    ap.add_argument("--cis-queries", type=int, default=1, help="0 skips the CIS comparison")
    ap.add_argument("--cis-passages", type=int, default=100)
    ap.add_argument(
        "--ndcg", action="store_true", help="nDCG@10 of (a) and (c) on all DL19 queries instead"
    )
    ap.add_argument("--ndcg-queries", type=int, default=0, help="--ndcg on the first N only")
    ap.add_argument("--no-onnx", action="store_true", help="skip the ONNX Runtime rows (e)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    from sentence_transformers import CrossEncoder

    from cisrank.devices import resolve_device

    device = resolve_device(args.device)
    ds = load_folder(dl19_dir())
    tmp = tempfile.TemporaryDirectory()
    if args.model is None:
        path = str(build_minilm_cross_encoder(Path(tmp.name) / "minilm-ce"))
        model_desc = "all-MiniLM-L6-v2 encoder + RANDOM one-logit head (timing only, not nDCG)"
    else:
        path, model_desc = args.model, args.model

    baseline = CrossEncoder(path, device=str(device))
    identity = torch.nn.Identity()

    def predict(query: str, passages: list[str], activation=None) -> np.ndarray:
        return baseline.predict(
            [(query, p) for p in passages], activation_fn=activation, show_progress_bar=False
        )

    opts = {"model": path, "batch_size": args.batch_size, "device": args.device}
    # (b) float32; (c) the default (bf16 on GPU and on CPUs with native bf16) and int8 on CPU;
    # (e) ONNX Runtime float32 and int8 on CPU.
    default = CrossEncoderReranker(**opts)
    ours: dict[str, CrossEncoderReranker] = {}
    if default.dtype == torch.float32:
        if not args.ndcg:
            ours[TORCH_FP32] = default
    else:
        ours[f"torch {str(default.dtype).removeprefix('torch.')} (default)"] = default
        if not args.ndcg:
            ours[TORCH_FP32] = CrossEncoderReranker(dtype="float32", **opts)
    exports: list[Path] = []
    if device.type == "cpu":
        ours["torch int8 (quantize)"] = CrossEncoderReranker(quantize="int8", **opts)
        if args.no_onnx:
            pass
        elif not onnx_available():
            print("onnxruntime not installed: no ONNX rows (pip install 'cisrank[onnx]')")
        else:
            for compute in ("float32", "int8"):
                t = time.perf_counter()
                r = CrossEncoderReranker(backend="onnx", dtype=compute, **opts)
                print(
                    f"onnx {compute}: export/quantize/load {time.perf_counter() - t:.1f} s "
                    f"(export and quantization once per model folder) from {r.runner.folder}"
                )
                ours[f"onnx {compute}"] = r
                exports.append(r.runner.folder)

    print(f"# cross-encoder reranker, {model_desc}")
    print(f"machine: {machine()}; device {device}; date {dt.date.today()}")
    print(f"our batch size {default.batch_size}, predict batch size 32 (default)")
    if args.model is None:
        print("nDCG@10 below is of a RANDOM head: the differences are noise, not quality")

    if args.ndcg:
        qids = [q for q in ds.qids if ds.qrels.get(q)]
        if args.ndcg_queries:
            qids = qids[: args.ndcg_queries]
        runs: dict[str, dict[str, list[tuple[str, float]]]] = {"predict": {}}
        runs.update({name: {} for name in ours})
        seconds = dict.fromkeys(runs, 0.0)
        for qid in qids:
            query, hits = ds.topics[qid], ds.candidates[qid][:100]
            passages = [h.text for h in hits]
            t = time.perf_counter()
            values = predict(query, passages, identity)
            seconds["predict"] += time.perf_counter() - t
            runs["predict"][qid] = [(h.docid, float(v)) for h, v in zip(hits, values, strict=True)]
            for name, r in ours.items():
                t = time.perf_counter()
                values = r.score(query, passages)
                seconds[name] += time.perf_counter() - t
                runs[name][qid] = [(h.docid, v) for h, v in zip(hits, values, strict=True)]
        qrels = {q: ds.qrels[q] for q in qids}
        ndcg = ndcg10(runs, qrels)
        print(f"{len(qids)} judged DL19 queries x 100 BM25 candidates")
        for name, value in ndcg.items():
            diff = "" if name == "predict" else f"  diff vs predict {value - ndcg['predict']:+.4f}"
            print(f"{name:24s} nDCG@10 {value:.4f}{diff}  ({seconds[name]:.1f} s in all)")
        write_result(
            "cross_encoder_ndcg", {"queries": len(qids), "ndcg@10": ndcg, "seconds": seconds}
        )
        finish(exports, args.model is None, tmp)
        return

    qids = ds.qids[: args.queries]
    times: dict[str, list[float]] = {"predict (baseline)": [], **{name: [] for name in ours}}
    scores: dict[str, list[np.ndarray]] = {name: [] for name in ours}
    reference: list[np.ndarray] = []
    passage_counts = []
    runs: dict[str, dict[str, list[tuple[str, float]]]] = {name: {} for name in ours}
    for qid in qids:
        hits = ds.candidates[qid][:100]
        query, passages = ds.topics[qid], [h.text for h in hits]
        passage_counts.append(len(passages))
        reference.append(np.asarray(predict(query, passages, identity), dtype=np.float64))
        for name, r in ours.items():
            scores[name].append(np.asarray(r.score(query, passages), dtype=np.float64))
            runs[name][qid] = [
                (h.docid, float(v)) for h, v in zip(hits, scores[name][-1], strict=True)
            ]
        times["predict (baseline)"] += time_calls(
            lambda q=query, p=passages: predict(q, p), args.repeats
        )
        for name, r in ours.items():
            times[name] += time_calls(lambda q=query, p=passages, r=r: r.score(q, p), args.repeats)
        print(f"  query {query[:50]!r} done", flush=True)

    n = statistics.mean(passage_counts)
    print(f"\n{len(qids)} DL19 queries x {n:.0f} passages x {args.repeats} repeats")
    print("scores vs predict (float32, identity activation):")
    for name in scores:
        print(f"  {name:24s} {corr_summary(scores[name], reference)}")
    base = statistics.median(times["predict (baseline)"])
    fp32 = statistics.median(times[TORCH_FP32]) if TORCH_FP32 in times else None
    figures: dict = {
        "queries": len(qids),
        "passages_per_query": n,
        "repeats": args.repeats,
        "timings": {
            name: {
                "p50_s": statistics.median(values),
                "p90_s": percentile(values, 90),
                "pairs_per_s": n / statistics.median(values),
                "speed_vs_predict": base / statistics.median(values),
                "speed_vs_torch_float32": fp32 / statistics.median(values) if fp32 else None,
            }
            for name, values in times.items()
        },
    }
    for name, values in times.items():
        p50 = statistics.median(values)
        versus = f"  vs torch float32 {fp32 / p50:5.2f}x" if fp32 else ""
        print(
            f"{name:24s} p50 {p50 * 1000:8.1f} ms  p90 {percentile(values, 90) * 1000:8.1f} ms  "
            f"{n / p50:7.1f} pairs/s  speed vs predict {base / p50:5.2f}x{versus}"
        )
    qrels = {q: ds.qrels[q] for q in qids if ds.qrels.get(q)}
    if qrels and TORCH_FP32 in runs:
        judged = {name: {q: run[q] for q in qrels} for name, run in runs.items()}
        ndcg = ndcg10(judged, qrels)
        figures["ndcg@10"] = ndcg
        random = " (RANDOM head: not a quality figure)" if args.model is None else ""
        print(f"\nnDCG@10 on the {len(qrels)} judged timed queries{random}:")
        for name, value in ndcg.items():
            print(
                f"  {name:24s} {value:.4f}  diff vs torch float32 {value - ndcg[TORCH_FP32]:+.4f}"
            )

    if args.cis_queries > 0:
        cis = build_cis_reranker(ds, device)
        cis_cold, cis_warm, count = 0.0, 0.0, 0
        for qid in ds.qids[: args.cis_queries]:
            query = ds.topics[qid]
            passages = [h.text for h in ds.candidates[qid][: args.cis_passages]]
            t = time.perf_counter()
            cis.score(query, passages)  # log p(K) computed (cold prior cache)
            cis_cold += time.perf_counter() - t
            t = time.perf_counter()
            cis.score(query, passages)  # log p(K) from the in-memory cache (warm)
            cis_warm += time.perf_counter() - t
            count += len(passages)
        print(
            f"\nCIS, GPT-2 124M shape (random weights), {count} passages of "
            f"{args.cis_queries} queries: cold priors {count / cis_cold:.1f} passages/s, warm "
            f"priors {count / cis_warm:.1f} passages/s"
        )
        for name in ours:
            per_passage = statistics.median(times[name]) / n
            figures["timings"][name]["speed_vs_cis"] = {
                "cold": cis_cold / count / per_passage,
                "warm": cis_warm / count / per_passage,
            }
            print(
                f"  {name:24s} {cis_cold / count / per_passage:6.1f}x faster than CIS cold, "
                f"{cis_warm / count / per_passage:6.1f}x faster than CIS warm"
            )
    write_result("cross_encoder", figures)
    finish(exports, args.model is None, tmp)


def finish(exports: list[Path], built: bool, tmp: tempfile.TemporaryDirectory) -> None:
    """The exports of a model built for this run are of no later use: removed."""
    if built:
        for folder in dict.fromkeys(exports):
            discard(folder)
    tmp.cleanup()


if __name__ == "__main__":
    main()
