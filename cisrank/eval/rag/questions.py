"""Questions with a gold passage, and the candidate set a reranker chooses from.

The file is the NQ-Open oracle shape of the lost-in-the-middle data (`nq-open-lim/`): one JSON
object a line (gzip or plain), `question`, `answers` (a list of strings) and `ctxs`, passages
`{title, text, isgold?, hasanswer?}`. A question's gold passage is its `ctxs` entry marked
`isgold` (else its first).

A candidate set is the gold plus K - 1 distractors, none holding an answer (normalized substring,
as the accuracy: `answers.has_answer`) nor the gold's text:

- `related`: the question's top BM25 hits over the pool, the gold passages of every question of
  the file, deduplicated by text (the "related" passages of "The Power of Noise", Cuconasu et
  al. 2024; the repo's BM25, `MemoryBM25`, Lucene's analysis over title and text; ties by pool
  row): the hard case, passages on the question's topic that do not answer it;
- `random`: drawn uniformly from that pool, seeded by (seed, question, K, kind) (its
  "irrelevant" passages);
- `given`: the question's own `ctxs` (a file with retrieved passages, e.g. lost in the middle's
  20-document files): the gold and the first K - 1 others, in file order.

A question that cannot have K candidates (its answer is in nearly every passage of the pool, as
the one-letter answer "S" of NQ-Open's "atlantic ocean's shape is similar to which english
alphabet", or its file gives fewer than K) raises `ShortOfCandidates`; `candidate_sets` leaves
such a question out and says why, so one question does not stop a run of a thousand, and an
answer every passage holds measures nothing (any passage "holds" it, any long answer "contains"
it).

The candidates are in first-stage order: BM25's order of the K passages for the question (ties by
input position: the gold, then the distractors), or the file's order for `given`. So the
`first-stage` ranking is the identity, and with `related` distractors the gold is often not first.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from cisrank.data.datasets import json_lines
from cisrank.data.types import Passage
from cisrank.errors import CisrankError, DataError
from cisrank.eval.rag.answers import has_answer, normalize_answer

Distractors = Literal["related", "random", "given"]
DISTRACTORS: tuple[str, ...] = ("related", "random", "given")


class ShortOfCandidates(DataError):
    """A question cannot have the K candidates asked: too few passages free of its answer, or
    too few `ctxs`."""


@dataclass(frozen=True)
class Question:
    """A question of the file: its position there (`index`), text, gold answers, gold passage,
    and its `ctxs` as passages (`given` candidates) with the gold's position among them."""

    index: int
    question: str
    answers: list[str]
    gold: Passage
    contexts: tuple[Passage, ...] = field(default=(), compare=False)
    gold_context: int | None = field(default=None, compare=False)
    """Which of `contexts` is marked `isgold` (None: none is, the gold is the first)."""


def _question(row: Any, where: str, index: int) -> Question:
    if not isinstance(row, dict):
        raise DataError(f"{where}: expected a JSON object with question, answers and ctxs")
    question, answers, ctxs = row.get("question"), row.get("answers"), row.get("ctxs")
    if not isinstance(question, str) or not question.strip():
        raise DataError(f"{where}: 'question' must be a non-empty string")
    if not isinstance(answers, list) or not answers or not all(isinstance(a, str) for a in answers):
        raise DataError(f"{where}: 'answers' must be a non-empty list of strings")
    if not isinstance(ctxs, list) or not ctxs:
        raise DataError(f"{where}: 'ctxs' must be a non-empty list of passages (the gold first)")
    passages = []
    gold_at: int | None = None
    for j, ctx in enumerate(ctxs):
        if not isinstance(ctx, dict) or not isinstance(ctx.get("text"), str):
            raise DataError(f"{where}: ctxs.{j} must be an object with a 'text' string")
        title = ctx.get("title") or ""
        if not isinstance(title, str):
            raise DataError(f"{where}: ctxs.{j}.title must be a string")
        passages.append(Passage(f"q{index}" if j == 0 else f"q{index}c{j}", ctx["text"], title))
        if gold_at is None and ctx.get("isgold"):
            gold_at = j
    gold = passages[gold_at or 0]
    return Question(
        index,
        question,
        list(answers),
        Passage(f"q{index}", gold.text, gold.title),
        tuple(passages),
        gold_at,
    )


