"""A reranker on several processes scores what one copy scores, in input order."""

from __future__ import annotations

import numpy as np
import pytest

from cisrank.errors import CisrankError
from cisrank.rerank.pooled import PooledReranker
from cisrank.rerank.registry import load_reranker
from cisrank.testing import SAMPLE_SENTENCES
from cisrank.workers import WorkerOptions, balanced_split

QUERIES = ["When was the author of Hamlet born?", "What is the capital of France?", "fleas"]


def _requests() -> list[tuple[str, list[str]]]:
    # passages shared across queries (the reverse estimator's shared contexts), an empty
    # request, a repeated passage within one request
    return [
        (QUERIES[0], [*SAMPLE_SENTENCES[:5], SAMPLE_SENTENCES[0]]),
        (QUERIES[1], []),
        (QUERIES[1], SAMPLE_SENTENCES[2:7]),
        (QUERIES[2], SAMPLE_SENTENCES[::-1][:4]),
    ]


@pytest.mark.parametrize("estimator", ["forward", "reverse"])
def test_cis_on_three_processes_scores_as_one_copy(tiny_gpt2_dir, estimator):
    options = {"estimator": estimator, "template": "qa"}
    reference = load_reranker("cis", str(tiny_gpt2_dir), **options)
    expected = [reference.score(q, ps) if ps else [] for q, ps in _requests()]
    pooled = PooledReranker("cis", str(tiny_gpt2_dir), WorkerOptions(workers=3), **options)
    try:
        assert pooled.pool is not None and pooled.pool.processes == 2
        got = pooled.score_batch(_requests())
        assert [len(g) for g in got] == [len(e) for e in expected]
        for g, e in zip(got, expected, strict=True):
            assert np.allclose(g, e, atol=1e-5, rtol=0)
        assert got[0][0] == got[0][5]  # one passage twice in a request: one score
        assert pooled.name == "cis" and pooled.model_name == reference.model_name
    finally:
        pooled.close()


def test_one_worker_is_the_reranker_itself(tiny_gpt2_dir):
    pooled = PooledReranker("dense", None, WorkerOptions(workers=1))
    assert pooled.pool is None
    assert pooled.score_batch([("q", ["a b", "c"])]) == pooled.local.score_batch(
        [("q", ["a b", "c"])]
    )


def test_a_worker_that_cannot_load_says_why(tmp_path):
    missing = tmp_path / "no-model"
    with pytest.raises(CisrankError, match="no-model"):
        PooledReranker("cis", str(missing), WorkerOptions(workers=2))


def test_shares_are_balanced_and_deterministic():
    costs = [10, 1, 1, 1, 7, 3, 3]
    shares = balanced_split(costs, 2)
    assert sorted(i for s in shares for i in s) == list(range(len(costs)))
    loads = [sum(costs[i] for i in s) for s in shares]
    assert abs(loads[0] - loads[1]) <= 1 and shares == balanced_split(costs, 2)
    with pytest.raises(CisrankError, match="--workers must be >= 1"):
        WorkerOptions(workers=0)
