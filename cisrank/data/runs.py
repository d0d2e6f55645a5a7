"""Runs: ranked lists per query, and their TREC file form (`qid Q0 docid rank score tag`).

A `Run` always holds strictly decreasing scores and no duplicate docids, so every evaluator
(trec_eval breaks score ties by docid, others by file order) reads the same ranking from it. Ties
in the input are broken by input order (for a reranked list, the first-stage order), then nudged
apart. The nudge is one float32 step, not one float64 step: trec_eval as wrapped by pytrec_eval
(and so ir_measures) holds scores in single precision, so scores closer than that are ties to it
and would be re-sorted by docid. A nudge changes a score by at most ~1e-7 relative.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cisrank.data.datasets import text_lines
from cisrank.data.types import rank_order
from cisrank.errors import DataError
from cisrank.fileio import atomic_write_text

Ranking = list[tuple[str, float]]


def strictly_ranked(entries: Sequence[tuple[str, float]]) -> Ranking:
    """Sort (docid, score) best first; ties keep input order; tied scores nudged apart."""
    seen: set[str] = set()
    for docid, score in entries:
        if docid in seen:
            raise DataError(f"duplicate docid '{docid}' in one ranking")
        seen.add(docid)
        if not math.isfinite(score):
            raise DataError(f"score for docid '{docid}' is not finite ({score})")
    order = rank_order([s for _, s in entries])
    ranked: Ranking = []
    prev = np.float32(np.inf)
    for i in order:
        docid, score = entries[i]
        score = float(score)
        if np.float32(score) >= prev:
            score = float(np.nextafter(prev, np.float32(-np.inf)))
        ranked.append((docid, score))
        prev = np.float32(score)
    return ranked


@dataclass
class Run:
    """A named run: qid -> ranking, best first, strictly decreasing scores."""

    name: str
    rankings: dict[str, Ranking]

    @classmethod
    def from_scores(cls, name: str, scores: Mapping[str, Sequence[tuple[str, float]]]) -> Run:
        return cls(name, {qid: strictly_ranked(entries) for qid, entries in scores.items()})

    def as_dict(self) -> dict[str, dict[str, float]]:
        """The form ir_measures and pytrec_eval take."""
        return {qid: dict(r) for qid, r in self.rankings.items()}

    def lines(self, tag: str | None = None) -> Iterable[str]:
        tag = tag or self.name
        for qid, ranking in self.rankings.items():
            for rank, (docid, score) in enumerate(ranking, 1):
                yield f"{qid} Q0 {docid} {rank} {score!r} {tag}\n"

    def write_trec(self, path: str | Path, tag: str | None = None) -> Path:
        return atomic_write_text(Path(path), "".join(self.lines(tag)))

    @classmethod
    def read_trec(cls, path: str | Path, name: str | None = None) -> Run:
        path = Path(path)
        scores: dict[str, list[tuple[str, float]]] = {}
        seen: dict[str, set[str]] = {}
        for lineno, line in text_lines(path, "run"):
            parts = line.split()
            if not parts:
                continue
            if len(parts) != 6:
                raise DataError(f"{path}:{lineno}: expected 'qid Q0 docid rank score tag'")
            qid, _, docid, _, score, _ = parts
            if docid in seen.setdefault(qid, set()):
                raise DataError(f"{path}:{lineno}: duplicate docid '{docid}' for query {qid}")
            seen[qid].add(docid)
            try:
                scores.setdefault(qid, []).append((docid, float(score)))
            except ValueError:
                raise DataError(f"{path}:{lineno}: score {score!r} is not a number") from None
        return cls.from_scores(name or path.stem, scores)
