"""RAG context assembly on real NQ-Open questions (issue 14): gold position, curvature, accuracy.

Data: `nq-open-lim/nq-open-oracle.first2000.jsonl.gz` (the lost-in-the-middle NQ-Open oracle
file: question, answers, the one gold Wikipedia passage). Its 2,000 gold passages are the pool
of distractors. For each question and each K (`--k`, default 10 and 20), a context holds the gold
passage and K - 1 distractors from the other questions' passages, never one holding an answer
(normalized substring, as the accuracy) nor the gold text itself:

- `random`: drawn uniformly (the "irrelevant" passages of the Power-of-Noise study, seed 003);
- `related`: the top BM25 hits for the question over the pool (its "related" passages; the
  repo's BM25, `cisrank.retrieval.bm25.MemoryBM25`, Lucene's analysis and weights).

The context's input order ("ranked") is BM25's order of its K passages for the question (a first
stage's ranking; with `related` distractors the gold is often not first), and BM25 scores are the
reranker scores of `replug`.

Reported, per distractor kind and K (`bench/results/rag_nq_*.json`, figures and per question):

(a) the mean per-token question log-likelihood l(c) = mean log p(question | prompt before it)
    by gold position, over the K rotations of the input order (seed 000 Eq. 9: in rotation r the
    gold sits at position (g - r) mod K; the papers' U-shape, or not);
(b) how often `curvature` (seed 000 Method 2) puts the gold passage first, against chance 1/K
    (and how often BM25's input order does);
(c) answer accuracy: any gold answer, normalized (lower case, no punctuation, no articles
    a/an/the, single spaces: the SQuAD / lost-in-the-middle normalization), is a substring of the
    normalized generated answer. Modes (`--modes`): `ranked`, `reverse` (best next to the
    question), `pmi_rotation`, `curvature` (orders, generated greedily with all passages in one
    prompt, i.e. naive decoding), `noise` (seed 003's layout: `--noise` random passages of the
    pool, none holding an answer, then the context in reverse BM25 order), the document-parallel
    decodings `avg_ens`, `replug`, `leens`, `clehe` (seed 004, over the input order), and the
    baselines `closed_book` (no passage) and `gold_only`.

Everything is seeded (`--seed`): the questions are N from the file (from `--first`, default 0), the random distractors
and the noise come from `random.Random` seeded by (seed, question, K). Greedy decoding, at most
`--max-new-tokens`; with a chat model (default: when the tokenizer has a chat template) the
prompt is the user's turn, as the papers prompt instruct models.

    CISRANK_DATA_DIR=../shared/data .venv/bin/python bench/rag_nq.py --questions 200 \\
        --k 10,20 --distractors random,related --model smollm2-135m-instruct
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import re
import string
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from common import machine, write_result

from cisrank.data.types import Passage

ARRANGED = ("ranked", "reverse", "pmi_rotation", "curvature", "noise")
DECODED = ("avg_ens", "replug", "leens", "clehe")
BASELINES = ("closed_book", "gold_only")
MODES = (*ARRANGED, *DECODED, *BASELINES)
KINDS = ("random", "related")
DATA_FILE = "nq-open-lim/nq-open-oracle.first2000.jsonl.gz"


# ---------------------------------------------------------------------------- answers
_NO_PUNCTUATION = str.maketrans("", "", string.punctuation)


def normalize_answer(text: str) -> str:
    """Lower case, no punctuation, no articles, single spaces (SQuAD's `normalize_answer`, as
    the lost-in-the-middle and Power-of-Noise code score NQ)."""
    text = text.lower().translate(_NO_PUNCTUATION)
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def has_answer(text: str, answers: Sequence[str], normalized: bool = False) -> bool:
    """Whether any normalized answer is a substring of the normalized text (`normalized`: the
    text is normalized already)."""
    norm = text if normalized else normalize_answer(text)
    return any((a := normalize_answer(ans)) and a in norm for ans in answers)


# ---------------------------------------------------------------------------- data
@dataclass(frozen=True)
class Question:
    index: int
    question: str
    answers: list[str]
    gold: Passage


def load_questions(path: Path, n: int | None = None) -> list[Question]:
    """The file's first `n` questions with their gold passage (`isgold`, else the first)."""
    out: list[Question] = []
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        for line in fh:
            if n is not None and len(out) >= n:
                break
            row = json.loads(line)
            ctxs = row["ctxs"]
            gold = next((c for c in ctxs if c.get("isgold")), ctxs[0])
            i = len(out)
            out.append(
                Question(
                    i,
                    row["question"],
                    list(row["answers"]),
                    Passage(f"q{i}", gold["text"], gold["title"]),
                )
            )
    return out


