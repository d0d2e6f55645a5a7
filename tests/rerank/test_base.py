"""The reranker contract: `score_batch` is the one method to write; `score`/`rank` derive from it."""

from __future__ import annotations

import pytest

from cisrank.data.types import rank_order, top_order
from cisrank.rerank import BaseReranker, IdentityReranker, Reranker, load_reranker


class VowelReranker(BaseReranker):
    """Implements only `score_batch`: vowels of the passage that also occur in the query."""

    name = "vowels"
    model_name = "v1"

    def __init__(self) -> None:
        self.calls: list[list[tuple[str, tuple[str, ...]]]] = []

    def score_batch(self, requests):
        self.calls.append([(q, tuple(p)) for q, p in requests])
        return [[float(sum(c in q for c in p if c in "aeiou")) for p in ps] for q, ps in requests]


PASSAGES = ["xyz", "banana", "eel", "aeiou", "banana"]


def test_score_and_rank_derive_from_score_batch():
    r = VowelReranker()
    assert isinstance(r, Reranker) and not r.keeps_order
    assert r.score("ae", PASSAGES) == [0.0, 3.0, 2.0, 2.0, 3.0]
    assert r.calls == [[("ae", tuple(PASSAGES))]]  # one request, through score_batch
    ranked = r.rank("ae", PASSAGES, top_n=3)
    assert [(p.index, p.score, p.text) for p in ranked] == [
        (1, 3.0, "banana"),
        (4, 3.0, "banana"),
        (2, 2.0, "eel"),
    ]
    assert [p.index for p in r.rank("ae", PASSAGES)] == rank_order(r.score("ae", PASSAGES))
    assert r.rank("ae", []) == []
    with pytest.raises(ValueError, match="top_n"):
        r.rank("ae", PASSAGES, top_n=0)


def test_the_cut_to_top_n_keeps_the_best_and_refuses_under_one():
    scores = [0.5, float("nan"), 2.0, 0.5, 1.0]
    assert top_order(scores) == [2, 4, 0, 3, 1]  # ties in input order, NaN last
    assert top_order(scores, 2) == [2, 4]
    assert top_order(scores, 9) == [2, 4, 0, 3, 1]
    for bad in (0, -3):
        with pytest.raises(ValueError, match=f"top_n must be >= 1, got {bad}"):
            top_order(scores, bad)


def test_rank_refuses_a_bad_top_n_before_scoring():
    r = VowelReranker()
    with pytest.raises(ValueError, match="top_n must be >= 1, got -3"):
        r.rank("ae", PASSAGES, top_n=-3)
    assert r.calls == []


def test_score_batch_is_the_abstract_method():
    class Nothing(BaseReranker):
        pass

    with pytest.raises(TypeError, match="score_batch"):
        Nothing()


def test_identity_keeps_the_input_order():
    r = load_reranker("none", "ignored-model", batch_size=4)
    assert isinstance(r, IdentityReranker) and isinstance(r, Reranker)
    assert r.name == "none" and r.keeps_order
    assert r.score_batch([("q", ["c", "a", "b"]), ("q2", []), ("q3", ["z"])]) == [
        [3.0, 2.0, 1.0],
        [],
        [1.0],
    ]
    texts = ["zeta", "alpha", "alpha", "mid"]
    assert [p.index for p in r.rank("q", texts)] == [0, 1, 2, 3]
    assert [p.text for p in r.rank("q", texts, top_n=2)] == ["zeta", "alpha"]