def load_questions(path: str | Path, n: int | None = None) -> list[Question]:
    """The file's first `n` questions (all by default) with their gold passage (`isgold`, else
    the first of `ctxs`), gzip or plain JSON lines; a bad line is one error naming it."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise CisrankError(f"questions file '{path}' does not exist")
    out: list[Question] = []
    try:
        for lineno, row in json_lines(path, "questions"):
            if n is not None and len(out) >= n:
                break
            out.append(_question(row, f"{path}:{lineno}", len(out)))
    except OSError as exc:
        raise DataError(f"{path}: cannot read it as (gzipped) JSON lines: {exc}") from None
    if not out:
        raise DataError(f"{path}: holds no questions")
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
        self.row = seen
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

    def _enough(self, q: Question, rows: Sequence[int], n: int) -> None:
        if len(rows) < n:
            shown = ", ".join(repr(a) for a in q.answers[:3])
            raise ShortOfCandidates(
                f"question {q.index}: only {len(rows)} passages of the pool hold none of its "
                f"answers ({shown}), {n} distractors asked: ask for fewer candidates"
            )

    def random(
        self, q: Question, n: int, rng: random.Random, exclude: Sequence[Passage] = ()
    ) -> list[Passage]:
        rows = self.eligible(q, exclude)
        self._enough(q, rows, n)
        return [self.passages[i] for i in rng.sample(rows, n)]

    def related(self, q: Question, n: int) -> list[Passage]:
        """The top BM25 hits for the question without an answer (ties: lower pool row)."""
        ok = self.eligible(q)
        scores = self.bm25.scores(q.question)
        ranked = sorted(ok, key=lambda i: (-float(scores[i]), i))
        self._enough(q, ranked, n)
        return [self.passages[i] for i in ranked[:n]]

    def bm25_scores(self, question: str, passages: Sequence[Passage]) -> list[float]:
        """BM25 scores of `passages` (pool members, by text) for `question`."""
        scores = self.bm25.scores(question)
        return [float(scores[self.row[p.text]]) for p in passages]


def build_candidates(
    pool: Pool, q: Question, k: int, kind: str, seed: int
) -> tuple[list[Passage], list[float], int]:
    """(the K passages in BM25 order, their BM25 scores, the gold's index): the gold and K - 1
    `related` or `random` distractors (see the module docstring)."""
    if kind not in ("related", "random"):
        raise CisrankError(f"distractors {kind!r}: use related or random (or given)")
    rng = random.Random(f"{seed}:{q.index}:{k}:{kind}")
    distractors = pool.random(q, k - 1, rng) if kind == "random" else pool.related(q, k - 1)
    docs = [q.gold, *distractors]
    scores = pool.bm25_scores(q.question, docs)
    order = sorted(range(k), key=lambda i: (-scores[i], i))
    return [docs[i] for i in order], [scores[i] for i in order], order.index(0)


def given_candidates(q: Question, k: int) -> tuple[list[Passage], int]:
    """(the gold and the first K - 1 other `ctxs` of the question, in file order, the gold's
    index): the candidates a file gives (`given`)."""
    if q.gold_context is None:
        raise DataError(
            f"question {q.index}: no passage of its ctxs is marked isgold, so the candidates "
            "the file gives have no known gold: use related or random distractors"
        )
    if len(q.contexts) < k:
        raise ShortOfCandidates(
            f"question {q.index}: the file gives {len(q.contexts)} passages, fewer than the "
            f"{k} candidates asked: ask for at most {len(q.contexts)}"
        )
    keep = [j for j in range(len(q.contexts)) if j != q.gold_context][: k - 1]
    keep = sorted([*keep, q.gold_context])
    return [q.contexts[j] for j in keep], keep.index(q.gold_context)


@dataclass(frozen=True)
class CandidateSet:
    """What a reranker chooses from for one question: the passages in first-stage order and the
    gold's index among them."""

    question: Question
    passages: list[Passage]
    gold: int

    @property
    def texts(self) -> list[str]:
        """What a reranker scores: each passage's title and text (as BM25 indexed them)."""
        return [p.contents for p in self.passages]


def candidate_sets(
    questions: Sequence[Question],
    pool_of: Sequence[Question],
    k: int,
    distractors: str,
    seed: int,
    skip_short: bool = True,
) -> tuple[list[CandidateSet], dict[int, str]]:
    """(the candidate set of each of `questions`, the distractors from the gold passages of
    `pool_of` (the whole file) or, for `given`, from each question's own `ctxs`; {question
    index: why it was left out}). A question short of candidates is left out with its reason
    (`skip_short`) or stops everything; every question short is an error either way."""
    if k < 1:
        raise CisrankError(f"candidates must be >= 1, got {k}")
    pool = None if distractors == "given" else Pool(pool_of)
    out: list[CandidateSet] = []
    skipped: dict[int, str] = {}
    for q in questions:
        try:
            if pool is None:
                out.append(CandidateSet(q, *given_candidates(q, k)))
            else:
                passages, _, gold = build_candidates(pool, q, k, distractors, seed)
                out.append(CandidateSet(q, passages, gold))
        except ShortOfCandidates as exc:
            if not skip_short:
                raise
            skipped[q.index] = str(exc)
    if not out:
        first = next(iter(skipped.values()))
        raise ShortOfCandidates(f"every question is short of candidates, e.g. {first}")
    return out, skipped