class Pool:
    """The gold passages of every question in the file, deduplicated by text: the corpus of
    distractors and noise, with an in-memory BM25 over title + text."""

    def __init__(self, questions: Sequence[Question]) -> None:
        from cisrank.retrieval.bm25 import MemoryBM25

        seen: dict[str, int] = {}
        self.passages: list[Passage] = []
        for q in questions:
            if q.gold.text not in seen:
                seen[q.gold.text] = len(self.passages)
                self.passages.append(q.gold)
        self.normalized = [normalize_answer(p.contents) for p in self.passages]
        self.bm25 = MemoryBM25(
            [p.contents for p in self.passages], [p.docid for p in self.passages]
        )

    def eligible(self, q: Question, exclude: Sequence[Passage] = ()) -> list[int]:
        """Pool rows that may accompany `q`: not its gold text, no answer, not excluded."""
        banned = {q.gold.text, *(p.text for p in exclude)}
        return [
            i
            for i, p in enumerate(self.passages)
            if p.text not in banned and not has_answer(self.normalized[i], q.answers, True)
        ]

    def random(self, q: Question, n: int, rng: random.Random, exclude=()) -> list[Passage]:
        rows = self.eligible(q, exclude)
        if len(rows) < n:
            raise SystemExit(f"question {q.index}: only {len(rows)} eligible distractors")
        return [self.passages[i] for i in rng.sample(rows, n)]

    def related(self, q: Question, n: int) -> list[Passage]:
        """The top BM25 hits for the question without an answer (ties: lower pool row)."""
        ok = set(self.eligible(q))
        scores = self.bm25.scores(q.question)
        ranked = sorted(ok, key=lambda i: (-float(scores[i]), i))
        if len(ranked) < n:
            raise SystemExit(f"question {q.index}: only {len(ranked)} eligible distractors")
        return [self.passages[i] for i in ranked[:n]]

    def bm25_scores(self, question: str, passages: Sequence[Passage]) -> list[float]:
        """BM25 scores of `passages` (pool members, by text) for `question`."""
        scores = self.bm25.scores(question)
        row = {p.text: i for i, p in enumerate(self.passages)}
        return [float(scores[row[p.text]]) for p in passages]


def build_context(
    pool: Pool, q: Question, k: int, kind: str, seed: int
) -> tuple[list[Passage], list[float], int]:
    """(passages in BM25 order, their BM25 scores, the gold's index): the gold + K-1 distractors."""
    rng = random.Random(f"{seed}:{q.index}:{k}:{kind}")
    distractors = pool.random(q, k - 1, rng) if kind == "random" else pool.related(q, k - 1)
    docs = [q.gold, *distractors]
    scores = pool.bm25_scores(q.question, docs)
    order = sorted(range(k), key=lambda i: (-scores[i], i))
    return [docs[i] for i in order], [scores[i] for i in order], order.index(0)


