"""An engine built outside the app: an embedding program makes its own `Serving` from a config,
hands it to `create_app(serving=...)`, and the app serves that engine and no other."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from cisrank.api.app import create_app
from cisrank.errors import CisrankError
from cisrank.serving import RankingService, RerankerSpec, RerankQuery, ServerConfig, Serving
from cisrank.testing import SAMPLE_SENTENCES

QUERY = "When was the author of Hamlet born?"
DOCUMENTS = SAMPLE_SENTENCES[:6]


def test_a_handed_in_engine_answers_rerank_as_its_own_ranking(tiny_bert_dir):
    spec = RerankerSpec(kind="dense", model=str(tiny_bert_dir))
    serving = Serving(ServerConfig(rerankers={"tiny": spec}))  # the program's own engine
    app = create_app(serving=serving, api_keys=[])
    assert app.state.serving is serving and app.state.metrics is serving.metrics
    with TestClient(app) as client:  # the app's startup loads the engine's models
        assert serving.wait_ready(120), serving.error
        r = client.post("/v1/rerank", json={"query": QUERY, "documents": DOCUMENTS, "top_n": 4})
        assert r.status_code == 200, r.text
        # the program asks its engine directly, on the app's event loop (its batcher's)
        own = client.portal.call(
            RankingService(serving).rerank, RerankQuery(query=QUERY, documents=DOCUMENTS, top_n=4)
        )
    served = [(res["index"], res["relevance_score"]) for res in r.json()["results"]]
    assert served == [(d.index, d.score) for d in own.results]
    assert len(served) == 4 and own.reranker == "tiny"
    assert [s for _, s in served] == sorted((s for _, s in served), reverse=True)


def test_what_belongs_to_the_engine_is_refused_beside_one(tiny_dense):
    config = ServerConfig(rerankers={"tiny": RerankerSpec(kind="dense")})
    serving = Serving(config, rerankers={"tiny": tiny_dense})
    with pytest.raises(CisrankError, match=r"create_app: config, rerankers are the engine's own"):
        create_app(config, serving=serving, rerankers={"tiny": tiny_dense})
    with pytest.raises(CisrankError, match=r"create_app: preflight are the engine's own"):
        create_app(serving=serving, preflight=False)
