"""Answers of `cisrank eval rag` decoded side by side (`answer_each`) against one at a time
(`answer_question`), with the same model, prompts and thread, interleaved chunk by chunk.

Why: on a CPU a small model's decoding step costs its layers' overhead more than its arithmetic
(SmolLM2-135M: about 0.1 s a step at one row, float32 or bf16 alike), and an eval answers
thousands of prompts of 32 tokens; rows decoded together share each step. The prompts are the
eval's mix: NQ-Open questions (`nq-open-oracle.first2000`) with k = 0 (closed book), 1, 3 and 5
passages (the gold first, then the next questions' gold passages), the eval's setting (`qa`
template in the chat template, `reverse` arrangement, greedy, 32 new tokens), sorted by length
and cut into chunks of `--chunk` as `cisrank eval rag` deals them. Reported: seconds per
prompt each way, the ratio, and how many answers are token for token the same.

    CISRANK_DATA_DIR=../shared/data .venv/bin/python bench/answer_each.py [--prompts 32]
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import time
from pathlib import Path

import torch
from common import add_tag_option, report, result_name

from cisrank.context import (
    ArrangeConfig,
    ContextAssembler,
    EnsembleDecoder,
    answer_each,
    answer_question,
)
from cisrank.data.types import Passage
from cisrank.eval.rag.run import PROMPTS_PER_CALL
from cisrank.lm.engine import CausalLMEngine


def prompts(path: Path, n: int) -> list[tuple[str, list[Passage]]]:
    rows = []
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        for line in fh:
            rows.append(json.loads(line))
            if len(rows) == n + 5:
                break

    def gold(i: int) -> Passage:
        ctx = next((c for c in rows[i]["ctxs"] if c.get("isgold")), rows[i]["ctxs"][0])
        return Passage(f"q{i}", ctx["text"], ctx["title"])

    ks = (0, 1, 3, 5)
    return [(rows[i]["question"], [gold(i + j) for j in range(ks[i % 4])]) for i in range(n)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--chunk", type=int, default=PROMPTS_PER_CALL)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (the eval's: 1)")
    ap.add_argument("--dtype", default=None, help="the generator's (default: the engine's)")
    add_tag_option(ap)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    data = Path(os.environ.get("CISRANK_DATA_DIR", "../shared/data"))
    items = prompts(data / "nq-open-lim" / "nq-open-oracle.first2000.jsonl.gz", args.prompts)
    engine = CausalLMEngine(args.model, dtype=args.dtype)
    assembler = ContextAssembler(engine, "qa", chat=bool(engine.tokenizer.chat_template))
    decoder = EnsembleDecoder(assembler, max_new_tokens=32)
    arrange = ArrangeConfig().replace(arrange="reverse")
    lengths = [len(assembler.render(q, ps).ids) for q, ps in items]
    order = sorted(range(len(items)), key=lambda i: lengths[i])
    chunks = [order[a : a + args.chunk] for a in range(0, len(order), args.chunk)]
    answer_each(decoder, items[:2], arrange)  # warm-up
    seconds = {"one at a time": 0.0, "side by side": 0.0}
    alone: dict[int, list[int]] = {}
    together: dict[int, list[int]] = {}
    for c, chunk in enumerate(chunks):
        for way in list(seconds)[c % 2 :] + list(seconds)[: c % 2]:  # rotated chunk by chunk
            assembler.clear()
            started = time.perf_counter()
            if way == "one at a time":
                for i in chunk:
                    q, ps = items[i]
                    alone[i] = answer_question(
                        decoder, q, ps, arrange if ps else ArrangeConfig()
                    ).generation.tokens
            else:
                got = answer_each(decoder, [items[i] for i in chunk], arrange)
                together.update({i: a.generation.tokens for i, a in zip(chunk, got, strict=True)})
            seconds[way] += time.perf_counter() - started
        print(f"chunk {c + 1}/{len(chunks)}: {seconds}", flush=True)
    n = len(items)
    report(
        result_name("answer_each", args.tag),
        {
            "model": args.model,
            "compute_type": str(engine.compute_type),
            "threads": args.threads,
            "prompts": n,
            "chunk": args.chunk,
            "prompt_tokens_min_median_max": [
                min(lengths),
                sorted(lengths)[n // 2],
                max(lengths),
            ],
            "answer_tokens_mean": sum(len(t) for t in alone.values()) / n,
            "s_per_prompt_one_at_a_time": seconds["one at a time"] / n,
            "s_per_prompt_side_by_side": seconds["side by side"] / n,
            "side_by_side_speedup": seconds["one at a time"] / seconds["side by side"],
            "same_tokens": sum(alone[i] == together[i] for i in range(n)),
        },
    )


if __name__ == "__main__":
    main()