# ---------------------------------------------------------------------------- runs
@dataclass
class Tally:
    """Per (distractor kind, K): sums over questions."""

    k: int
    questions: int = 0
    by_position: list[float] = field(default_factory=list)
    curvature_first: int = 0
    input_first: int = 0
    pmi_rotation_first: int = 0
    correct: dict[str, int] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    records: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.by_position = [0.0] * self.k

    def summary(self) -> dict[str, Any]:
        n = max(self.questions, 1)
        return {
            "k": self.k,
            "questions": self.questions,
            "loglik_by_gold_position": [s / n for s in self.by_position],
            "curvature_gold_first": self.curvature_first / n,
            "pmi_rotation_gold_first": self.pmi_rotation_first / n,
            "bm25_gold_first": self.input_first / n,
            "chance_gold_first": 1.0 / self.k,
            "accuracy": {m: c / n for m, c in self.correct.items()},
            "seconds_per_question": {m: s / n for m, s in self.seconds.items()},
        }


def run_question(asm, decoder, pool, q, k, kind, args, tally: Tally) -> None:
    from cisrank.context import rotations

    docs, bm25, gold = build_context(pool, q, k, kind, args.seed)
    rec: dict[str, Any] = {"question": q.index, "gold_input_position": gold, "answers": {}}
    modes = args.modes
    orders: dict[str, list[int]] = {"ranked": list(range(k)), "reverse": list(range(k))[::-1]}
    t = time.perf_counter()
    if {"pmi_rotation", "curvature", "positions"} & set(modes):
        res = asm.arrange(q.question, docs, "curvature")
        ls = [c.mean_logprob for c in res.candidates]
        for r, lr in enumerate(ls):  # rotation r puts the gold at (gold - r) mod K
            tally.by_position[(gold - r) % k] += lr
        orders["curvature"] = res.order
        orders["pmi_rotation"] = rotations(k)[int(np.argmax(ls))]
        tally.curvature_first += res.order[0] == gold
        tally.pmi_rotation_first += orders["pmi_rotation"][0] == gold
        rec.update(rotation_loglik=ls, curvature_scores=res.scores, curvature_order=res.order)
    tally.seconds["scoring"] = tally.seconds.get("scoring", 0.0) + time.perf_counter() - t
    tally.input_first += gold == 0
    for mode in modes:
        if mode == "positions":
            continue
        t = time.perf_counter()
        if mode in orders:
            gen = decoder.generate(
                q.question,
                [docs[i] for i in orders[mode]],
                "naive",
                max_new_tokens=args.max_new_tokens,
            )
        elif mode == "noise":
            rng = random.Random(f"{args.seed}:{q.index}:{k}:{kind}:noise")
            noise = pool.random(q, args.noise, rng, exclude=docs)
            gen = decoder.generate(
                q.question, [*noise, *docs[::-1]], "naive", max_new_tokens=args.max_new_tokens
            )
        elif mode in DECODED:
            gen = decoder.generate(
                q.question, docs, mode, max_new_tokens=args.max_new_tokens, scores=bm25
            )
        elif mode == "closed_book":
            gen = decoder.generate(q.question, [], "naive", max_new_tokens=args.max_new_tokens)
        else:  # gold_only
            gen = decoder.generate(
                q.question, [q.gold], "naive", max_new_tokens=args.max_new_tokens
            )
        ok = has_answer(gen.text, q.answers)
        tally.correct[mode] = tally.correct.get(mode, 0) + int(ok)
        tally.seconds[mode] = tally.seconds.get(mode, 0.0) + time.perf_counter() - t
        rec["answers"][mode] = {"text": gen.text, "correct": ok}
    tally.questions += 1
    tally.records.append(rec)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    root = os.environ.get("CISRANK_DATA_DIR") or str(
        Path(__file__).resolve().parents[2] / "shared" / "data"
    )
    ap.add_argument("--data", type=Path, default=Path(root) / DATA_FILE)
    ap.add_argument("--questions", type=int, default=200)
    ap.add_argument(
        "--first",
        type=int,
        default=0,
        help="index of the first question (split a long run over processes; the pool is all)",
    )
    ap.add_argument("--k", default="10,20", help="context sizes, comma-separated")
    ap.add_argument("--distractors", default="random,related")
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument(
        "--modes",
        default=",".join(("positions", *MODES)),
        help=f"positions (a, b only), {', '.join(MODES)}",
    )
    ap.add_argument("--noise", type=int, default=5, help="random passages of the noise mode")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--template", default="qa")
    ap.add_argument("--chat", choices=("auto", "on", "off"), default="auto")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default=None)
    ap.add_argument("--dtype", default=None)
    ap.add_argument("--name", default=None, help="result name (default rag_nq_q{N}_k{K...})")
    ap.add_argument("--results-dir", type=Path, default=None)
    args = ap.parse_args(argv)
    args.ks = [int(x) for x in args.k.split(",") if x.strip()]
    args.kinds = [x for x in args.distractors.split(",") if x.strip()]
    args.modes = [x for x in args.modes.split(",") if x.strip()]
    bad = [m for m in args.modes if m not in ("positions", *MODES)]
    if bad or any(x not in KINDS for x in args.kinds) or any(x < 2 for x in args.ks):
        ap.error(f"unknown mode/distractor kind or K < 2: {bad or args.kinds or args.ks}")
    return args


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    from cisrank.context import ContextAssembler
    from cisrank.context.decoding import EnsembleDecoder
    from cisrank.rerank.causal_lm import CausalLMEngine

    if not args.data.is_file():
        raise SystemExit(f"no NQ file at {args.data}: set CISRANK_DATA_DIR or pass --data")
    everything = load_questions(args.data)
    pool = Pool(everything)
    questions = everything[args.first : args.first + args.questions]
    started = time.perf_counter()
    engine = CausalLMEngine(args.model, device=args.device, dtype=args.dtype)
    load_s = time.perf_counter() - started
    chat = args.chat == "on" or (
        args.chat == "auto" and bool(getattr(engine.tokenizer, "chat_template", None))
    )
    asm = ContextAssembler(engine, args.template, chat=chat)
    decoder = EnsembleDecoder(asm)
    out: dict[str, Any] = {}
    per_question: dict[str, Any] = {}
    name = args.name or (
        f"rag_nq_q{args.first}-{args.first + len(questions)}_k{'-'.join(map(str, args.ks))}"
    )
    t0 = time.perf_counter()
    done = 0

    def record(complete: bool) -> dict[str, Any]:
        total = time.perf_counter() - t0
        return {
            "command": "bench/rag_nq.py " + " ".join(sys.argv[1:] if argv is None else argv),
            "complete": complete,
            "model": args.model,
            "chat": chat,
            "template": args.template,
            "modes": args.modes,
            "noise": args.noise,
            "max_new_tokens": args.max_new_tokens,
            "seed": args.seed,
            "pool_passages": len(pool.passages),
            "machine": machine(),
            "device": str(engine.device),
            "dtype": str(engine.dtype),
            "model_load_s": load_s,
            "seconds_total": total,
            "seconds_per_question_context": total / max(done, 1),
            "results": out,
            "per_question": per_question,
        }

    for kind in args.kinds:
        for k in args.ks:
            key = f"{kind}_k{k}"
            tally = Tally(k)
            for q in questions:
                asm.clear()
                started = time.perf_counter()
                run_question(asm, decoder, pool, q, k, kind, args, tally)
                done += 1
                # progress, and the figures so far (a long run can be read before it ends)
                out[key], per_question[key] = tally.summary(), tally.records
                write_result(name, record(False), args.results_dir)
                print(
                    f"{key} question {q.index}: {time.perf_counter() - started:.1f} s",
                    file=sys.stderr,
                    flush=True,
                )
            print(json.dumps({key: tally.summary()}, indent=1), flush=True)
    payload = record(True)
    total = payload["seconds_total"]
    n_runs = max(done, 1)
    path = write_result(name, payload, args.results_dir)
    print(f"wrote {path} ({total / n_runs:.1f} s per question and context)")
    return payload


if __name__ == "__main__":
    main()
