"""Metrics with trec_eval semantics through ir_measures, over every judged query.

What a measure is (its ir_measures name) is kept apart from who computes it (ir_measures picks
pytrec_eval). Queries in the qrels that a run lacks score 0, as `trec_eval -c` does, so a run
cannot look better by dropping hard queries; queries without judgments are ignored.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import ir_measures
import numpy as np
from scipy import stats

from cisrank.data.runs import Run

# RR(rel=2)@10 is TREC DL's MRR@10: the reciprocal rank of the first passage graded 2 or more.
DEFAULT_MEASURES: tuple[str, ...] = (
    "nDCG@1",
    "nDCG@5",
    "nDCG@10",
    "RR(rel=2)@10",
    "AP(rel=2)",
    "R(rel=2)@100",
)
PerQuery = dict[str, dict[str, float]]  # measure -> qid -> value


def per_query(
    run: Run | Mapping[str, Mapping[str, float]],
    qrels: Mapping[str, Mapping[str, int]],
    measures: Sequence[str] = DEFAULT_MEASURES,
) -> PerQuery:
    parsed = {name: ir_measures.parse_measure(name) for name in measures}
    by_obj = {m: name for name, m in parsed.items()}
    run_dict = run.as_dict() if isinstance(run, Run) else {q: dict(d) for q, d in run.items()}
    judged = {q: dict(d) for q, d in qrels.items() if d}
    values: PerQuery = {name: dict.fromkeys(judged, 0.0) for name in measures}
    for metric in ir_measures.iter_calc(list(parsed.values()), judged, run_dict):
        if metric.query_id in judged:
            values[by_obj[metric.measure]][metric.query_id] = float(metric.value)
    return values


def mean(values: PerQuery) -> dict[str, float]:
    return {name: float(np.mean(list(v.values()))) if v else 0.0 for name, v in values.items()}


def evaluate(
    run: Run | Mapping[str, Mapping[str, float]],
    qrels: Mapping[str, Mapping[str, int]],
    measures: Sequence[str] = DEFAULT_MEASURES,
) -> dict[str, float]:
    return mean(per_query(run, qrels, measures))


def paired_test(
    baseline: Mapping[str, float],
    system: Mapping[str, float],
    permutations: int = 10_000,
    seed: int = 0,
) -> dict[str, float | int]:
    """Paired t-test and a two-sided paired randomization test of system vs baseline.

    The randomization test flips the sign of each per-query difference at random; it makes no
    normality assumption, which matters for nDCG on 40-odd queries.
    """
    qids = sorted(set(baseline) & set(system))
    a = np.array([baseline[q] for q in qids], dtype=np.float64)
    b = np.array([system[q] for q in qids], dtype=np.float64)
    diff = b - a
    out: dict[str, float | int] = {
        "queries": len(qids),
        "mean_delta": float(diff.mean()) if len(qids) else 0.0,
        "wins": int((diff > 0).sum()),
        "ties": int((diff == 0).sum()),
        "losses": int((diff < 0).sum()),
    }
    if len(qids) < 2 or not np.any(diff):
        out.update(t_statistic=0.0, p_ttest=1.0, p_randomization=1.0)
        return out
    t = stats.ttest_rel(b, a)
    rng = np.random.default_rng(seed)
    signs = rng.choice(np.array([-1.0, 1.0]), size=(permutations, len(diff)))
    null = np.abs((signs * diff).mean(axis=1))
    observed = abs(diff.mean())
    p_rand = (np.count_nonzero(null >= observed - 1e-12) + 1) / (permutations + 1)
    out.update(
        t_statistic=float(t.statistic), p_ttest=float(t.pvalue), p_randomization=float(p_rand)
    )
    return out


def mcnemar_exact(b: int, c: int) -> float:
    """Two-sided exact McNemar p: of the b + c discordant pairs (right in one system and wrong
    in the other), b went one way; under no difference each is a fair coin, so
    p = 2 P(X <= min(b, c)), X ~ Binomial(b + c, 1/2). Exact at every count (integers, no
    chi-square approximation): the paired test for binary outcomes on a few hundred questions,
    where the discordant counts are often small."""
    n = b + c
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(b, c) + 1)) / 2**n
    return min(1.0, 2 * tail)


def discordant(pairs: Iterable[tuple[bool, bool]]) -> dict[str, Any]:
    """The discordant counts of (here, there) outcomes on the same items and their exact McNemar
    p: `wins` = right here and wrong there, `losses` = the reverse."""
    pairs = list(pairs)
    b = sum(bool(x) and not y for x, y in pairs)
    c = sum(bool(y) and not x for x, y in pairs)
    return {"wins": b, "losses": c, "p": mcnemar_exact(b, c)}
