"""The cross-encoder's CPU batch size, per runtime, against sentence-transformers'
`CrossEncoder.rank` with its defaults on the same weights, interleaved.

Why: cisrank's torch path trailed `CrossEncoder.rank` (0.82x on an AVX2 host:
bench/archive/RESULTS-to-2026-12-02.md, "The cross-encoder's batch on a CPU") although both run the
same model on the same threads; the one difference that matters is the batch. Pairs sorted by length
pad little at any batch size, so torch's matrix products gain from large batches, while ONNX
Runtime's dynamic int8 does best with small ones. This measures pairs/s for each runtime at each
batch size, rotating the order request by request so that load from elsewhere hits every setting
alike.

    CISRANK_DATA_DIR=../shared/data .venv/bin/python bench/cross_encoder_batch.py \
        [--model cisrank-student] [--sizes 8,16,32,64,128] [--queries 8]
"""

from __future__ import annotations

import argparse
import time

import torch
from common import add_tag_option, dl19_dir, machine_info, result_name, write_result

RUNTIMES = {
    "torch float32": {"backend": "torch", "dtype": "float32"},
    "torch bf16": {"backend": "torch", "dtype": "bfloat16"},
    "onnx int8": {"backend": "onnx", "dtype": "int8"},
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="cisrank-student")
    ap.add_argument("--sizes", default="4,8,16,32,64,128")
    ap.add_argument("--queries", type=int, default=8, help="DL19 queries x their BM25 top 100")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runtimes", default=",".join(RUNTIMES))
    add_tag_option(ap)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from sentence_transformers import CrossEncoder

    from cisrank.data.datasets import load_named
    from cisrank.models.resolve import resolve_model
    from cisrank.rerank.cross_encoder import CrossEncoderReranker

    dataset = load_named("trec-dl19", dl19_dir())
    requests = [
        (dataset.topics[q], [h.text for h in dataset.candidates[q][:100]])
        for q in dataset.qids[: args.queries]
    ]
    folder = resolve_model(args.model)
    st = CrossEncoder(folder, device="cpu", model_kwargs={"dtype": torch.float32})
    calls = {"sentence-transformers CrossEncoder.rank": lambda q, ps: st.rank(q, ps)}
    for runtime in args.runtimes.split(","):
        for size in (int(s) for s in args.sizes.split(",")):
            r = CrossEncoderReranker(folder, batch_size=size, **RUNTIMES[runtime])
            calls[f"{runtime}, batch {size}"] = lambda q, ps, r=r: r.score(q, ps)
    for call in calls.values():  # warm-up
        call(*requests[0])
    seconds = dict.fromkeys(calls, 0.0)
    names = list(calls)
    for i, (query, passages) in enumerate(requests):
        for name in names[i % len(names) :] + names[: i % len(names)]:
            started = time.perf_counter()
            calls[name](query, passages)
            seconds[name] += time.perf_counter() - started
    pairs = 100 * len(requests)
    base = pairs / seconds["sentence-transformers CrossEncoder.rank"]
    rates = {name: pairs / s for name, s in seconds.items()}
    print(
        f"{len(requests)} DL19 queries x 100, {args.threads} threads; {machine_info()['cpu_flags']}"
    )
    for name, rate in rates.items():
        print(f"{name:42s} {rate:7.1f} pairs/s  {rate / base:5.2f}x")
    write_result(
        result_name("cross_encoder_batch", args.tag),
        {
            "model": args.model,
            "queries": len(requests),
            "threads": args.threads,
            "pairs_per_s": rates,
        },
    )


if __name__ == "__main__":
    main()
