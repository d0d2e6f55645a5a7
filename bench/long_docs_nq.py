"""Gold recall on NQ-Open when the gold passage is buried in a long document: truncation against
max and mean pooling over windows.

Why: `cisrank eval rag` measures which reranker's top k holds the gold passage, over candidates
of one Wikipedia passage each. A RAG client more often has pages. Here every candidate (the gold
and its `related` distractors, built as `eval rag` builds them:
`cisrank.eval.rag.questions.candidate_sets`) is padded to 1,000-5,000 words by unrelated
passages (`bench/long_docs.py`'s `pad`: TREC DL22's unjudged pool, none holding one of the
question's answers), the passage itself at the start, the middle or the end. Every window is
scored once, as the server plans them (`bench/long_docs_eval.py`'s `score_query`), and pooled
three ways: `first` (what truncation sees), `max`, `mean`. The figures are `eval rag`'s: gold
recall@k (the gold among the reranker's best k) and the gold's MRR.

Resumable: each question's window scores are appended to `--out`.jsonl as it finishes (a torn
last line is dropped on reading); the summary goes to `--out`.json.

    CISRANK_DATA_DIR=../shared/data python bench/long_docs_nq.py --limit 200 --position end \\
        --out out/nq-student-end
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from long_docs import MAX_WORDS, MIN_WORDS, POSITIONS, pad
from long_docs_eval import POOLINGS, done_queries, score_query

from cisrank.data.datasets import load_folder
from cisrank.env import data_dir
from cisrank.eval.rag.answers import has_answer, normalize_answer
from cisrank.eval.rag.questions import CandidateSet, candidate_sets, load_questions
from cisrank.rerank.chunking import ChunkPlan, Splitter, pool
from cisrank.rerank.registry import load_reranker

KS = (1, 3, 5)
NQ_FILE = "nq-open-lim/nq-open-oracle.first2000.jsonl.gz"


def buried(
    cs: CandidateSet,
    filler: Sequence[tuple[str, str]],
    position: str,
    seed: int,
    words: tuple[int, int] = (MIN_WORDS, MAX_WORDS),
) -> tuple[list[str], list[int]]:
    """Each candidate's text (title and text, as `eval rag` scores it) padded by `filler`
    passages ((text, its `normalize_answer`)) that hold none of the question's answers, at
    `position`, to a length drawn from `words` (1,000-5,000; (0, 0): no padding, the baseline)
    by a `random.Random` seeded by (seed, question, candidate); and the lengths in words."""
    answers = cs.question.answers
    clean = [t for t, norm in filler if not has_answer(norm, answers, normalized=True)]
    texts, sizes = [], []
    for j, text in enumerate(cs.texts):
        rng = random.Random(f"{seed}:{cs.question.index}:{j}")
        page = pad(text, clean, position, rng, rng.randint(*words))
        texts.append(page)
        sizes.append(len(page.split()))
    return texts, sizes


def gold_figures(rows: Sequence[dict[str, Any]], pooling: str) -> dict[str, float]:
    """Gold recall@k for `KS` and the gold's MRR over the questions' logged window scores."""
    hits = {k: 0 for k in KS}
    rr = 0.0
    for row in rows:
        plan = ChunkPlan([[tuple(s) for s in spans] for spans in row["spans"]], [])
        flat = [s for doc in row["scores"] for s in doc]
        scores = [score for score, _ in pool(plan, flat, pooling)]  # type: ignore[arg-type]
        order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))
        rank = order.index(row["gold"]) + 1
        rr += 1.0 / rank
        for k in KS:
            hits[k] += rank <= k
    n = max(len(rows), 1)
    out = {f"gold_recall@{k}": hits[k] / n for k in KS}
    out["MRR"] = rr / n
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--questions", type=Path, default=None, help=f"default: $DATA/{NQ_FILE}")
    ap.add_argument("--first", type=int, default=0)
    ap.add_argument("--limit", type=int, default=200)
    ap.add_argument("--candidates", type=int, default=10)
    ap.add_argument("--position", choices=POSITIONS, default="end")
    ap.add_argument("--filler", default="trec-dl22", help="an unjudged folder's pool")
    ap.add_argument("--reranker", default="student")
    ap.add_argument("--model", default=None)
    ap.add_argument("--overlap", type=int, default=32, help="tokens consecutive windows share")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--words", default=f"{MIN_WORDS},{MAX_WORDS}", help="MIN,MAX; 0,0: unpadded (baseline)"
    )
    ap.add_argument("--out", type=Path, required=True, help="path stem of the .jsonl and .json")
    args = ap.parse_args()
    path = args.questions or data_dir() / NQ_FILE
    every = load_questions(path)
    asked = every[args.first : args.first + args.limit]
    sets, skipped = candidate_sets(asked, every, args.candidates, "related", args.seed)
    filler = list(load_folder(data_dir() / args.filler, require_qrels=False).passages().values())
    filler = [(t, normalize_answer(t)) for t in filler]  # normalized once, for has_answer
    reranker = load_reranker(args.reranker, args.model)
    window = reranker.passage_window
    splitter = Splitter(window.tokenizer if window is not None else None)
    log = args.out.with_suffix(".jsonl")
    log.parent.mkdir(parents=True, exist_ok=True)
    done = done_queries(log)
    for n, cs in enumerate(sets, 1):
        qid = str(cs.question.index)
        if qid in done:
            continue
        lo, hi = (int(x) for x in args.words.split(","))
        texts, words = buried(cs, filler, args.position, args.seed, (lo, hi))
        scores, spans, seconds = score_query(
            reranker, splitter, cs.question.question, texts, args.overlap
        )
        row = {"qid": qid, "gold": cs.gold, "words": words, "scores": scores, "spans": spans}
        row["seconds"] = seconds
        with log.open("a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")
        done[qid] = row
        print(f"{n}/{len(sets)} q{qid}: {sum(map(len, scores))} windows, {seconds:.1f} s")
    rows = [done[str(cs.question.index)] for cs in sets]
    words = [r["words"] for r in rows]
    summary: dict[str, Any] = {
        "questions_file": str(path),
        "first": args.first,
        "questions": len(rows),
        "skipped": {str(k): v for k, v in skipped.items()},
        "candidates": args.candidates,
        "position": args.position,
        "words_range": args.words,
        "reranker": args.reranker,
        "model": reranker.model_name,
        "overlap": args.overlap,
        "window": None if window is None else window.tokens,
        "windows": sum(len(s) for r in rows for s in r["scores"]),
        "windows_seconds": sum(r["seconds"] for r in rows),
        "mean_words": sum(map(sum, words)) / max(1, sum(map(len, words))),
        "pooling": {p: gold_figures(rows, p) for p in POOLINGS},
    }
    tmp = args.out.with_suffix(".json.partial")
    tmp.write_text(json.dumps(summary, indent=1), encoding="utf-8")
    tmp.replace(args.out.with_suffix(".json"))
    print(json.dumps(summary["pooling"]))


if __name__ == "__main__":
    main()
