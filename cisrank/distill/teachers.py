"""Teachers: whatever produces a score per (query, passage), behind one small interface.

The pipeline is meant for the CIS teacher, but users arrive with other teachers (a dense or
cross-encoder reranker, or scores computed elsewhere), so every teacher yields the same columns:
`score`, plus `log_conditional` and `log_prior` when the teacher is CIS.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from cisrank.errors import DataError
from cisrank.rerank.base import Reranker
from cisrank.rerank.registry import check_name, load_reranker

SCORES_TEACHER = "scores"
CIS_TEACHER = "cis"


@dataclass
class TeacherScores:
    score: list[float]
    log_conditional: list[float] | None = None
    log_prior: list[float] | None = None


@dataclass(frozen=True)
class QueryItems:
    """One query's pairs to score: what `Teacher.score_many` takes per query."""

    qid: str
    query: str
    docids: Sequence[str]
    passages: Sequence[str]


class Teacher(Protocol):
    name: str

    @property
    def passage_major(self) -> bool:
        """True when the teacher is cheaper with all queries of a passage in one call (the
        reverse CIS estimator runs a passage's context once for every query that retrieved it),
        so that `generate` cuts its shards by passage instead of by query."""
        ...

    def describe(self) -> dict[str, Any]:
        """What identifies the teacher's numbers: a resumed run must use the same teacher."""
        ...

    def score(
        self, qid: str, query: str, docids: Sequence[str], passages: Sequence[str]
    ) -> TeacherScores: ...

    def score_many(self, items: Sequence[QueryItems]) -> list[TeacherScores]:
        """`score` of each query, in one call so that a model can batch across queries."""
        ...


@dataclass
class RerankerTeacher:
    """Any cisrank reranker, through the `Reranker` contract alone."""

    name: str
    model: str | None
    options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.reranker: Reranker = load_reranker(self.name, self.model, **self.options)
        if self.reranker.keeps_order:
            raise DataError(
                f"teacher '{self.name}' has no scores: pick cis, dense, cross-encoder or scores"
            )

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {"teacher": self.name, "model": self.reranker.model_name}
        out.update({k: v for k, v in sorted(self.options.items()) if v is not None})
        return out

    @property
    def passage_major(self) -> bool:
        # Passage shards cut a query's passages apart: only for scores that are the passage's
        # own, never for a reranker that combines the whole request (the hybrid's fusion).
        return self.reranker.passage_major and not self.reranker.combines_request

    def score(
        self, qid: str, query: str, docids: Sequence[str], passages: Sequence[str]
    ) -> TeacherScores:
        return TeacherScores(self.reranker.score(query, list(passages)))

    def score_many(self, items: Sequence[QueryItems]) -> list[TeacherScores]:
        got = self.reranker.score_batch([(q.query, list(q.passages)) for q in items])
        return [TeacherScores(s) for s in got]


@dataclass
class CISTeacher(RerankerTeacher):
    """The CIS reranker, which also gives its two log-likelihood terms, and whose numbers are
    tied to the exact model by the engine's fingerprint."""

    def __post_init__(self) -> None:
        from cisrank.rerank.cis import CISReranker

        super().__post_init__()
        if not isinstance(self.reranker, CISReranker):
            raise DataError(f"teacher '{self.name}' did not build a CIS reranker")
        self.cis: CISReranker = self.reranker

    def describe(self) -> dict[str, Any]:
        # the runtime that really scored (`--backend auto` names a choice, not a runtime)
        ran = {"backend": self.cis.config.backend, "dtype": self.cis.config.dtype}
        out = {**super().describe(), **{k: v for k, v in ran.items() if v is not None}}
        return {**out, "fingerprint": self.cis.engine.fingerprint()}

    def score(
        self, qid: str, query: str, docids: Sequence[str], passages: Sequence[str]
    ) -> TeacherScores:
        return self.score_many([QueryItems(qid, query, docids, passages)])[0]

    def score_many(self, items: Sequence[QueryItems]) -> list[TeacherScores]:
        requests = [(q.query, list(q.passages)) for q in items]
        config = self.cis.config
        if config.estimator != "forward" or not config.prior:  # the terms of forward CIS only
            return [TeacherScores(s) for s in self.cis.score_batch(requests)]
        # Forward: one query at a time, so that a passage's prior is computed in the same batch
        # whichever shards a run (local, Ray, resumed) has already done: equal bits everywhere.
        return [TeacherScores(*self.cis.components(q, ps)) for q, ps in requests]


