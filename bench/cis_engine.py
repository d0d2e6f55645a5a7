"""CIS engine speed on real DL19 queries and BM25 candidates: naive vs engine (cold / warm store).

Model: GPT-2 124M shape (12 layers, 768 dims, 12 heads, 50,257-entry vocabulary) with random
weights, and a word-level tokenizer built from the DL19 texts (padded to 50,257 entries). Random
weights are fine for speed; the scores still have to agree between the methods.

Compared in one process on identical inputs, interleaved query by query so that load from other
processes hits every method alike:

- naive: per pair, two full forwards at batch 1 with no cache, full logits, log_softmax, gather
  (`[BOS, P, D]` for log p(K|Q), `[BOS, D]` for log p(K));
- engine, cold: `CISReranker.score` with an empty prior store (priors computed and written);
- engine, warm: the same call again, every prior read from the store.

Reports pairs/s, passage tokens/s, speedups, peak resident memory, and model-FLOP utilization
against a float32 matmul peak measured in the same run. Then scores 100 passages of 512 tokens
(cold store) and reports the peak resident memory of the whole process.

    CISRANK_DATA_DIR=../shared/data .venv/bin/python bench/cis_engine.py \
        [--queries 2 --passages 30 --memory-passages 100 --memory-tokens 512]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import resource
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from common import dl19_dir, gpt2_124m, machine, write_result

from cisrank.data.datasets import load_folder
from cisrank.lm.engine import CausalLMEngine
from cisrank.rerank.cis import CISReranker
from cisrank.rerank.prior_store import PriorStore


def peak_rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2  # Linux: KiB


def matmul_peak_flops(device: torch.device, dtype: torch.dtype, n: int = 2048) -> float:
    """Best of a few n x n x n matmuls: the attainable dense FLOP/s on this machine now."""
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    best = float("inf")
    for _ in range(5):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        a @ b
        if device.type == "cuda":
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t)
    return 2 * n**3 / best


class FlopCounter:
    """Model FLOPs (matmuls only) of forwards over given sequences, GPT-2 or Llama shape."""

    def __init__(self, config) -> None:
        self.d = getattr(config, "n_embd", None) or config.hidden_size
        self.layers = getattr(config, "n_layer", None) or config.num_hidden_layers
        self.vocab = config.vocab_size
        heads = getattr(config, "n_head", None) or config.num_attention_heads
        kv_heads = getattr(config, "num_key_value_heads", None) or heads
        ff = getattr(config, "intermediate_size", None) or getattr(config, "n_inner", None)
        ff = ff or 4 * self.d
        gated = config.model_type != "gpt2"  # Llama-style SwiGLU: gate, up and down matrices
        # per token per layer, MACs: q and output projections d^2 each, k and v d * kv_dim each
        # (grouped-query attention), the MLP 2 or 3 d*ff matrices. GPT-2: 12 d^2.
        attn = 2 * self.d**2 + 2 * self.d * (kv_heads * self.d // heads)
        mlp = (3 if gated else 2) * self.d * ff
        self.body_per_token = 2 * (attn + mlp) * self.layers

    def forward(self, new_tokens: int, context_before: int, head_rows: int) -> float:
        """FLOPs of `new_tokens` tokens after `context_before` cached ones, head on `head_rows`."""
        # attention: QK^T and AV, each 2*d FLOPs per (query, key) pair, causal
        keys = sum(context_before + i + 1 for i in range(new_tokens))
        attn = 2 * 2 * self.d * keys * self.layers
        return self.body_per_token * new_tokens + attn + 2 * self.d * self.vocab * head_rows


def naive_pair(model, bos: int, prefix: list[int], doc: list[int]) -> float:
    """CIS by the book: two full forwards, batch 1, no cache, full logits."""
    out = []
    for ctx in ([bos, *prefix], [bos]):
        ids = torch.tensor([ctx + doc], device=model.device)
        logits = model(input_ids=ids, use_cache=False).logits[0].float()
        lp = torch.log_softmax(logits, dim=-1)
        pos = torch.arange(len(ctx) - 1, len(ctx) - 1 + len(doc), device=ids.device)
        out.append(float(lp[pos, torch.tensor(doc, device=ids.device)].double().sum()))
    return out[0] - out[1]


def naive_span(model, context: list[int], target: list[int]) -> float:
    """log p(target | context) by the book: one full forward at batch 1, no cache, full logits."""
    ids = torch.tensor([context + target], device=model.device)
    logits = model(input_ids=ids, use_cache=False).logits[0].float()
    lp = torch.log_softmax(logits, dim=-1)
    pos = torch.arange(len(context) - 1, len(context) - 1 + len(target), device=ids.device)
    return float(lp[pos, torch.tensor(target, device=ids.device)].double().sum())


def real_model(name: str, device, dtype):
    """A pulled catalogue model, HF id or folder, loaded as cisrank loads it."""
    engine = CausalLMEngine(name, device=str(device), dtype=str(dtype).removeprefix("torch."))
    return engine.torch_backend().model, engine.tokenizer, engine.torch_backend().model.config


def reverse_speed(model, engine, work, args, flops: FlopCounter) -> dict:
    """The reverse estimator, log p(Q|K) under the passage-first template: plain forwards of
    each rendered (passage, query) pair at batch 1 against the engine's length-batched spans,
    on the same pairs, interleaved query by query."""
    reranker = CISReranker(
        estimator="reverse", max_doc_tokens=args.max_doc_tokens, engine=engine, normalize="sum"
    )
    times = {"naive": 0.0, "engine": 0.0}
    got: dict[str, list[float]] = {"naive": [], "engine": []}
    pairs = tokens = 0
    flop = 0.0
    for query, passages in work:
        docs = reranker.passage_ids(passages)
        spans = [
            reranker.reverse_template.ids(engine.encode, engine.bos_id, d, query) for d in docs
        ]
        pairs += len(spans)
        tokens += sum(len(c) + len(t) for c, t in spans)
        flop += sum(flops.forward(len(c) + len(t), 0, len(t)) for c, t in spans)
        t0 = time.perf_counter()
        with torch.inference_mode():
            got["naive"] += [naive_span(model, c, t) for c, t in spans]
        times["naive"] += time.perf_counter() - t0
        t0 = time.perf_counter()
        got["engine"] += reranker.reverse_batch([(query, passages)])[0]
        times["engine"] += time.perf_counter() - t0
    diff = float(np.abs(np.array(got["engine"]) - np.array(got["naive"])).max())
    out = {"pairs": pairs, "tokens": tokens, "max_abs_diff_vs_naive": diff, "methods": {}}
    print(f"\nreverse estimator: {pairs} pairs, {tokens} tokens; max |engine - naive| {diff:.2e}")
    for m, s in times.items():
        row = {
            "seconds": s,
            "pairs_per_s": pairs / s,
            "tokens_per_s": tokens / s,
            "speedup_vs_naive": times["naive"] / s,
            "model_gflops_per_s": flop / s / 1e9,
        }
        out["methods"][m] = row
        print(
            f"{m:6s} {s:8.2f}s {row['pairs_per_s']:8.2f} pairs/s {row['tokens_per_s']:9.1f} tok/s "
            f"{row['speedup_vs_naive']:6.2f}x"
        )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--queries", type=int, default=2)
    ap.add_argument("--passages", type=int, default=30, help="BM25 candidates per query")
    ap.add_argument("--max-doc-tokens", type=int, default=512)
    ap.add_argument("--template", default="qa")
    ap.add_argument("--memory-passages", type=int, default=100, help="0 skips the memory check")
    ap.add_argument("--memory-tokens", type=int, default=512)
    ap.add_argument("--device", default=None)
    ap.add_argument("--dtype", default=None)
    ap.add_argument("--batch-tokens", type=int, default=None)
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: all)")
    ap.add_argument("--json", type=Path, default=None, help="also write the figures here")
    ap.add_argument(
        "--model",
        default=None,
        help="a real causal LM (catalogue name, HF id or folder) instead of the random GPT-2 "
        "124M shape; also times the reverse estimator against plain forwards",
    )
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    from cisrank.devices import resolve_device, resolve_dtype

    device = resolve_device(args.device)
    dtype = resolve_dtype(args.dtype, device)
    ds = load_folder(dl19_dir())
    if args.model:
        model, tokenizer, config = real_model(args.model, device, dtype)
    else:
        model, tokenizer, config = gpt2_124m(ds, device, dtype)
    engine = CausalLMEngine(model, tokenizer, batch_tokens=args.batch_tokens)
    flops = FlopCounter(config)
    peak = matmul_peak_flops(device, dtype)
    print(f"# {machine()}; device {device}, dtype {dtype}")
    print(f"# matmul peak (2048^3, {dtype}): {peak / 1e9:.1f} GFLOP/s")

    # Warm-up (lazy kernel init, allocator) so that no method pays it inside its timing.
    warm_ids = engine.encode(ds.topics[ds.qids[-1]])
    with torch.inference_mode():
        naive_pair(model, engine.bos_id, warm_ids, warm_ids)
    engine.score_continuations([engine.bos_id, *warm_ids], [warm_ids, warm_ids[:-1]])

    qids = ds.qids[: args.queries]
    work = [(ds.topics[q], [h.text for h in ds.candidates[q][: args.passages]]) for q in qids]
    timings = {"naive": 0.0, "cold": 0.0, "warm": 0.0}
    scores: dict[str, list[float]] = {"naive": [], "cold": [], "warm": []}
    flop_total = {"naive": 0.0, "cold": 0.0, "warm": 0.0}
    pairs = doc_tokens = 0
    with tempfile.TemporaryDirectory() as tmp:
        store = PriorStore(Path(tmp) / "priors.sqlite")
        reranker = CISReranker(
            template=args.template,
            max_doc_tokens=args.max_doc_tokens,
            prior_store=store,
            engine=engine,
        )
        for query, passages in work:
            prefix = reranker.prefix_ids(query)[1:]
            docs = reranker.passage_ids(passages)
            pairs += len(docs)
            doc_tokens += sum(len(d) for d in docs)
            p = len(prefix) + 1
            for d in docs:
                flop_total["naive"] += flops.forward(p + len(d), 0, p + len(d))
                flop_total["naive"] += flops.forward(1 + len(d), 0, 1 + len(d))
            uniq = {tuple(d) for d in docs}
            cond = sum(flops.forward(len(d), p, len(d)) for d in uniq) + flops.forward(p, 0, 0)
            prior = sum(flops.forward(len(d), 1, len(d)) for d in uniq) + flops.forward(1, 0, 0)
            flop_total["cold"] += cond + prior
            flop_total["warm"] += cond

            t = time.perf_counter()
            with torch.inference_mode():
                naive = [naive_pair(model, engine.bos_id, prefix, d) for d in docs]
            timings["naive"] += time.perf_counter() - t
            misses0 = store.stats()["misses"]
            t = time.perf_counter()
            cold = reranker.score(query, passages)
            timings["cold"] += time.perf_counter() - t
            cold_misses = store.stats()["misses"] - misses0
            hits0 = store.stats()["hits"]
            t = time.perf_counter()
            warm = reranker.score(query, passages)
            timings["warm"] += time.perf_counter() - t
            warm_hits = store.stats()["hits"] - hits0
            assert cold_misses == len(passages), (cold_misses, len(passages))
            assert warm_hits == len(passages), (warm_hits, len(passages))
            scores["naive"] += naive
            scores["cold"] += cold
            scores["warm"] += warm
            print(
                f"  query {query[:40]!r}: naive {timings['naive']:.1f}s "
                f"cold {timings['cold']:.1f}s warm {timings['warm']:.1f}s (cumulative)",
                flush=True,
            )
        store.close()

    ref = np.array(scores["naive"])
    diff = {m: float(np.abs(np.array(scores[m]) - ref).max()) for m in ("cold", "warm")}
    rank_ok = all(
        list(np.argsort(-np.array(scores[m]), kind="stable"))
        == list(np.argsort(-ref, kind="stable"))
        for m in ("cold", "warm")
    )
    result: dict = {
        "date": dt.date.today().isoformat(),
        "machine": machine(),
        "device": str(device),
        "dtype": str(dtype),
        "queries": len(work),
        "pairs": pairs,
        "passage_tokens": doc_tokens,
        "matmul_peak_gflops": peak / 1e9,
        "max_abs_diff_vs_naive": diff,
        "same_ranking_as_naive": rank_ok,
        "methods": {},
    }
    print(f"\n{pairs} pairs, {doc_tokens} passage tokens, template {args.template!r}")
    print(f"max |score - naive|: cold {diff['cold']:.2e}, warm {diff['warm']:.2e}")
    print("method  seconds  pairs/s  passage tok/s  speedup  GFLOP/s   MFU")
    for m in ("naive", "cold", "warm"):
        s = timings[m]
        gf = flop_total[m] / s / 1e9
        row = {
            "seconds": s,
            "pairs_per_s": pairs / s,
            "passage_tokens_per_s": doc_tokens / s,
            "speedup_vs_naive": timings["naive"] / s,
            "model_gflops_per_s": gf,
            "mfu": flop_total[m] / s / peak,
        }
        result["methods"][m] = row
        print(
            f"{m:6s} {s:8.2f} {row['pairs_per_s']:8.2f} {row['passage_tokens_per_s']:14.1f} "
            f"{row['speedup_vs_naive']:7.2f}x {gf:8.1f} {row['mfu']:6.1%}"
        )
    if args.model:
        result["reverse"] = reverse_speed(model, engine, work, args, flops)
    result["peak_rss_gb_after_speed"] = peak_rss_gb()

    if args.memory_passages > 0:
        pool = [h.text for q in ds.qids for h in ds.candidates[q]]
        long_passages, cur, i = [], [], 0
        while len(long_passages) < args.memory_passages:
            cur.append(pool[i % len(pool)])
            i += 1
            if len(engine.encode(" ".join(cur))) >= args.memory_tokens:
                long_passages.append(" ".join(cur))
                cur = []
        with tempfile.TemporaryDirectory() as tmp:
            r = CISReranker(
                template=args.template,
                max_doc_tokens=args.memory_tokens,
                prior_store=Path(tmp) / "priors.sqlite",
                engine=engine,
            )
            lens = [len(d) for d in r.passage_ids(long_passages)]
            t = time.perf_counter()
            out = r.score(ds.topics[ds.qids[0]], long_passages)
            secs = time.perf_counter() - t
            r.prior_store.close()
        assert len(out) == len(long_passages) and all(np.isfinite(out))
        rss = peak_rss_gb()
        result["memory_check"] = {
            "passages": len(long_passages),
            "tokens_per_passage": [min(lens), max(lens)],
            "seconds_cold": secs,
            "peak_rss_gb": rss,
            "under_3gb": rss < 3.0,
        }
        print(
            f"\nmemory: {len(long_passages)} passages x {min(lens)}-{max(lens)} tokens scored "
            f"(cold store) in {secs:.1f}s; peak RSS of the process {rss:.2f} GB"
        )
    if device.type == "cuda":
        result["peak_cuda_gb"] = torch.cuda.max_memory_allocated() / 1024**3
    print(json.dumps(result, indent=2))
    name = "cis_engine"
    if args.model:
        name += "_" + Path(args.model).name.replace(".", "_")
        result["model"] = args.model
    write_result(name, result)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
