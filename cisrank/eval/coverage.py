"""Which judged queries an evaluation can run, and what it does about the others.

A measure is a mean over the judged queries (the qrels), as trec_eval -c computes it: a judged
query that the run lacks scores 0. That is right for a system that retrieved nothing, and wrong
for an evaluation that never ran the query because its topic or its candidates were not given:
topics cut to 5 of DL19's 43 queries printed "5 queries" and nDCG@10 0.0533, the 38 others
silently 0; qrels of another query set gave 0.0 everywhere, exit 0 (docs/reliability.md,
"Evaluation").

So the judged queries that cannot be run (no topic, or no candidates) are named, and by default
the evaluation is refused; the user may ask to count them 0 (`zero`: the figure of the whole
judged set, trec_eval -c's) or to leave them out (`skip`: the figure of the queries run, no
longer comparable with published figures of the set). Judged and runnable sharing no query at
all is refused whatever is asked: there would be nothing to measure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from cisrank.data.types import Dataset
from cisrank.errors import DataError

Missing = Literal["refuse", "zero", "skip"]
MISSING: tuple[Missing, ...] = ("refuse", "zero", "skip")
SHOWN = 5
"""qids named in a message before "and N more"."""


def _some(qids: Sequence[str]) -> str:
    more = f" and {len(qids) - SHOWN} more" if len(qids) > SHOWN else ""
    return ", ".join(qids[:SHOWN]) + more


@dataclass(frozen=True)
class Coverage:
    """The judged queries of a dataset against those it can run."""

    judged: list[str]
    """qids with at least one judgment (the measures' denominator), in qrels order."""
    no_topic: list[str]
    no_candidates: list[str]
    """Judged, with a topic, but no candidate list."""
    unjudged_run: int
    """Queries run that have no judgment: reranked, and ignored by every measure."""

    @property
    def not_run(self) -> list[str]:
        return [*self.no_topic, *self.no_candidates]

    @property
    def run(self) -> int:
        return len(self.judged) - len(self.not_run)


def coverage(dataset: Dataset) -> Coverage:
    judged = [q for q, docs in dataset.qrels.items() if docs]
    no_topic = [q for q in judged if q not in dataset.topics]
    no_candidates = [q for q in judged if q in dataset.topics and q not in dataset.candidates]
    judged_set = set(judged)
    unjudged = sum(1 for q in dataset.qids if q not in judged_set)
    return Coverage(judged, no_topic, no_candidates, unjudged)


def check_missing(missing: str) -> Missing:
    if missing not in MISSING:
        raise DataError(f"--missing {missing!r}: choose one of {', '.join(MISSING)}")
    return missing


def judged_to_evaluate(
    dataset: Dataset, missing: str = "refuse"
) -> tuple[dict[str, dict[str, int]], dict[str, Any]]:
    """(the qrels the measures are computed over, what was done about unrun judged queries).

    `missing`: `refuse` (the default: a one-line DataError naming them), `zero` (they count 0)
    or `skip` (they are left out). No judged query that can be run is a DataError whatever
    `missing` says."""
    policy = check_missing(missing)
    cov = coverage(dataset)
    if not cov.judged:
        raise DataError(f"dataset '{dataset.name}': its qrels judge no query, nothing to evaluate")
    if cov.run == 0:
        runnable = dataset.qids
        raise DataError(
            f"dataset '{dataset.name}': no judged query can be run: the qrels judge "
            f"{len(cov.judged)} ({_some(cov.judged)}), the topics and candidates have "
            f"{len(runnable)} in common ({_some(runnable) or 'none'}), and no qid is in all "
            "three: give the qrels, topics and candidates of one query set"
        )
    report: dict[str, Any] = {
        "judged": len(cov.judged),
        "judged_run": cov.run,
        "unjudged_run": cov.unjudged_run,
    }
    if not cov.not_run:
        return _judged(dataset.qrels), report
    where = []
    if cov.no_topic:
        where.append(f"{len(cov.no_topic)} have no topic ({_some(cov.no_topic)})")
    if cov.no_candidates:
        where.append(f"{len(cov.no_candidates)} no candidates ({_some(cov.no_candidates)})")
    if policy == "refuse":
        raise DataError(
            f"dataset '{dataset.name}': {len(cov.not_run)} of its {len(cov.judged)} judged "
            f"queries cannot be run: {' and '.join(where)}: give the topics and candidates of "
            "the whole query set, or pass --missing zero (count them 0, as trec_eval -c does) "
            f"or --missing skip (evaluate the {cov.run} that can be run)"
        )
    report.update(missing=policy, no_topic=cov.no_topic, no_candidates=cov.no_candidates)
    if policy == "zero":
        return _judged(dataset.qrels), report
    not_run = set(cov.not_run)
    return {q: d for q, d in _judged(dataset.qrels).items() if q not in not_run}, report


def _judged(qrels: Mapping[str, Mapping[str, int]]) -> dict[str, dict[str, int]]:
    return {q: dict(d) for q, d in qrels.items() if d}


def describe(report: Mapping[str, Any]) -> str:
    """What was done about unrun judged queries, for a report's title ("" when nothing was)."""
    policy = report.get("missing")
    if policy is None:
        return ""
    count = len(report["no_topic"]) + len(report["no_candidates"])
    what = "counted 0" if policy == "zero" else "left out"
    return f"{count} of {report['judged']} judged queries not run, {what}"