class ScoresFileTeacher:
    """Scores computed elsewhere, as a TREC run file (`qid Q0 docid rank score tag`)."""

    name = SCORES_TEACHER
    passage_major = False

    def __init__(self, path: str | Path) -> None:
        from cisrank.data.corpus import file_checksum
        from cisrank.data.runs import Run

        self.path = Path(path)
        if not self.path.is_file():
            raise DataError(f"--scores-file '{path}' does not exist")
        self.scores = Run.read_trec(self.path).as_dict()
        self.checksum = file_checksum(self.path)[0]

    def describe(self) -> dict[str, Any]:
        return {"teacher": self.name, "file": str(self.path), "sha256": self.checksum}

    def score(
        self, qid: str, query: str, docids: Sequence[str], passages: Sequence[str]
    ) -> TeacherScores:
        by_doc = self.scores.get(qid)
        if by_doc is None:
            raise DataError(f"{self.path}: no scores for query {qid}")
        missing = [d for d in docids if d not in by_doc]
        if missing:
            raise DataError(
                f"{self.path}: query {qid} lacks scores for {len(missing)} passage(s), "
                f"e.g. {missing[0]}; score every candidate or lower --depth"
            )
        values = [float(by_doc[d]) for d in docids]
        if not all(math.isfinite(v) for v in values):
            raise DataError(f"{self.path}: non-finite score for query {qid}")
        return TeacherScores(values)

    def score_many(self, items: Sequence[QueryItems]) -> list[TeacherScores]:
        return [self.score(q.qid, q.query, q.docids, q.passages) for q in items]


@dataclass(frozen=True)
class TeacherSpec:
    """How to build a teacher (`load_teacher`'s arguments), not the teacher: what travels to
    each Ray actor, which builds its own (`load()`) and keeps its model loaded."""

    name: str
    model: str | None = None
    scores_file: str | None = None
    options: tuple[tuple[str, Any], ...] = ()

    @classmethod
    def of(
        cls, name: str, model: str | None = None, scores_file: str | Path | None = None, **options
    ) -> TeacherSpec:
        kept = tuple(sorted((k, v) for k, v in options.items() if v is not None))
        return cls(name, model, None if scores_file is None else str(scores_file), kept)

    def load(self) -> Teacher:
        return load_teacher(self.name, self.model, self.scores_file, **dict(self.options))

    @property
    def passage_major(self) -> bool:
        """`Teacher.passage_major` of the teacher this spec builds, without building it."""
        if self.name == "dense":
            return True
        if self.name != CIS_TEACHER:
            return False
        from cisrank.rerank.configs import CISRerankerConfig

        options = dict(self.options)
        return options.get("estimator", CISRerankerConfig().estimator) == "reverse"


def load_teacher(
    name: str, model: str | None = None, scores_file: str | Path | None = None, **options: Any
) -> Teacher:
    options = {k: v for k, v in options.items() if v is not None}
    if name == SCORES_TEACHER:
        if scores_file is None:
            raise DataError(
                "teacher 'scores' needs --scores-file RUN (qid Q0 docid rank score tag)"
            )
        if model is not None or options:
            given = ", ".join(["model", *options] if model is not None else options)
            raise DataError(f"teacher 'scores' reads its scores from a file; drop: {given}")
        return ScoresFileTeacher(scores_file)
    if scores_file is not None:
        raise DataError(f"--scores-file is for teacher 'scores', not '{name}'")
    check_name(name)
    return (CISTeacher if name == CIS_TEACHER else RerankerTeacher)(name, model, options)
