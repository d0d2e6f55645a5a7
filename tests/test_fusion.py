"""The one fusion module (`cisrank.fusion`) against hand computations: every normalization, RRF
with and without weights, linear fusion, and that `fuse`'s RRF is `rrf` over each scorer's order.
The callers' own tests (tests/rerank/test_hybrid.py, tests/retrieval/test_fusion.py,
tests/api/test_api_rerank.py, tests/distill/test_teacher_set.py) check that each fuses as before."""

from __future__ import annotations

import math

import pytest

from cisrank.data.runs import Run
from cisrank.fusion import RRF_K, fuse, fuse_runs, linear, minmax, normalize, rrf, sigmoid, zscore

NAN = float("nan")


def _same(got: list[float], want: list[float]) -> bool:
    """Equal to the last bit, NaN equal to NaN."""
    return len(got) == len(want) and all(
        (math.isnan(g) and math.isnan(w)) or g == w for g, w in zip(got, want, strict=True)
    )


def test_minmax_by_hand():
    assert minmax([3.0, 1.0, 2.0]) == [1.0, 0.0, 0.5]
    assert minmax([-4.0, 4.0, 0.0, 2.0]) == [0.0, 1.0, 0.5, 0.75]
    assert minmax([]) == []
    # a list it cannot spread: 0 where it is fused, 1 where the server shows it
    assert minmax([2.0, 2.0]) == [0.0, 0.0]
    assert minmax([5.0], constant=1.0) == [1.0]
    assert minmax([math.inf, math.inf], constant=1.0) == [1.0, 1.0]


def test_minmax_leaves_nan_out_of_the_range_wherever_it_stands():
    assert _same(minmax([NAN, 1.0, 3.0]), [NAN, 0.0, 1.0])
    assert _same(minmax([1.0, NAN, 3.0]), [0.0, NAN, 1.0])
    assert _same(minmax([NAN, 2.0], constant=1.0), [NAN, 1.0])
    assert _same(minmax([NAN, NAN]), [NAN, NAN])


def test_zscore_by_hand():
    # mean 2.5; population variance (2.25 + 0.25 + 0.25 + 2.25) / 4 = 1.25
    s = math.sqrt(1.25)
    assert zscore([1.0, 2.0, 3.0, 4.0]) == [-1.5 / s, -0.5 / s, 0.5 / s, 1.5 / s]
    assert zscore([7.0, 7.0, 7.0]) == [0.0, 0.0, 0.0]
    assert zscore([]) == []
    assert normalize([1.0, 2.0, 3.0, 4.0], "zscore") == zscore([1.0, 2.0, 3.0, 4.0])
    with pytest.raises(ValueError, match="minmax, zscore"):
        normalize([1.0], "sigmoid")


def test_sigmoid_by_hand_and_without_overflow():
    e = math.exp(-2.0)
    assert sigmoid([0.0, 2.0, -2.0]) == [0.5, 1 / (1 + e), e / (1 + e)]
    assert sigmoid([-800.0, 800.0]) == [0.0, 1.0]


def test_rrf_weighted_by_hand_with_ties_by_first_appearance():
    # k = 1: a = 2/2 = 1; b = 2/3 + 1/2; c = 1/3
    fused = rrf([["a", "b"], ["b", "c"]], k=1.0, weights=[2.0, 1.0])
    assert fused == [("b", 2.0 * (1 / 3) + 1 / 2), ("a", 1.0), ("c", 1 / 3)]
    # unweighted, k = 0: x = 1, y = 1/2 + 1/2 = 1, z = 1: all tied, first appearance decides
    assert rrf([["x", "y"], ["z", "y"]], k=0.0) == [("x", 1.0), ("y", 1.0), ("z", 1.0)]
    assert rrf([["d"]]) == [("d", 1 / (RRF_K + 1))] and RRF_K == 60.0
    with pytest.raises(ValueError, match="k must be >= 0"):
        rrf([["a"]], k=-1.0)
    with pytest.raises(ValueError, match="2 rankings for 1 weights"):
        rrf([["a"], ["b"]], weights=[1.0])


def test_linear_fusion_by_hand():
    a, b = [1.0, 3.0], [10.0, 0.0]
    # min-max: a -> [0, 1], b -> [1, 0]; z-scores: a -> [-1, 1], b -> [1, -1]
    assert linear([a, b], [0.5, 2.0]) == [2.0, 0.5]
    assert linear([a, b], [0.5, 2.0], "zscore") == [1.5, -1.5]
    assert fuse([a, b], [0.5, 2.0]) == linear([a, b], [0.5, 2.0])
    with pytest.raises(ValueError, match="2 score lists for 1 weights"):
        linear([a, b], [1.0])


def test_fuse_rrf_is_rrf_over_each_scorers_order():
    # ranks of [0.1, 0.9, 0.5, 0.5]: [4, 1, 2, 3] (the tie by input order); k = 0
    assert fuse([[0.1, 0.9, 0.5, 0.5]], [1.0], "rrf", k=0.0) == [1 / 4, 1.0, 1 / 2, 1 / 3]
    a, b = [0.1, 0.9, 0.5], [3.0, 2.0, 1.0]
    # a's ranks [3, 1, 2], b's [1, 2, 3]; weights 1 and 3, k = 60
    want = [1 * (1 / 63) + 3 * (1 / 61), 1 * (1 / 61) + 3 * (1 / 62), 1 * (1 / 62) + 3 * (1 / 63)]
    assert fuse([a, b], [1.0, 3.0], "rrf") == want
    with pytest.raises(ValueError, match="k must be >= 0"):
        fuse([a], [1.0], "linear", k=-1.0)
    with pytest.raises(ValueError, match="one score per passage"):
        fuse([a, b[:2]], [1.0, 1.0], "rrf")


def test_fuse_runs_fuses_the_head_and_keeps_the_tail_under_it():
    first = Run.from_scores("bm25", {"q": [("d1", 3.0), ("d2", 2.0), ("d3", 1.0)]})
    other = Run.from_scores("cis", {"q": [("d2", 0.5), ("d1", 0.1), ("d3", 0.0)]})
    fused = fuse_runs([first, other], [1.0, 1.0], depth=2)
    # head d1, d2: min-max of [3, 2] -> [1, 0] and of [0.1, 0.5] -> [0, 1]: both 1.0, d1 first
    # (ties keep the first run's order); d3 below, at the head's lowest score minus 1
    assert fused.rankings["q"][0][0] == "d1" and fused.rankings["q"][1][0] == "d2"
    assert fused.rankings["q"][2] == ("d3", 0.0)
