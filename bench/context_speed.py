"""Speed of RAG context assembly and entropy-based decoding against plain transformers.

Two ratios, each measured in one run on the same model, prompts and machine:

1. `curvature` on a K-passage context costs K prefill passes (the K rotations, one question
   span each): `ContextAssembler.mean_logprobs` over the K rotation prompts (the engine's
   `score_spans`: batched by length, the LM head only at the question's positions), against K
   separate plain `model(input_ids)` forwards of the same prompts (full logits, log-softmax,
   the question's tokens gathered). Both give the same numbers (checked here, 1e-3). Also the
   whole `arrange(..., "curvature")` (the K rotations, then the final prompt's gauge).
2. Each decoding mode (`naive`, `avg_ens`, `replug`, `leens`, `clehe`: `EnsembleDecoder`, K + 1
   rows in lock-step for the ensembles) generating N tokens, against `model.generate` greedy
   decoding of the naive prompt (all K passages) for the same N tokens; and the
   document-parallel modes together through `generate_many` (one prefill of the K + 1 rows
   shared by all of them) against the sum of their separate runs.

Default model: GPT-2 124M-shaped with random weights (`bench/common.py` `gpt2_124m`, a
word-level tokenizer over the passages; random weights cost the same arithmetic), passages cut to
`--passage-words` words so that K of them fit its 1,024 positions; `--model NAME` takes a real
causal LM (e.g. smollm2-135m-instruct) with whole passages. Passages: NQ-Open gold passages of
`nq-open-lim` (question 0's gold and the next K - 1).

    CISRANK_DATA_DIR=../shared/data .venv/bin/python bench/context_speed.py [--model NAME]
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import time
from pathlib import Path
from types import SimpleNamespace

import torch
from common import gpt2_124m, machine, time_calls, write_result

from cisrank.context import ContextAssembler, Decoding, rotations
from cisrank.context.decoding import EnsembleDecoder
from cisrank.data.types import Passage
from cisrank.lm.engine import CausalLMEngine


def nq_passages(path: Path, k: int, words: int) -> tuple[str, list[Passage]]:
    rows = []
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        for line in fh:
            rows.append(json.loads(line))
            if len(rows) == k:
                break
    out = []
    for i, row in enumerate(rows):
        ctx = next((c for c in row["ctxs"] if c.get("isgold")), row["ctxs"][0])
        text = " ".join(ctx["text"].split()[:words]) if words else ctx["text"]
        out.append(Passage(f"p{i}", text, ctx["title"]))
    return rows[0]["question"], out


def plain_question_logprobs(model, prompts) -> list[float]:
    """Mean log p(question | before) of each prompt, one plain full forward each."""
    out = []
    with torch.inference_mode():
        for p in prompts:
            ids = torch.tensor([p.ids], device=model.device)
            logp = torch.log_softmax(model(ids).logits[0].float(), dim=-1)
            a, b = p.span
            tgt = ids[0, a:b]
            out.append(float(logp[a - 1 : b - 1].gather(1, tgt[:, None]).mean()))
    return out


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    root = os.environ.get("CISRANK_DATA_DIR") or str(
        Path(__file__).resolve().parents[2] / "shared" / "data"
    )
    ap.add_argument(
        "--data", type=Path, default=Path(root) / "nq-open-lim/nq-open-oracle.first2000.jsonl.gz"
    )
    ap.add_argument("--model", default=None, help="a causal LM (default: GPT-2 124M shape)")
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--passage-words", type=int, default=None, help="default 60, 0 = whole")
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--modes", default=",".join(Decoding))
    ap.add_argument("--name", default=None)
    ap.add_argument("--results-dir", type=Path, default=None)
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: all)")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    words = args.passage_words if args.passage_words is not None else (0 if args.model else 60)
    question, docs = nq_passages(args.data, args.k, words)

    if args.model:
        engine = CausalLMEngine(args.model, device="cpu", dtype="float32")
        model_desc = args.model
    else:
        texts = [question] + [p.title + " " + p.text for p in docs]
        shim = SimpleNamespace(
            qids=["q"],
            topics={"q": question},
            candidates={"q": [SimpleNamespace(text=t) for t in texts]},
        )
        model, tokenizer, _ = gpt2_124m(shim, torch.device("cpu"), torch.float32)
        engine = CausalLMEngine(model, tokenizer)
        model_desc = "gpt2-124m-shape (random weights)"
    model = engine.torch_backend().model
    asm = ContextAssembler(engine, "qa")
    prompts = asm.search_prompts(question, docs, rotations(args.k))
    tokens = [len(p.ids) for p in prompts]

    # 1. curvature's K prefill passes: the engine vs K plain forwards
    def engine_pass():
        asm.clear()
        return asm.mean_logprobs(prompts)

    engine_l = engine_pass()
    plain_l = plain_question_logprobs(model, prompts)
    worst = max(abs(a - b) for a, b in zip(engine_l, plain_l, strict=True))
    assert worst < 1e-3, f"engine and plain forwards disagree by {worst}"
    t_engine = time_calls(engine_pass, args.repeats)
    t_plain = time_calls(lambda: plain_question_logprobs(model, prompts), args.repeats)

    def arrange():
        asm.clear()
        return asm.arrange(question, docs, "curvature")

    t_arrange = time_calls(arrange, args.repeats)
    curvature = {
        "k": args.k,
        "prompt_tokens_mean": statistics.mean(tokens),
        "prompt_tokens_total": sum(tokens),
        "engine_k_prefills_s": statistics.median(t_engine),
        "plain_k_forwards_s": statistics.median(t_plain),
        "engine_vs_plain_ratio": statistics.median(t_engine) / statistics.median(t_plain),
        "arrange_curvature_s": statistics.median(t_arrange),
        "max_abs_diff_engine_vs_plain": worst,
    }
    print(json.dumps({"curvature": curvature}, indent=1), flush=True)

    # 2. decoding modes vs model.generate on the naive prompt, N tokens each
    decoder = EnsembleDecoder(asm)
    naive_ids = torch.tensor([asm.render(question, docs).ids])
    pad = engine.tokenizer.pad_token_id
    pad = engine.tokenizer.eos_token_id if pad is None else pad

    def hf_generate():
        with torch.inference_mode():
            out = model.generate(
                naive_ids,
                attention_mask=torch.ones_like(naive_ids),
                max_new_tokens=args.new_tokens,
                min_new_tokens=args.new_tokens,
                do_sample=False,
                pad_token_id=pad,
            )
        assert out.shape[1] - naive_ids.shape[1] == args.new_tokens

    t_hf = statistics.median(time_calls(hf_generate, args.repeats))
    decoding: dict[str, dict[str, float]] = {}
    scores = [float(args.k - i) for i in range(args.k)]
    for mode in [m for m in args.modes.split(",") if m]:

        def run(mode=mode):
            gen = decoder.generate(
                question,
                docs,
                mode,
                max_new_tokens=args.new_tokens,
                scores=scores,
                stop_at_eos=False,
            )
            assert len(gen.tokens) == args.new_tokens

        t = statistics.median(time_calls(run, args.repeats))
        decoding[mode] = {"seconds": t, "vs_hf_generate_naive": t / t_hf}
    shared: dict[str, float] | None = None
    ensembles = [m for m in decoding if Decoding(m).ensemble]
    if len(ensembles) > 1:  # the same modes from one shared prefill (`generate_many`)

        def run_many():
            gens = decoder.generate_many(
                question,
                docs,
                ensembles,
                max_new_tokens=args.new_tokens,
                scores=scores,
                stop_at_eos=False,
            )
            assert all(len(g.tokens) == args.new_tokens for g in gens.values())

        t = statistics.median(time_calls(run_many, args.repeats))
        alone = sum(decoding[m]["seconds"] for m in ensembles)
        shared = {
            "modes": "+".join(ensembles),
            "seconds": t,
            "each_alone_s": alone,
            "vs_each_alone": t / alone,
            "vs_hf_generate_naive": t / t_hf,
        }
    result = {
        "model": model_desc,
        "machine": machine(),
        "torch_threads": torch.get_num_threads(),
        "passage_words": words,
        "repeats": args.repeats,
        "curvature": curvature,
        "decoding": {
            "new_tokens": args.new_tokens,
            "naive_prompt_tokens": int(naive_ids.shape[1]),
            "hf_generate_naive_s": t_hf,
            "modes": decoding,
            "shared_prefill": shared,
        },
    }
    print(json.dumps({"decoding": result["decoding"]}, indent=1), flush=True)
    name = args.name or (
        "context_speed" if not args.model else "context_speed_" + Path(args.model).name
    )
    print("wrote", write_result(name, result, args.results_dir))
    return result


if __name__ == "__main__":
    started = time.perf_counter()
    main()
    print(f"{time.perf_counter() - started:.0f} s")
