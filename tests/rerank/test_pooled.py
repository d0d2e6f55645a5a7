"""A reranker on several processes scores what one copy scores, in input order."""

from __future__ import annotations

import numpy as np
import pytest
from builders import InProcessPool

from cisrank.errors import CisrankError
from cisrank.jobs.pool import WorkerOptions, balanced_split, cores
from cisrank.rerank.pooled import PooledReranker
from cisrank.rerank.registry import RerankerSpec, load_reranker
from cisrank.testing import SAMPLE_SENTENCES

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
    spec = RerankerSpec(kind="cis", model=str(tiny_gpt2_dir), options=options)
    pooled = PooledReranker(spec, WorkerOptions(workers=3))
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
    pooled = PooledReranker(RerankerSpec(kind="dense"), WorkerOptions(workers=1))
    assert pooled.pool is None
    assert pooled.score_batch([("q", ["a b", "c"])]) == pooled.local.score_batch(
        [("q", ["a b", "c"])]
    )


def test_a_worker_that_cannot_load_says_why(tmp_path):
    missing = tmp_path / "no-model"
    with pytest.raises(CisrankError, match="no-model"):
        PooledReranker(RerankerSpec(kind="cis", model=str(missing)), WorkerOptions(workers=2))


def test_shares_are_balanced_and_deterministic():
    costs = [10, 1, 1, 1, 7, 3, 3]
    shares = balanced_split(costs, 2)
    assert sorted(i for s in shares for i in s) == list(range(len(costs)))
    loads = [sum(costs[i] for i in s) for s in shares]
    assert abs(loads[0] - loads[1]) <= 1 and shares == balanced_split(costs, 2)
    with pytest.raises(CisrankError, match="--workers must be >= 1"):
        WorkerOptions(workers=0)


@pytest.fixture
def in_process_pool(monkeypatch):
    return InProcessPool.installed(monkeypatch)


def test_a_pool_pays_once_its_saving_exceeds_its_start():
    from cisrank.rerank.pooled import PoolCost

    cost = PoolCost(start_s=10.0)
    # two workers run 1.78x one: they save 1 - 1/1.78 of the work, so 10 s of start pays
    # from 10 / (1 - 1/1.78) = 22.82 s of work on
    assert cost.speedup(2) == pytest.approx(1.78) and cost.speedup(3) == pytest.approx(2.56)
    assert cost.pays(2, 22.9) and not cost.pays(2, 22.7)
    assert cost.pays(3, 16.5) and not cost.pays(3, 16.3)  # 10 / (1 - 1/2.56) = 16.41
    assert not cost.pays(1, 1e9)


def test_small_work_stays_here_and_large_work_starts_the_workers(tiny_bert_dir, in_process_pool):
    reference = load_reranker("dense", str(tiny_bert_dir))
    requests = _requests()
    expected = reference.score_batch(requests)

    dense = RerankerSpec(kind="dense", model=str(tiny_bert_dir))
    small = PooledReranker(dense, WorkerOptions(2), when_it_pays=True)
    assert small.pool is None and small.deciding
    assert np.allclose(small.score_batch(requests[:1])[0], expected[0], atol=1e-6, rtol=0)
    assert small.pool is None and in_process_pool == []  # three passages: no worker started

    chars = 1e12  # the work a whole evaluation announces: it pays at the first batch
    large = PooledReranker(dense, WorkerOptions(2), when_it_pays=True, expected_chars=chars)
    got = large.score_batch(requests)
    assert large.pool is not None and not large.deciding and len(in_process_pool) == 1
    assert in_process_pool[0].items == 1  # the rest of the batch went to the worker
    for g, e in zip(got, expected, strict=True):
        assert np.allclose(g, e, atol=1e-6, rtol=0)
    again = large.score_batch(requests)  # and so do the batches after it
    assert in_process_pool[0].items == 2 and all(
        np.allclose(a, e, atol=1e-6, rtol=0) for a, e in zip(again, expected, strict=True)
    )


def test_an_explicit_worker_count_is_obeyed(tiny_bert_dir, in_process_pool):
    spec = RerankerSpec(kind="dense", model=str(tiny_bert_dir))
    given = spec.build(WorkerOptions(2))
    assert isinstance(given, PooledReranker) and given.pool is not None
    assert len(in_process_pool) == 1
    chosen = spec.build(WorkerOptions())
    assert not isinstance(chosen, PooledReranker) or chosen.deciding  # one core: no pool at all
    assert not isinstance(spec.build(), PooledReranker)  # no workers asked: one copy here
    served = RerankerSpec(kind="dense", model=str(tiny_bert_dir), workers=2).build(serving=True)
    assert isinstance(served, PooledReranker) and served.pool is not None  # a server's: eager
    assert not served.deciding and len(in_process_pool) == 2


def test_the_default_worker_count_is_decided_by_the_spec():
    """One place: a served encoder on one process, a served causal LM on a worker per core (the
    pool's default), one on a GPU; an explicit count, the call's or the spec's, stands."""
    cis, dense = RerankerSpec(kind="cis"), RerankerSpec(kind="dense")
    assert dense.pool(None, serving=True) == WorkerOptions(1, cores())  # one, on every core
    thin = RerankerSpec(kind="dense", threads_per_worker=1)
    assert thin.pool(None, serving=True) == WorkerOptions(1, 1)
    assert cis.pool(None, serving=True) == WorkerOptions()
    assert dense.pool(None, serving=False) == WorkerOptions()  # a job's: once it pays
    assert RerankerSpec(kind="cis", options={"device": "cuda"}).pool(None, True) == WorkerOptions(1)
    assert dense.pool(WorkerOptions(3, 2), serving=True) == WorkerOptions(3, 2)
    own = RerankerSpec(kind="dense", workers=4, threads_per_worker=2)
    assert own.pool(None, serving=True) == WorkerOptions(4, 2)
