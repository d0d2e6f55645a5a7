"""Cross-encoder reranker latency on 100 BM25 candidates of real DL19 queries, against `predict`.

Compared in one process on identical inputs, interleaved query by query so that load from other
processes hits every method alike:

- (a) sentence-transformers `CrossEncoder.predict` with its default settings (batch 32, length
  sorting, inference mode), the code a user would write by hand: the baseline of every ratio;
- (b) `CrossEncoderReranker` in float32, not quantized (the same numbers as (a): checked);
- (c) its fast paths: the default where it is not float32 (bf16 on GPU, and on CPUs with
  native bf16: AVX512-BF16 or AMX), and `quantize="int8"` on CPU;
- (d) the CIS reranker with a GPT-2 124M-shaped model (random weights, the same model as
  bench/cis_engine.py) on the passages of the first `--cis-queries` queries.

Also prints how closely (b) and (c) agree with (a) run in float32 with identity activation:
Pearson correlation of the scores of each query's 100 passages (mean and worst query) and over
all pairs, and the largest difference. `--ndcg` scores all judged DL19 queries with (a) and (c)
instead and prints nDCG@10 of each and the difference (meaningful with a trained `--model`).

Without `--model`, a MiniLM-size cross-encoder is built from the all-MiniLM-L6-v2 checkpoint
with a random one-logit head: fine for timing and for score agreement, not for nDCG.

    CISRANK_DATA_DIR=../shared/data .venv/bin/python bench/cross_encoder.py \
        [--model DIR] [--queries 5 --repeats 3 --cis-queries 1] [--ndcg] [--threads 2]
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
    # (b) float32; (c) the default (bf16 on GPU and on CPUs with native bf16) and int8 on CPU.
    default = CrossEncoderReranker(**opts)
    ours: dict[str, CrossEncoderReranker] = {}
    if default.dtype == torch.float32:
        if not args.ndcg:
            ours["ours float32 (default)"] = default
    else:
        ours[f"ours {str(default.dtype).removeprefix('torch.')} (default)"] = default
        if not args.ndcg:
            ours["ours float32"] = CrossEncoderReranker(dtype="float32", **opts)
    if device.type == "cpu":
        ours["ours int8"] = CrossEncoderReranker(quantize="int8", **opts)

    print(f"# cross-encoder reranker, {model_desc}")
    print(f"machine: {machine()}; device {device}; date {dt.date.today()}")
    print(f"our batch size {default.batch_size}, predict batch size 32 (default)")

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
        ndcg = {
            name: evaluate(Run.from_scores(name, run), qrels, ("nDCG@10",))["nDCG@10"]
            for name, run in runs.items()
        }
        print(f"{len(qids)} judged DL19 queries x 100 BM25 candidates")
        for name, value in ndcg.items():
            diff = "" if name == "predict" else f"  diff vs predict {value - ndcg['predict']:+.4f}"
            print(f"{name:24s} nDCG@10 {value:.4f}{diff}  ({seconds[name]:.1f} s in all)")
        write_result(
            "cross_encoder_ndcg", {"queries": len(qids), "ndcg@10": ndcg, "seconds": seconds}
        )
        return

    qids = ds.qids[: args.queries]
    times: dict[str, list[float]] = {"predict (baseline)": [], **{name: [] for name in ours}}
    scores: dict[str, list[np.ndarray]] = {name: [] for name in ours}
    reference: list[np.ndarray] = []
    passage_counts = []
    for qid in qids:
        query, passages = ds.topics[qid], [h.text for h in ds.candidates[qid][:100]]
        passage_counts.append(len(passages))
        reference.append(np.asarray(predict(query, passages, identity), dtype=np.float64))
        for name, r in ours.items():
            scores[name].append(np.asarray(r.score(query, passages), dtype=np.float64))
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
    figures: dict = {
        "queries": len(qids),
        "passages_per_query": n,
        "repeats": args.repeats,
        "timings": {
            name: {
                "p50_s": statistics.median(values),
                "p90_s": percentile(values, 90),
                "speed_vs_predict": base / statistics.median(values),
            }
            for name, values in times.items()
        },
    }
    for name, values in times.items():
        p50 = statistics.median(values)
        print(
            f"{name:24s} p50 {p50 * 1000:8.1f} ms  p90 {percentile(values, 90) * 1000:8.1f} ms  "
            f"{n / p50:7.1f} passages/s  speed vs predict {base / p50:5.2f}x"
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
    tmp.cleanup()


if __name__ == "__main__":
    main()
