"""Score fusion of several rankings of the same passages: per-query normalized interpolation, RRF.

Why two methods. A causal LM's log-likelihood ratio, a cosine and a BM25 score live on unrelated
scales, so they cannot be added raw. Linear interpolation first maps each scorer's scores for one
query onto a common scale (min-max to [0, 1], or z-scores) and then takes a weighted sum: it keeps
*how much* better one passage is than another. Reciprocal-rank fusion (Cormack, Clarke and
Büttcher, SIGIR 2009) keeps only the ranks, `sum_i w_i / (k + rank_i)`, which is robust to
outlying scores and needs no normalization. Both are computed per query over the same candidate
list, so the fused order never depends on other queries.

The functions work on aligned score lists (`fuse`), as a reranker sees them, and on whole runs
(`fuse_runs`), as `bench/hybrid_select.py` chooses weights from saved runs; both go through
`fuse`, so weights chosen on runs give exactly the ranking the `hybrid` reranker serves, provided
the first stage enters as its rank (`input_order`), as the reranker sees it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Literal

from cisrank.data.runs import Run
from cisrank.data.types import rank_order
from cisrank.errors import DataError

Method = Literal["linear", "rrf"]
Normalization = Literal["minmax", "zscore"]
METHODS: tuple[str, ...] = ("linear", "rrf")
NORMALIZATIONS: tuple[str, ...] = ("minmax", "zscore")
RRF_K = 60.0


def normalize(scores: Sequence[float], how: str = "minmax") -> list[float]:
    """Scores of one query on a common scale. A constant list maps to zeros: a scorer that
    cannot tell the passages apart adds nothing to their fused order."""
    if how not in NORMALIZATIONS:
        raise ValueError(f"normalization must be one of {', '.join(NORMALIZATIONS)}, got {how!r}")
    values = [float(s) for s in scores]
    if not values:
        return []
    if how == "minmax":
        low, high = min(values), max(values)
        span = high - low
        return [(v - low) / span if span > 0 else 0.0 for v in values]
    mean = math.fsum(values) / len(values)
    std = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / len(values))
    return [(v - mean) / std if std > 0 else 0.0 for v in values]


def ranks(scores: Sequence[float]) -> list[int]:
    """1-based rank of each score, ties broken by input order (the house's `rank_order`)."""
    out = [0] * len(scores)
    for rank, i in enumerate(rank_order(list(scores)), 1):
        out[i] = rank
    return out


def fuse(
    components: Sequence[Sequence[float]],
    weights: Sequence[float],
    method: str = "linear",
    normalization: str = "minmax",
    k: float = RRF_K,
) -> list[float]:
    """One fused score per passage from aligned per-scorer score lists of one query.

    linear: `sum_i w_i * norm_i(s)`; rrf: `sum_i w_i / (k + rank_i(s))`."""
    if method not in METHODS:
        raise ValueError(f"fusion method must be one of {', '.join(METHODS)}, got {method!r}")
    if len(components) != len(weights) or not components:
        raise ValueError(f"{len(components)} score lists for {len(weights)} weights")
    n = len(components[0])
    if any(len(c) != n for c in components):
        raise ValueError("fusion needs one score per passage from every scorer")
    if k < 0:
        raise ValueError(f"RRF k must be >= 0, got {k}")
    fused = [0.0] * n
    for scores, weight in zip(components, weights, strict=True):
        if method == "linear":
            parts = normalize(scores, normalization)
        else:
            parts = [1.0 / (k + r) for r in ranks(scores)]
        for i, part in enumerate(parts):
            fused[i] += weight * part
    return fused


def input_order(run: Run) -> Run:
    """A run as the `hybrid` reranker's `first-stage` component scores it: `n - i` for the passage
    at rank i of n, the raw scores dropped.

    The reranker knows the first stage only as the order of the passages it is given (a
    `/v1/rerank` request carries no first-stage scores; `IdentityReranker` scores them `n - i`).
    Min-max or z-scores of BM25 scores are not those of ranks, so saved runs fused with raw
    first-stage scores would rank differently from the hybrid that serves the chosen weights.
    The offset n is immaterial: both normalizations and RRF ignore a constant shift."""
    return Run.from_scores(
        run.name,
        {
            qid: [(d, float(len(r) - i)) for i, (d, _) in enumerate(r)]
            for qid, r in run.rankings.items()
        },
    )


def fuse_runs(
    runs: Sequence[Run],
    weights: Sequence[float],
    method: str = "linear",
    normalization: str = "minmax",
    k: float = RRF_K,
    depth: int | None = None,
    name: str = "fused",
) -> Run:
    """Fuse runs over the same candidates: per query, the first run's top `depth` docids, scored
    by every run (each must hold all of them); passages below `depth` keep the first run's order
    under the fused ones, as `cisrank eval` keeps the unreranked tail."""
    if not runs:
        raise ValueError("fuse_runs needs at least one run")
    head_run = runs[0]
    out: dict[str, list[tuple[str, float]]] = {}
    for qid, ranking in head_run.rankings.items():
        head = ranking[:depth] if depth is not None else ranking
        docids = [d for d, _ in head]
        components = []
        for run in runs:
            scores = dict(run.rankings.get(qid, []))
            missing = [d for d in docids if d not in scores]
            if missing:
                raise DataError(
                    f"run '{run.name}' has no score for docid '{missing[0]}' of query '{qid}' "
                    f"({len(missing)} missing): fusion needs runs over the same candidates"
                )
            components.append([scores[d] for d in docids])
        fused = fuse(components, weights, method, normalization, k)
        entries = list(zip(docids, fused, strict=True))
        floor = min(fused) if fused else 0.0
        entries += [(d, floor - i) for i, (d, _) in enumerate(ranking[len(head) :], 1)]
        out[qid] = entries
    return Run.from_scores(name, out)


def parse_weights(spec: str | Mapping[str, float]) -> dict[str, float]:
    """'cis:0.6,dense:0.4' (or a mapping) -> {'cis': 0.6, 'dense': 0.4}; weights finite, >= 0,
    not all zero, names unique."""
    if isinstance(spec, Mapping):
        items = [(str(n), float(w)) for n, w in spec.items()]
    else:
        items = []
        for part in (p.strip() for p in spec.split(",")):
            if not part:
                continue
            name, sep, value = part.partition(":")
            if not sep:
                raise ValueError(f"'{part}': give each component as NAME:WEIGHT")
            try:
                items.append((name.strip(), float(value)))
            except ValueError:
                raise ValueError(f"'{part}': weight '{value}' is not a number") from None
    weights: dict[str, float] = {}
    for name, weight in items:
        if name in weights:
            raise ValueError(f"component '{name}' given twice")
        if not math.isfinite(weight) or weight < 0:
            raise ValueError(f"component '{name}': weight must be finite and >= 0, got {weight}")
        weights[name] = weight
    if not weights or not any(weights.values()):
        raise ValueError("give at least one component with a weight above 0")
    return weights
