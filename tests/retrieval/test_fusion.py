"""Reciprocal-rank fusion against a hand computation."""

import pytest

from cisrank.data.types import SearchHit
from cisrank.fusion import rrf
from cisrank.retrieval.fusion import FusionRetriever


def test_rrf_matches_hand_computation():
    # k = 60: a: 1/61 + 1/63, b: 1/62 + 1/61, c: 1/63, d: 1/62
    fused = rrf([["a", "b", "c"], ["b", "d", "a"]], k=60)
    expected = {
        "a": 1 / 61 + 1 / 63,
        "b": 1 / 62 + 1 / 61,
        "c": 1 / 63,
        "d": 1 / 62,
    }
    assert [d for d, _ in fused] == ["b", "a", "d", "c"]
    for d, s in fused:
        assert s == pytest.approx(expected[d], abs=1e-15)


def test_rrf_k_changes_the_order_and_ties_keep_first_appearance():
    # x is first in one run only; y is second in both. k=0: x 1 vs y 1/2+1/2 = 1 (tie, x first)
    assert rrf([["x", "y"], ["z", "y"]], k=0) == [("x", 1.0), ("y", 1.0), ("z", 1.0)]
    # k=60: y = 2/62 beats x = 1/61
    assert [d for d, _ in rrf([["x", "y"], ["z", "y"]], k=60)] == ["y", "x", "z"]


class _Fixed:
    def __init__(self, name, docids):
        self.name, self.docids = name, docids

    def search(self, query, k=10):
        return self.batch_search([query], k)[0]

    def batch_search(self, queries, k=10):
        return [
            [SearchHit(d, 1.0 / r, f"text {d}") for r, d in enumerate(self.docids[:k], 1)]
            for _ in queries
        ]


def test_fusion_retriever_uses_each_engines_top_depth():
    fr = FusionRetriever(
        [_Fixed("a", ["1", "2", "3"]), _Fixed("b", ["3", "4", "1"])], k=60, depth=2
    )
    hits = fr.search("q", k=2)
    # depth 2: runs [1, 2] and [3, 4]: 1 and 3 tie at 1/61 (1 seen first), 2 and 4 at 1/62
    assert [h.docid for h in hits] == ["1", "3"]
    assert hits[0].text == "text 1" and hits[0].score == pytest.approx(1 / 61)
    # asking for more than depth widens every engine's list: 1 = 1/61 + 1/63 now
    hits = fr.search("q", k=3)
    assert [h.docid for h in hits] == ["1", "3", "2"]
    assert hits[0].score == pytest.approx(1 / 61 + 1 / 63)
    assert fr.name == "rrf(a,b)"
