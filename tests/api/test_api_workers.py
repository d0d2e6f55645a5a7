"""The service scores a causal-LM reranker on a worker per core; encoders stay in-process."""

from __future__ import annotations

import numpy as np

from cisrank.jobs.pool import cores
from cisrank.rerank.cis import CISReranker
from cisrank.rerank.pooled import PooledReranker
from cisrank.serving.config import RerankerSpec
from cisrank.testing import SAMPLE_SENTENCES


def test_cis_is_served_on_a_worker_per_core_and_scores_as_one_copy(tiny_gpt2_dir):
    options = {"estimator": "reverse"}
    served = RerankerSpec(kind="cis", model=str(tiny_gpt2_dir), options=options).build(serving=True)
    try:
        if cores() > 1:
            assert isinstance(served, PooledReranker) and served.workers.count == cores()
        one = CISReranker(str(tiny_gpt2_dir), **options)
        query = "When was the author of Hamlet born?"
        assert np.allclose(
            served.score(query, SAMPLE_SENTENCES), one.score(query, SAMPLE_SENTENCES), atol=1e-5
        )
        assert served.causal_lm is not None  # /v1/context still finds the LM in-process
        served.close()  # as a server's shutdown does; a lifespan run again restarts the workers
        assert np.allclose(
            served.score(query, SAMPLE_SENTENCES[:3]),
            one.score(query, SAMPLE_SENTENCES[:3]),
            atol=1e-5,
        )
    finally:
        served.close()
    single = RerankerSpec(kind="cis", model=str(tiny_gpt2_dir), options=options, workers=1).build(
        serving=True
    )
    assert isinstance(single, CISReranker)
    dense = RerankerSpec(kind="dense").build(serving=True)
    assert not isinstance(dense, PooledReranker)
