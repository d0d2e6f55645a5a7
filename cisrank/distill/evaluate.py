"""How good is a student: nDCG@10 against qrels, and rank agreement with its teacher.

Used during training (the dev evaluator that picks the best checkpoint) and after it (`distill
run` reports both figures on the test set), so both read the same numbers the same way.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from scipy.stats import spearmanr

from cisrank.data.runs import Run
from cisrank.data.types import Dataset
from cisrank.eval import metrics as M
from cisrank.rerank.base import Reranker

Scores = dict[str, dict[str, float]]  # qid -> docid -> score


def score_dataset(
    scorer: Reranker, dataset: Dataset, depth: int, qids: Sequence[str] | None = None
) -> Scores:
    """Scores of the top `depth` candidates of every query, all queries in one `score_batch`
    call so that a batching reranker packs passages of different queries together."""
    qids = list(qids if qids is not None else dataset.qids)
    requests = [(dataset.topics[q], [h.text for h in dataset.candidates[q][:depth]]) for q in qids]
    values = scorer.score_batch(requests)
    return {
        q: {h.docid: float(v) for h, v in zip(dataset.candidates[q][:depth], vals, strict=True)}
        for q, vals in zip(qids, values, strict=True)
    }


def ndcg10(scores: Scores, qrels: Mapping[str, Mapping[str, int]]) -> float:
    """nDCG@10 of the reranked candidates (trec_eval semantics, unjudged queries ignored)."""
    run = Run.from_scores("student", {q: list(d.items()) for q, d in scores.items()})
    return M.evaluate(run, qrels, ("nDCG@10",))["nDCG@10"]


def spearman_to_teacher(student: Scores, teacher: Scores) -> dict[str, Any]:
    """Mean per-query Spearman correlation over the pairs both scored.

    Per query, because the student only has to order each query's candidates the way the teacher
    does; a query whose scores are constant on either side has no defined correlation and is
    counted apart rather than as 0."""
    rhos = []
    undefined = 0
    for qid, s in student.items():
        t = teacher.get(qid)
        if not t:
            continue
        common = [d for d in s if d in t]
        if len(common) < 2:
            continue
        a = np.array([s[d] for d in common])
        b = np.array([t[d] for d in common])
        if np.ptp(a) == 0 or np.ptp(b) == 0:
            undefined += 1
            continue
        rhos.append(float(spearmanr(a, b).statistic))
    if not rhos:
        raise ValueError("student and teacher share no query with two or more scored passages")
    return {"spearman": float(np.mean(rhos)), "queries": len(rhos), "undefined": undefined}
