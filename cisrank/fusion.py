"""Score normalization and fusion: the one home of min-max, z-scores, the sigmoid, reciprocal-rank
fusion with its constant, and linear fusion, for every caller (first-stage fusion in `retrieval/`,
the `hybrid` reranker, `cisrank eval fuse`, the fused labels of `distill`'s teacher sets, the
scores the server shows).

Why two fusion methods. A causal LM's log-likelihood ratio, a cosine and a BM25 score live on
unrelated scales, so they cannot be added raw. Linear fusion first maps each scorer's scores for
one query onto a common scale (min-max to [0, 1], or z-scores) and then takes a weighted sum: it
keeps *how much* better one passage is than another. Reciprocal-rank fusion (Cormack, Clarke and
Büttcher, SIGIR 2009) keeps only the ranks, `sum_i w_i / (k + rank_i)`, which is robust to
outlying scores and needs no normalization; `k` (60 in that paper, `RRF_K`) damps the weight of
the very top ranks. Both are computed per query over that query's candidates, so the fused order
never depends on other queries.

The functions work on aligned score lists (`fuse`), as a reranker sees them, on ranked id lists
(`rrf`), as several first stages return them, and on whole runs (`fuse_runs`), as
`bench/hybrid_select.py` chooses weights from saved runs; `fuse_runs` goes through `fuse`, so
weights chosen on runs give exactly the ranking the `hybrid` reranker serves, provided the first
stage enters as its rank (`input_order`), as the reranker sees it.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from typing import Literal, TypeVar

from cisrank.data.runs import Run
from cisrank.data.types import rank_order
from cisrank.errors import DataError

Method = Literal["linear", "rrf"]
Normalization = Literal["minmax", "zscore"]
METHODS: tuple[str, ...] = ("linear", "rrf")
NORMALIZATIONS: tuple[str, ...] = ("minmax", "zscore")
RRF_K = 60.0
"""RRF's k, the value of Cormack, Clarke and Büttcher (SIGIR 2009)."""

Id = TypeVar("Id", bound=Hashable)


# ------------------------------------------------------------------------ normalizations


def minmax(scores: Sequence[float], constant: float = 0.0) -> list[float]:
    """Scores of one query onto [0, 1], the lowest 0 and the highest 1.

    A list that cannot be spread (one value, or all equal) maps to `constant`: 0 where the scores
    are fused (a scorer that cannot tell the passages apart adds nothing to their fused order),
    1 where they are shown (the server's `normalize="minmax"`: every passage is as good as the
    best). A NaN score stays NaN and takes no part in the range, wherever it stands."""
    values = [float(s) for s in scores]
    finite = [v for v in values if not math.isnan(v)]
    if not finite:
        return [constant if not math.isnan(v) else v for v in values]
    low, high = min(finite), max(finite)
    span = high - low
    if not span > 0:
        return [v if math.isnan(v) else constant for v in values]
    return [(v - low) / span for v in values]


def zscore(scores: Sequence[float]) -> list[float]:
    """Scores of one query as standard scores (population std, sums exact by `math.fsum`); a
    constant list maps to zeros, as in `minmax`."""
    values = [float(s) for s in scores]
    if not values:
        return []
    mean = math.fsum(values) / len(values)
    std = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / len(values))
    return [(v - mean) / std if std > 0 else 0.0 for v in values]


def sigmoid(scores: Sequence[float]) -> list[float]:
    """The logistic function of each score, written so that no large score overflows."""
    return [
        1.0 / (1.0 + math.exp(-s)) if s >= 0 else math.exp(s) / (1.0 + math.exp(s)) for s in scores
    ]


def normalize(scores: Sequence[float], how: str = "minmax") -> list[float]:
    """Scores of one query on the common scale linear fusion adds (`NORMALIZATIONS`)."""
    if how == "minmax":
        return minmax(scores)
    if how == "zscore":
        return zscore(scores)
    raise ValueError(f"normalization must be one of {', '.join(NORMALIZATIONS)}, got {how!r}")


# ------------------------------------------------------------------------------- fusion


def rrf(
    rankings: Sequence[Sequence[Id]],
    k: float = RRF_K,
    weights: Sequence[float] | None = None,
) -> list[tuple[Id, float]]:
    """Reciprocal-rank fusion of ranked id lists: `sum_r w_r / (k + rank_r(d))`, rank from 1,
    over the lists each id appears in (weights 1 when None). Best first, ties broken by first
    appearance across the lists."""
    if k < 0:
        raise ValueError(f"RRF k must be >= 0, got {k}")
    if weights is not None and len(weights) != len(rankings):
        raise ValueError(f"{len(rankings)} rankings for {len(weights)} weights")
    scores: dict[Id, float] = {}
    for r, ranking in enumerate(rankings):
        for rank, item in enumerate(ranking, 1):
            part = 1.0 / (k + rank)
            scores[item] = scores.get(item, 0.0) + (part if weights is None else weights[r] * part)
    order = {d: i for i, d in enumerate(scores)}
    return sorted(scores.items(), key=lambda p: (-p[1], order[p[0]]))


def linear(
    components: Sequence[Sequence[float]],
    weights: Sequence[float],
    normalization: str = "minmax",
) -> list[float]:
    """`sum_i w_i * norm_i(s)` per passage, from aligned per-scorer score lists of one query."""
    fused = [0.0] * _aligned(components, weights)
    for scores, weight in zip(components, weights, strict=True):
        for i, part in enumerate(normalize(scores, normalization)):
            fused[i] += weight * part
    return fused


def fuse(
    components: Sequence[Sequence[float]],
    weights: Sequence[float],
    method: str = "linear",
    normalization: str = "minmax",
    k: float = RRF_K,
) -> list[float]:
    """One fused score per passage from aligned per-scorer score lists of one query, by `linear`
    or by `rrf` over each scorer's order (`rank_order`: ties by input order)."""
    if method not in METHODS:
        raise ValueError(f"fusion method must be one of {', '.join(METHODS)}, got {method!r}")
    n = _aligned(components, weights)
    if k < 0:
        raise ValueError(f"RRF k must be >= 0, got {k}")
    if method == "linear":
        return linear(components, weights, normalization)
    fused = dict(rrf([rank_order(list(c)) for c in components], k, weights))
    return [fused[i] for i in range(n)]


def _aligned(components: Sequence[Sequence[float]], weights: Sequence[float]) -> int:
    """The passages' count, once every scorer is known to score each of them."""
    if len(components) != len(weights) or not components:
        raise ValueError(f"{len(components)} score lists for {len(weights)} weights")
    n = len(components[0])
    if any(len(c) != n for c in components):
        raise ValueError("fusion needs one score per passage from every scorer")
    return n


# --------------------------------------------------------------------------------- runs


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
