"""Teachers: whatever produces a score per (query, passage), behind one small interface.

The pipeline is meant for the CIS teacher, but users arrive with other teachers (a dense or
cross-encoder reranker, or scores computed elsewhere), so every teacher yields the same columns:
`score`, plus `log_conditional` and `log_prior` when the teacher is CIS.

The teachers `--teacher` may name are records of `TEACHERS`, as the rerankers are records of
`cisrank.rerank.registry`: every reranker kind that scores (its facts, such as whether its
shards are cut by passage, read from its record), CIS with its two terms, and the scores file.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, cast

from cisrank.errors import DataError, UnknownRerankerError
from cisrank.rerank.base import Reranker
from cisrank.rerank.registry import CIS, KINDS, RerankerKind, kind_of, load_reranker

if TYPE_CHECKING:
    from cisrank.rerank.cis import CISReranker

SCORES_TEACHER = "scores"
QRELS_TEACHER = "qrels"


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

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {"teacher": self.name, "model": self.reranker.model_name}
        out.update({k: v for k, v in sorted(self.options.items()) if v is not None})
        if "backend" in out and self.reranker.runtime:  # the runtime that ran, never `auto`
            out["backend"] = self.reranker.runtime
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
        self.cis = cast("CISReranker", load_reranker(CIS.name, self.model, **self.options))
        self.reranker = self.cis

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


class QrelsTeacher:
    """Judgments as a teacher: each pair scored by its grade in a qrels file (`qid 0 docid
    grade`), 0 where the pair is unjudged. With `distill synth`'s qrels (the passage a query
    was written from) or the MS MARCO training triples' positives (`distill pool`'s qrels), it
    is the labelled positive that `--teacher-fuse` can weigh beside a model's scores."""

    name = QRELS_TEACHER
    passage_major = False

    def __init__(self, path: str | Path) -> None:
        from cisrank.data.corpus import file_checksum
        from cisrank.data.datasets import read_qrels

        self.path = Path(path)
        if not self.path.is_file():
            raise DataError(f"--scores-file '{path}' (the qrels) does not exist")
        self.qrels = read_qrels(self.path)
        self.checksum = file_checksum(self.path)[0]

    def describe(self) -> dict[str, Any]:
        return {"teacher": self.name, "file": str(self.path), "sha256": self.checksum}

    def score(
        self, qid: str, query: str, docids: Sequence[str], passages: Sequence[str]
    ) -> TeacherScores:
        judged = self.qrels.get(qid, {})
        return TeacherScores([float(judged.get(d, 0)) for d in docids])

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
        return teacher_kind(self.name).passage_major(dict(self.options))


@dataclass(frozen=True)
class TeacherKind:
    """One teacher `--teacher` may name, and what is known of it before it is built."""

    name: str
    build: Callable[[str | None, str | None, Mapping[str, Any]], Teacher]
    """Builds it from the model, the scores file and the options (None ones dropped)."""
    reranker: RerankerKind[Any, Any] | None = None
    """The reranker kind it scores with; None for scores read from a file."""
    gloss: str = ""
    """A few words said after its name in `--teacher`'s help."""

    @property
    def reads_file(self) -> bool:
        """Its scores come from a file: it has no model, and nothing to spread over workers."""
        return self.reranker is None

    def passage_major(self, options: Mapping[str, Any]) -> bool:
        """Whether its shards are cut by passage (`Teacher.passage_major`), from its reranker
        kind's record; a scores file is read query by query."""
        return self.reranker is not None and self.reranker.passage_major_with(options)


def _scores_file(model: str | None, scores_file: str | None, options: Mapping[str, Any]) -> Teacher:
    if scores_file is None:
        raise DataError(
            f"teacher '{SCORES_TEACHER}' needs --scores-file RUN (qid Q0 docid rank score tag)"
        )
    if model is not None or options:
        given = ", ".join(["model", *options] if model is not None else options)
        raise DataError(f"teacher '{SCORES_TEACHER}' reads its scores from a file; drop: {given}")
    return ScoresFileTeacher(scores_file)


def _qrels_file(model: str | None, scores_file: str | None, options: Mapping[str, Any]) -> Teacher:
    if scores_file is None:
        raise DataError(f"teacher '{QRELS_TEACHER}' needs --scores-file QRELS (qid 0 docid grade)")
    if model is not None or options:
        given = ", ".join(["model", *options] if model is not None else options)
        raise DataError(f"teacher '{QRELS_TEACHER}' reads its grades from a file; drop: {given}")
    return QrelsTeacher(scores_file)


def _of_reranker(
    kind: RerankerKind[Any, Any], teacher: type[RerankerTeacher], gloss: str = ""
) -> TeacherKind:
    def build(model: str | None, scores_file: str | None, options: Mapping[str, Any]) -> Teacher:
        if scores_file is not None:
            raise DataError(f"--scores-file is for teacher '{SCORES_TEACHER}', not '{kind.name}'")
        return teacher(kind.name, model, dict(options))

    return TeacherKind(kind.name, build, kind, gloss)


def _teachers() -> dict[str, TeacherKind]:
    found = {CIS.name: _of_reranker(CIS, CISTeacher, "log p(K|Q) - log p(K) of a causal LM")}
    for name, kind in sorted(KINDS.items()):
        if not kind.keeps_order:
            found.setdefault(name, _of_reranker(kind, RerankerTeacher))
    scores = TeacherKind(
        SCORES_TEACHER, _scores_file, gloss="a TREC run file given with --scores-file"
    )
    qrels = TeacherKind(
        QRELS_TEACHER,
        _qrels_file,
        gloss="each pair's grade in a qrels file given with --scores-file, 0 where unjudged",
    )
    return {**found, scores.name: scores, qrels.name: qrels}


TEACHERS: dict[str, TeacherKind] = _teachers()
"""Every teacher, in the order `--teacher`'s help lists them: CIS (the default, with its two
log-likelihood terms), every other reranker kind that scores, scores read from a run file and
grades read from a qrels file."""


def teacher_list(glossed: bool = True) -> str:
    """The teachers as `--teacher`'s help lists them (`glossed`), or its errors."""
    named = [f"{t.name} ({t.gloss})" if t.gloss and glossed else t.name for t in TEACHERS.values()]
    return ", ".join(named[:-1]) + (", or " if glossed else " or ") + named[-1]


def teacher_kind(name: str) -> TeacherKind:
    """The record of teacher `name`; one line naming the teachers there are for any other."""
    found = TEACHERS.get(name)
    if found is not None:
        return found
    try:
        kind_of(name)  # a reranker kind that is no teacher keeps the input order: no scores
    except UnknownRerankerError:
        raise UnknownRerankerError(
            f"unknown teacher '{name}': choose one of {teacher_list(glossed=False)}"
        ) from None
    raise DataError(f"teacher '{name}' has no scores: pick {teacher_list(glossed=False)}")


def load_teacher(
    name: str, model: str | None = None, scores_file: str | Path | None = None, **options: Any
) -> Teacher:
    options = {k: v for k, v in options.items() if v is not None}
    return teacher_kind(name).build(
        model, None if scores_file is None else str(scores_file), options
    )
