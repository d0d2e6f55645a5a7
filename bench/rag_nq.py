"""RAG context assembly on real NQ-Open questions: gold position, curvature, accuracy.

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

Cost, per question and context on one CPU core at K = 10 (SmolLM2-135M): the K rotation
prefills of (a) and (b) about 66 s, each naive generation 6-10 s, the four document-parallel
decodings together about 25 s (`EnsembleDecoder.generate_many`: one prefill of the K + 1 rows
serves all four). A long run splits over processes with `--first`/`--questions`; a later run
can add modes to the same questions with `--reuse EARLIER.json` (it reads the rotation scores,
after re-scoring one question per block to check them), and `--merge A.json B.json ...` joins
the per-question records into one result with the figures of all the questions. The result is
rewritten (atomically) after every question; `--resume` with the same `--name` keeps the
questions it holds and runs the rest, so a run killed midway, or spread over several days,
loses at most the question in flight.
`bench/rag_nq_report.py RESULT.json` turns a result into the tables of `bench/RESULTS.md`, with
standard errors and exact binomial and McNemar tests.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from common import RESULTS_DIR, machine, write_result
from rag_nq_report import gold_position_loglik

# The questions, the pool of distractors and the contexts are those of `cisrank eval rag` (a
# context is its candidate set); the tests read them here.
from cisrank.eval.rag.answers import has_answer, normalize_answer  # noqa: F401
from cisrank.eval.rag.questions import Pool, load_questions
from cisrank.eval.rag.questions import build_candidates as build_context

ARRANGED = ("ranked", "reverse", "pmi_rotation", "curvature", "noise")
DECODED = ("avg_ens", "replug", "leens", "clehe")
BASELINES = ("closed_book", "gold_only")
MODES = (*ARRANGED, *DECODED, *BASELINES)
KINDS = ("random", "related")
DATA_FILE = "nq-open-lim/nq-open-oracle.first2000.jsonl.gz"


# ---------------------------------------------------------------------------- runs
@dataclass
class Tally:
    """Per (distractor kind, K): sums over the questions' records, whichever run made them (this
    one, an earlier one being resumed, or the several runs of a `--merge`)."""

    k: int
    questions: int = 0
    scored: int = 0
    by_position: list[float] = field(default_factory=list)
    curvature_first: int = 0
    input_first: int = 0
    pmi_rotation_first: int = 0
    correct: dict[str, int] = field(default_factory=dict)
    ran: dict[str, int] = field(default_factory=dict)
    seconds: dict[str, list[float]] = field(default_factory=dict)  # mode: [total, questions]
    records: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.by_position = [0.0] * self.k

    def add(self, rec: dict[str, Any]) -> None:
        gold = rec["gold_input_position"]
        ls = rec.get("rotation_loglik")
        if ls is not None:
            self.scored += 1
            for pos, lr in enumerate(gold_position_loglik(rec, self.k)):
                self.by_position[pos] += lr
            self.curvature_first += rec["curvature_order"][0] == gold
            self.pmi_rotation_first += int(np.argmax(ls)) == gold  # rotation r puts r first
        self.input_first += gold == 0
        for mode, ans in rec["answers"].items():
            self.correct[mode] = self.correct.get(mode, 0) + int(ans["correct"])
            self.ran[mode] = self.ran.get(mode, 0) + 1
        self.questions += 1
        self.records.append(rec)

    def spend(self, what: str, seconds: float, questions: int = 1) -> None:
        total = self.seconds.setdefault(what, [0.0, 0])
        total[0] += seconds
        total[1] += questions

    def summary(self) -> dict[str, Any]:
        n, scored = max(self.questions, 1), max(self.scored, 1)
        return {
            "k": self.k,
            "questions": self.questions,
            "questions_scored": self.scored,
            "loglik_by_gold_position": [s / scored for s in self.by_position],
            "curvature_gold_first": self.curvature_first / scored,
            "pmi_rotation_gold_first": self.pmi_rotation_first / scored,
            "bm25_gold_first": self.input_first / n,
            "chance_gold_first": 1.0 / self.k,
            "accuracy": {m: c / self.ran[m] for m, c in self.correct.items()},
            "questions_per_mode": dict(self.ran),
            "seconds_per_question": {m: t / c for m, (t, c) in self.seconds.items() if c},
        }

    def spent_before(self, summary: dict[str, Any], skip_scoring: bool = False) -> None:
        """The time an earlier result's summary reports, weighted by its questions (per-question
        seconds are not recorded); `skip_scoring` for a run that read its scores back."""
        per_mode = summary.get("questions_per_mode", {})
        for m, v in summary["seconds_per_question"].items():
            if not (m == "scoring" and skip_scoring):
                n = per_mode.get(m, summary["questions"])
                self.spend(m, v * n, n)


def reused_scores(paths: Sequence[Path], args: argparse.Namespace) -> dict[tuple[str, int], dict]:
    """Rotation scores of earlier runs, by (kind_kK, question): the K rotation prefills are a
    question's costliest step and deterministic, so a later run that adds modes (the accuracy
    of other arrangements) reads them instead of paying again. Only runs with the same model,
    prompt and seed qualify; `main` re-scores one question per block and compares."""
    out: dict[tuple[str, int], dict] = {}
    for path in paths:
        res = json.loads(Path(path).read_text())["results"]
        same = (res["model"], res["template"], res["seed"]) == (
            args.model,
            args.template,
            args.seed,
        )
        if not same:
            raise SystemExit(f"{path}: another model, template or seed; cannot reuse its scores")
        for key, recs in res["per_question"].items():
            for rec in recs:
                if "rotation_loglik" in rec:
                    out[(key, int(rec["question"]))] = rec
    return out


def run_question(asm, decoder, pool, q, k, kind, args, tally: Tally, reuse=None) -> None:
    from cisrank.context import rotations

    docs, bm25, gold = build_context(pool, q, k, kind, args.seed)
    rec: dict[str, Any] = {"question": q.index, "gold_input_position": gold, "answers": {}}
    modes = args.modes
    orders: dict[str, list[int]] = {"ranked": list(range(k)), "reverse": list(range(k))[::-1]}
    t = time.perf_counter()
    if {"pmi_rotation", "curvature", "positions"} & set(modes):
        if reuse is not None:
            if reuse["gold_input_position"] != gold or len(reuse["rotation_loglik"]) != k:
                raise SystemExit(f"question {q.index}: the reused record has another context")
            ls, order = list(reuse["rotation_loglik"]), list(reuse["curvature_order"])
            rec.update(curvature_scores=reuse["curvature_scores"], reused_scores=True)
        else:
            res = asm.order(q.question, docs, "curvature")  # K prefills, no gauge of the result
            ls, order = [c.mean_logprob for c in res.candidates], res.order
            rec.update(curvature_scores=res.scores)
        orders["curvature"] = order
        orders["pmi_rotation"] = rotations(k)[int(np.argmax(ls))]
        rec.update(rotation_loglik=ls, curvature_order=order)
    tally.spend("scoring", time.perf_counter() - t)
    answers: dict[str, Any] = {}
    decoded = [m for m in modes if m in DECODED]
    if decoded:  # one prefill of the K + 1 rows serves every document-parallel mode
        t = time.perf_counter()
        answers.update(
            decoder.generate_many(
                q.question, docs, decoded, max_new_tokens=args.max_new_tokens, scores=bm25
            )
        )
        tally.spend("document_parallel", time.perf_counter() - t)
    for mode in modes:
        if mode == "positions" or mode in DECODED:
            continue
        t = time.perf_counter()
        if mode in orders:
            passages = [docs[i] for i in orders[mode]]
        elif mode == "noise":
            rng = random.Random(f"{args.seed}:{q.index}:{k}:{kind}:noise")
            passages = [*pool.random(q, args.noise, rng, exclude=docs), *docs[::-1]]
        elif mode == "closed_book":
            passages = []
        else:  # gold_only
            passages = [q.gold]
        answers[mode] = decoder.generate(
            q.question, passages, "naive", max_new_tokens=args.max_new_tokens
        )
        tally.spend(mode, time.perf_counter() - t)
    for mode in modes:
        if mode in answers:
            ok = has_answer(answers[mode].text, q.answers)
            rec["answers"][mode] = {"text": answers[mode].text, "correct": ok}
    tally.add(rec)


def merge(paths: Sequence[Path]) -> tuple[dict[str, Any], dict[str, Any]]:
    """One summary per block from the per-question records of several runs (a long run split
    over processes with `--first`, or a later run that added modes to the same questions): the
    figures one run over all of them would give. Records of one question are joined (their
    contexts must agree; a mode answered twice keeps the later file's answer); each accuracy
    is over the questions that ran the mode, each time per question over the runs that
    measured it (scoring time not from runs that reused the scores)."""
    blocks: dict[str, dict[int, dict]] = {}
    tallies: dict[str, Tally] = {}
    for path in paths:
        res = json.loads(Path(path).read_text())["results"]
        for key, summary in res["results"].items():
            recs = res["per_question"][key]
            tally = tallies.setdefault(key, Tally(int(key.rsplit("_k", 1)[1])))
            tally.spent_before(summary, skip_scoring=any(r.get("reused_scores") for r in recs))
            for rec in recs:
                have = blocks.setdefault(key, {}).get(int(rec["question"]))
                if have is None:
                    blocks[key][int(rec["question"])] = json.loads(json.dumps(rec))
                    continue
                if have["gold_input_position"] != rec["gold_input_position"]:
                    raise SystemExit(f"{path}: question {rec['question']} has another context")
                have["answers"].update(rec["answers"])
                for f in ("rotation_loglik", "curvature_order", "curvature_scores"):
                    if have.get(f) is None and rec.get(f) is not None:
                        have[f] = rec[f]
    out: dict[str, Any] = {}
    per_question: dict[str, Any] = {}
    for key, recs in blocks.items():
        tally = tallies[key]
        for _, rec in sorted(recs.items()):
            tally.add(rec)
        out[key], per_question[key] = tally.summary(), tally.records
    return out, per_question


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
    ap.add_argument(
        "--reuse",
        type=Path,
        action="append",
        default=[],
        help="an earlier result file whose rotation scores to read instead of recomputing "
        "(same model, template and seed; one question per block is re-scored as a check)",
    )
    ap.add_argument(
        "--merge",
        type=Path,
        nargs="+",
        default=None,
        help="no model run: combine these result files' per-question records into --name",
    )
    ap.add_argument(
        "--resume",
        action="store_true",
        help="keep the questions that the result of the same --name already holds (same "
        "settings) and run the others: a run killed or spread over days goes on where it stopped",
    )
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: all)")
    ap.add_argument(
        "--workers",
        type=int,
        default=1,
        help="split the questions over N processes of one torch thread each (one per core), "
        "each a run of its own (NAME_partI, resumable), merged into NAME at the end",
    )
    args = ap.parse_args(argv)
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    args.ks = [int(x) for x in args.k.split(",") if x.strip()]
    args.kinds = [x for x in args.distractors.split(",") if x.strip()]
    args.modes = [x for x in args.modes.split(",") if x.strip()]
    bad = [m for m in args.modes if m not in ("positions", *MODES)]
    if bad or any(x not in KINDS for x in args.kinds) or any(x < 2 for x in args.ks):
        ap.error(f"unknown mode/distractor kind or K < 2: {bad or args.kinds or args.ks}")
    return args


def run_parts(args: argparse.Namespace, argv: Sequence[str]) -> dict[str, Any]:
    """`--workers N`: N processes of this script, contiguous question ranges, one torch thread
    each, then `--merge` of their result files: the questions' records are the ones a single
    process writes (each question is scored alone)."""
    import subprocess

    name = (
        args.name
        or f"rag_nq_q{args.first}-{args.first + args.questions}_k{'-'.join(map(str, args.ks))}"
    )
    drop = {"--workers", "--first", "--questions", "--name", "--threads"}
    passed: list[str] = []
    skip = False
    for item in argv:
        if skip:
            skip = False
            continue
        key = item.split("=", 1)[0]
        if key in drop:
            skip = "=" not in item
            continue
        passed.append(item)
    step = -(-args.questions // args.workers)
    parts, procs = [], []
    for i in range(args.workers):
        first = args.first + i * step
        count = min(step, args.first + args.questions - first)
        if count <= 0:
            break
        part = f"{name}_part{i}"
        parts.append(part)
        cmd = [sys.executable, __file__, *passed, "--first", str(first)]
        cmd += ["--questions", str(count), "--name", part, "--threads", "1"]
        procs.append(subprocess.Popen(cmd))
    if any(p.wait() != 0 for p in procs):
        raise SystemExit("a worker failed: rerun the same command with --resume")
    results = args.results_dir or RESULTS_DIR
    merged = argparse.Namespace(**{**vars(args), "merge": [results / f"{p}.json" for p in parts]})
    merged.name = name
    return merge_files(merged)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    if args.merge:
        return merge_files(args)
    if args.workers > 1:
        return run_parts(args, list(argv if argv is not None else sys.argv[1:]))
    from cisrank.context import ContextAssembler
    from cisrank.context.decoding import EnsembleDecoder
    from cisrank.lm.engine import CausalLMEngine

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
    previous = earlier_result(name, args, chat) if args.resume else None
    t0 = time.perf_counter() - (previous["seconds_total"] if previous else 0.0)
    done = sum(map(len, previous["per_question"].values())) if previous else 0
    if previous:
        print(f"resuming {name}: {done} question records kept", file=sys.stderr)

    def record(complete: bool) -> dict[str, Any]:
        total = time.perf_counter() - t0
        return {
            "command": "bench/rag_nq.py " + " ".join(sys.argv[1:] if argv is None else argv),
            "complete": complete,
            **settings(args, chat),
            "pool_passages": len(pool.passages),
            "machine": machine(),
            "device": str(engine.device),
            "dtype": f"torch.{engine.compute_type}",  # as earlier result files hold it
            "model_load_s": load_s,
            "seconds_total": total,
            "seconds_per_question_context": total / max(done, 1),
            "results": out,
            "per_question": per_question,
        }

    reuse = reused_scores(args.reuse, args)
    for kind in args.kinds:
        for k in args.ks:
            key = f"{kind}_k{k}"
            tally = Tally(k)
            if previous and key in previous["per_question"]:
                for rec in previous["per_question"][key]:
                    tally.add(rec)
                tally.spent_before(previous["results"][key])
                out[key], per_question[key] = tally.summary(), tally.records
            recorded = {int(rec["question"]) for rec in tally.records}
            checked = False
            for q in questions:
                if q.index in recorded:
                    continue
                asm.clear()
                started = time.perf_counter()
                old = reuse.get((key, q.index))
                if old is not None and not checked:  # the reused scores are what we compute
                    fresh = Tally(k)
                    run_question(asm, decoder, pool, q, k, kind, args_for(args, []), fresh)
                    gap = np.abs(
                        np.subtract(fresh.records[0]["rotation_loglik"], old["rotation_loglik"])
                    ).max()
                    if gap > 1e-4:
                        raise SystemExit(f"{key} question {q.index}: reused scores differ by {gap}")
                    print(f"{key}: reused rotation scores checked ({gap:.1e})", file=sys.stderr)
                    checked = True
                run_question(asm, decoder, pool, q, k, kind, args, tally, old)
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


def settings(args: argparse.Namespace, chat: bool) -> dict[str, Any]:
    """What makes two runs one experiment: recorded with every result, compared on resume."""
    return {
        "model": args.model,
        "chat": chat,
        "template": args.template,
        "modes": args.modes,
        "noise": args.noise,
        "max_new_tokens": args.max_new_tokens,
        "seed": args.seed,
    }


def earlier_result(name: str, args: argparse.Namespace, chat: bool) -> dict[str, Any] | None:
    """`--resume`: the result this run would write, if one is there and was made with the same
    settings (another model, prompt, mode set or seed would mix two experiments in one table)."""
    path = (args.results_dir or RESULTS_DIR) / f"{name}.json"
    if not path.is_file():
        return None
    res = json.loads(path.read_text())["results"]
    mine = settings(args, chat)
    differ = [f for f, v in mine.items() if res.get(f) != v]
    if differ:
        raise SystemExit(
            f"{path}: made with other settings ({', '.join(differ)}); cannot resume it"
        )
    return res


def args_for(args: argparse.Namespace, modes: list[str]) -> argparse.Namespace:
    """`args` with only the rotation scores and the given modes asked for."""
    return argparse.Namespace(**{**vars(args), "modes": ["positions", *modes]})


def merge_files(args: argparse.Namespace) -> dict[str, Any]:
    """`--merge`: the figures of several runs' questions together, as one result file."""
    runs = [json.loads(Path(p).read_text())["results"] for p in args.merge]
    same = ("model", "chat", "template", "noise", "max_new_tokens", "seed")
    for path, run in zip(args.merge, runs, strict=True):
        if any(run[f] != runs[0][f] for f in same):
            raise SystemExit(f"{path}: other settings than {args.merge[0]} ({', '.join(same)})")
    out, per_question = merge(args.merge)
    payload = {
        "command": "bench/rag_nq.py --merge " + " ".join(str(p) for p in args.merge),
        "merged": [run["command"] for run in runs],
        "complete": all(run["complete"] for run in runs),
        **{f: runs[0][f] for f in (*same, "machine", "device", "dtype")},
        "results": out,
        "per_question": per_question,
    }
    name = args.name or "rag_nq_merged"
    path = write_result(name, payload, args.results_dir)
    print(json.dumps(out, indent=1, default=str)[:4000])
    print(f"wrote {path}")
    return payload


if __name__ == "__main__":
    main()
