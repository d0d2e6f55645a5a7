"""Model-thread time per budget token across scripts: English, CJK, emoji and U+10000+ text of the
same cost.

A request's cost is what admission, slicing and the per-request limit count. It was characters /
4; SmolLM2 reads a character from U+10000 up as 4 tokens, so such text cost 16x its estimate in
model time. Now the cost is the model's own token count (`cisrank.serving.token_count`). This builds,
for each script, `/v1/rerank` requests of the same cost as the server counts it (documents grown
until the counter reaches `--tokens`), and `/v1/context` curvature requests likewise, sends them
in-process to an app serving a CIS reranker on the real model, interleaved by script, and
measures the model thread's time of each (the seconds of every model call, timed in the model
thread: `BatchScorer.observe_work`) and the process's CPU seconds (on a shared host the
scheduler inflates wall-clock time; the process does nothing else meanwhile). It reports each
script's time, its ratio to the fastest (the bar: the slowest within 2x), and what characters / 4
made of the same texts (the old estimate, and the tokens per estimated token it hid). Also the
longest model call (a slice: `max_slice_s`).

    CISRANK_DATA_DIR=../shared/data HF_HUB_OFFLINE=1 .venv/bin/python bench/budget_scripts.py
    .venv/bin/python bench/budget_scripts.py --tokens 600 --repeats 1   # a quick look, ~1 min

The model is `cisrank models pull smollm2-135m-instruct`'s (or `--model`, any causal LM).
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from typing import Any

from common import add_tag_option, result_name, write_result

SCRIPTS = {
    "english": None,  # words, from a fixed sentence list
    "cjk": (0x4E00, 0x9FFF),
    "emoji": (0x1F600, 0x1F64F),
    "u10000": (0x10000, 0x10FFF),
}
SENTENCES = [
    "William Shakespeare wrote Hamlet in the first years of the seventeenth century.",
    "The river floods the valley every spring when the snow melts in the mountains.",
    "Retrieval augmented generation ranks passages before the model writes an answer.",
    "Paris is the capital of France and its largest city by population.",
]


def _text(script: str, rng: random.Random, chars: int) -> str:
    span = SCRIPTS[script]
    if span is None:
        out = ""
        while len(out) < chars:
            out += rng.choice(SENTENCES) + " "
        return out[:chars]
    return "".join(chr(rng.randrange(*span)) for _ in range(chars))


def _grow(counter: Any, script: str, rng: random.Random, tokens: int) -> str:
    """A text of `script` whose count reaches `tokens` (characters added until it does)."""
    chars = max(4, tokens // 4)
    while True:
        text = _text(script, rng, chars)
        n = counter.measure_slice([text]).counts[0]
        if n >= tokens:
            return text
        chars = int(chars * max(1.05, tokens / max(n, 1)))


def random_init(folder: str) -> str:
    """A copy of the model in `folder` (config and tokenizer) with random weights."""
    import shutil
    import tempfile
    from pathlib import Path

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    out = Path(tempfile.mkdtemp(prefix="budget-scripts-"))
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(folder)).save_pretrained(out)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (Path(folder) / name).exists():
            shutil.copy(Path(folder) / name, out / name)
    return str(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--tokens", type=int, default=1600, help="cost of each request, in tokens")
    ap.add_argument("--docs", type=int, default=4, help="documents of each request")
    ap.add_argument("--repeats", type=int, default=2, help="requests of each script and route")
    ap.add_argument("--max-slice-s", type=float, default=2.0)
    ap.add_argument("--device", default=None, help="the CIS reranker's device (cpu, cuda)")
    ap.add_argument(
        "--random-init",
        action="store_true",
        help="random weights from --model's config and tokenizer (a folder without weights: "
        "time depends on the architecture and the tokens, not on the weights' values)",
    )
    add_tag_option(ap)
    args = ap.parse_args()

    from fastapi.testclient import TestClient

    from cisrank.api.app import create_app
    from cisrank.rerank.registry import load_reranker
    from cisrank.serving.config import BatchingConfig, Limits, RerankerSpec, ServerConfig

    started = time.perf_counter()
    model = random_init(args.model) if args.random_init else args.model
    options = {"device": args.device} if args.device else {}
    reranker = load_reranker("cis", model, template="qa", **options)
    load_s = time.perf_counter() - started
    config = ServerConfig(
        rerankers={"cis": RerankerSpec(kind="cis", model=args.model)},
        limits=Limits(max_request_cost=1 << 22),
        batching=BatchingConfig(
            max_inflight_cost=1 << 22, request_timeout_s=600, max_slice_s=args.max_slice_s
        ),
    )
    app = create_app(config, rerankers={"cis": reranker}, api_keys=[])
    serving = app.state.serving
    scorer = serving.scorers["cis"]
    counter = serving.counters["cis"]
    model_calls: list[tuple[int, float]] = []
    observe = scorer.observe_work

    def recording(tokens: int, seconds: float) -> None:
        model_calls.append((tokens, seconds))
        observe(tokens, seconds)

    scorer.observe_work = recording
    query = "Who wrote the play about the prince of Denmark, and when?"
    rng = random.Random(48)
    q_tokens = counter.measure_slice([query]).counts[0]
    per_doc = max(8, args.tokens // args.docs - q_tokens)

    def requests(script: str) -> tuple[dict[str, Any], dict[str, Any], dict[str, float]]:
        docs = [_grow(counter, script, rng, per_doc) for _ in range(args.docs)]
        chars = sum(len(d) for d in docs)
        old = sum(-(-(len(query) + len(d)) // 4) for d in docs)  # characters / 4, as before
        tokens = sum(q_tokens + counter.measure_slice([d]).counts[0] for d in docs)
        rerank = {"query": query, "documents": docs}
        context = {"query": query, "documents": docs, "arrange": "curvature"}
        return rerank, context, {"chars": chars, "old_estimate": old, "tokens": tokens}

    results: dict[str, dict[str, Any]] = {
        s: {"rerank_s": [], "context_s": [], "rerank_cpu_s": [], "context_cpu_s": []}
        for s in SCRIPTS
    }
    with TestClient(app) as client:
        warm, _, _ = requests("english")
        client.post("/v1/rerank", json=warm)  # first call: allocation, kernels
        for repeat in range(args.repeats):
            order = list(SCRIPTS)[repeat % 4 :] + list(SCRIPTS)[: repeat % 4]
            for script in order:
                rerank, context, sizes = requests(script)
                results[script].update(sizes)
                for route, body in (("rerank", rerank), ("context", context)):
                    model_calls.clear()
                    cpu = time.process_time()
                    r = client.post(f"/v1/{route}", json=body)
                    results[script][f"{route}_cpu_s"].append(time.process_time() - cpu)
                    if r.status_code != 200:
                        raise SystemExit(f"{script} {route}: {r.status_code} {r.text[:300]}")
                    results[script][f"{route}_s"].append(sum(s for _, s in model_calls))
                    if route == "context":
                        results[script]["context_prompt_tokens"] = sum(t for t, _ in model_calls)
                    else:
                        results[script]["rerank_calls"] = len(model_calls)
                        results[script]["slice_s_max"] = max(s for _, s in model_calls)
    summary: dict[str, Any] = {"model": args.model, "load_s": round(load_s, 1)}
    for route in ("rerank", "context"):
        for unit in ("s", "cpu_s"):
            medians = {s: statistics.median(v[f"{route}_{unit}"]) for s, v in results.items()}
            fastest = min(medians.values())
            summary[f"{route}_{unit}_slowest_over_fastest"] = round(
                max(medians.values()) / fastest, 2
            )
            for script, seconds in medians.items():
                results[script][f"{route}_{unit}_median"] = round(seconds, 3)
                results[script][f"{route}_{unit}_vs_fastest"] = round(seconds / fastest, 2)
    for script, row in results.items():
        row["tokens_per_old_estimate"] = round(row["tokens"] / row["old_estimate"], 2)
        print(
            f"{script:>8}: {row['chars']:6d} chars, cost {row['tokens']:5d} tokens "
            f"(chars/4 said {row['old_estimate']:5d}: x{row['tokens_per_old_estimate']}); "
            f"rerank {row['rerank_s_median']:6.2f} s, {row['rerank_cpu_s_median']:6.2f} s CPU "
            f"(x{row['rerank_cpu_s_vs_fastest']}), context {row['context_s_median']:6.2f} s, "
            f"{row['context_cpu_s_median']:6.2f} s CPU (x{row['context_cpu_s_vs_fastest']}), "
            f"longest rerank model call {row['slice_s_max']:.2f} s"
        )
    print(
        "slowest / fastest, model-thread seconds: rerank "
        f"{summary['rerank_s_slowest_over_fastest']}, context "
        f"{summary['context_s_slowest_over_fastest']}; CPU seconds: rerank "
        f"{summary['rerank_cpu_s_slowest_over_fastest']}, context "
        f"{summary['context_cpu_s_slowest_over_fastest']} (bar: 2.0); slice bound "
        f"{args.max_slice_s} s"
    )
    summary.update(
        {
            "tokens_per_request": args.tokens,
            "docs": args.docs,
            "repeats": args.repeats,
            "max_slice_s": args.max_slice_s,
            "scripts": results,
        }
    )
    write_result(result_name("budget_scripts", args.tag), summary)


if __name__ == "__main__":
    main()
