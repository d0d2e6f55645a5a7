"""Clients' habits: OpenAI, TEI and infinity clients name a model by its id, probe TEI's
`GET /health` and `GET /info`, read `/openapi.json` for every route, and open `/docs` on hosts
without internet."""

from __future__ import annotations

import copy
import re

import pytest
from api_fakes import OverlapReranker
from fastapi.testclient import TestClient

from cisrank import testing
from cisrank.api.app import create_app
from cisrank.serving.config import BatchingConfig, Limits, RerankerSpec, ServerConfig
from cisrank.version import __version__

TEXTS = testing.SAMPLE_SENTENCES[:3]


@pytest.fixture(scope="module")
def default_dense(tiny_bert_dir):
    """The dense reranker as a server with no model configured serves it: the kind's default
    model (all-MiniLM-L6-v2), here on the tiny BERT's weights."""
    from cisrank.rerank.configs import DenseRerankerConfig
    from cisrank.rerank.registry import load_reranker

    dense = copy.copy(load_reranker("dense", str(tiny_bert_dir)))
    dense.model_name = DenseRerankerConfig().model
    assert dense.model_name == "all-MiniLM-L6-v2"
    return dense


def _client(rerankers, specs, **config) -> TestClient:
    app = create_app(ServerConfig(rerankers=specs, **config), rerankers=rerankers, api_keys=[])
    return TestClient(app)


@pytest.mark.parametrize(
    "name",
    [
        "dense",
        "all-MiniLM-L6-v2",
        "sentence-transformers/all-MiniLM-L6-v2",
        "all-minilm-l6-v2",  # the hub's ids are not case-sensitive
    ],
)
def test_a_default_model_is_named_by_its_id_as_clients_send_it(default_dense, name):
    specs = {"dense": RerankerSpec(kind="dense")}  # the model left to the kind's default
    with _client({"dense": default_dense}, specs) as client:
        embedded = client.post("/v1/embeddings", json={"model": name, "input": TEXTS})
        assert embedded.status_code == 200, embedded.text
        assert embedded.json()["model"] == "dense" and len(embedded.json()["data"]) == 3
        cohere = client.post("/rerank", json={"model": name, "query": "q", "documents": TEXTS})
        assert cohere.status_code == 200 and cohere.json()["model"] == "dense", cohere.text
        tei = client.post("/rerank", json={"model": name, "query": "q", "texts": TEXTS})
        assert tei.status_code == 200 and len(tei.json()) == 3, tei.text
        models = client.get("/v1/models").json()["data"]
        assert [(m["id"], m["model"]) for m in models] == [("dense", "all-MiniLM-L6-v2")]


def test_an_unknown_model_is_refused_with_what_is_served(default_dense):
    specs = {"dense": RerankerSpec(kind="dense")}
    with _client({"dense": default_dense}, specs) as client:
        for path, body in (
            ("/v1/embeddings", {"model": "text-embedding-3-small", "input": "a"}),
            ("/rerank", {"model": "text-embedding-3-small", "query": "q", "texts": TEXTS}),
        ):
            r = client.post(path, json=body)
            assert r.status_code == 422, r.text
            assert r.json()["fields"][0]["field"] == "model"
            assert "choose one of dense (all-MiniLM-L6-v2)" in r.text


def test_model_ids_reach_the_reranker_that_serves_them(default_dense):
    """A catalogue name and its upstream id name each other, an owner-less hub id its model; a
    model id that two rerankers serve embeds with the one that can embed."""
    rerankers = {
        "lm": OverlapReranker(model_name="smollm2-135m-instruct"),
        "over": OverlapReranker(model_name="all-MiniLM-L6-v2"),
        "dense": default_dense,
    }
    specs = {
        "lm": RerankerSpec(kind="cis", model="smollm2-135m-instruct"),
        "over": RerankerSpec(kind="cross-encoder", model="sentence-transformers/all-MiniLM-L6-v2"),
        "dense": RerankerSpec(kind="dense"),
    }
    with _client(rerankers, specs) as client:
        for sent, served in (
            ("HuggingFaceTB/SmolLM2-135M-Instruct", "lm"),
            ("SmolLM2-135M-Instruct", "lm"),
            ("smollm2-135m-instruct", "lm"),
            ("all-MiniLM-L6-v2", "over"),  # in config order, for ranking
        ):
            r = client.post("/v1/rerank", json={"model": sent, "query": "q", "documents": TEXTS})
            assert r.status_code == 200 and r.json()["model"] == served, (sent, r.text)
        r = client.post("/v1/embeddings", json={"model": "all-MiniLM-L6-v2", "input": "a"})
        assert r.status_code == 200 and r.json()["model"] == "dense", r.text


def test_health_is_tei_s(tmp_path):
    from cisrank.api.schemas import TeiError

    loading = create_app(
        ServerConfig(rerankers={"x": RerankerSpec(kind="api_fakes:slow_reranker")})
    )
    r = TestClient(loading).get("/health")  # no lifespan: never loaded
    assert r.status_code == 503 and r.headers["retry-after"] == "1"
    assert TeiError.model_validate(r.json()).error_type == "Unhealthy"
    assert set(r.json()) == {"error", "error_type"}
    broken = create_app(
        ServerConfig(rerankers={"x": RerankerSpec(kind="api_fakes:broken_reranker")})
    )
    with TestClient(broken) as client:
        assert client.app.state.serving.wait_ready(10) is False
        r = client.get("/health")
        assert r.status_code == 503 and "retry-after" not in r.headers
        assert r.json() == {
            "error": "reranker 'x' failed to load; details are in the server log",
            "error_type": "Unhealthy",
        }
    specs = {"over": RerankerSpec(kind="dense", model="m")}
    with _client({"over": OverlapReranker()}, specs) as client:
        r = client.get("/health")
        assert r.status_code == 200 and r.content == b""


def test_info_is_tei_s_filled_from_what_is_served(default_dense, tiny_gpt2_dir):
    from cisrank.rerank.registry import load_reranker

    specs = {"dense": RerankerSpec(kind="dense"), "over": RerankerSpec(kind="dense", model="m")}
    config = {
        "limits": Limits(max_documents=77),
        "batching": BatchingConfig(max_queue=9, max_batch_tokens=4096),
    }
    rerankers = {"dense": default_dense, "over": OverlapReranker()}
    with _client(rerankers, specs, **config) as client:
        info = client.get("/info")
    assert info.status_code == 200, info.text
    body = info.json()
    # the bi-encoder's passage cache as it stands (the fixture is shared: its counts are history)
    assert body.pop("passage_cache") == default_dense.passage_cache.stats()
    assert default_dense.passage_cache.stats()["budget_bytes"] == 64 << 20
    assert body == {
        "model_id": "all-MiniLM-L6-v2",
        "model_sha": None,
        "model_dtype": "float32",
        "model_runtime": "torch",
        "served_model_name": "dense",
        # the encoder of /v1/embeddings (the default, which embeds) and every reranker
        "embeddings": {
            "served_model_name": "dense",
            "model_id": "all-MiniLM-L6-v2",
            "model_dtype": "float32",
            "model_runtime": "torch",
        },
        "rerankers": [
            {
                "served_model_name": "dense",
                "model_id": "all-MiniLM-L6-v2",
                "model_dtype": "float32",
                "model_runtime": "torch",
            },
            {"served_model_name": "over", "model_id": "m", "model_dtype": None}
            | {"model_runtime": None},
        ],
        "model_type": {"reranker": {"id2label": {}, "label2id": {}}},
        "max_concurrent_requests": 9,
        "max_input_length": default_dense.runner.max_length,
        "max_batch_tokens": 4096,
        "max_batch_requests": None,
        "max_client_batch_size": 77,
        "auto_truncate": True,
        "tokenization_workers": 1,
        "version": __version__,
        "sha": None,
        "docker_label": None,
    }
    # a causal LM has no pair limit; its compute type is the engine's
    cis = load_reranker("cis", str(tiny_gpt2_dir))
    with _client({"cis": cis}, {"cis": RerankerSpec(kind="cis", model=str(tiny_gpt2_dir))}) as c:
        info = c.get("/info").json()
    assert info["model_id"] == tiny_gpt2_dir.name  # a server folder by its name only
    assert info["model_dtype"] == "float32" and info["max_input_length"] is None
    assert info["passage_cache"] is None  # a causal LM keeps no passage embeddings
    # protected like /v1/models (TEI guards it with its API key too), 503 while loading
    app = create_app(ServerConfig(rerankers=specs), rerankers=rerankers, api_keys=["k"])
    with TestClient(app) as client:
        assert client.get("/info").status_code == 401
        assert client.get("/health").status_code == 200  # a probe needs no key
    loading = create_app(
        ServerConfig(rerankers={"x": RerankerSpec(kind="api_fakes:slow_reranker")})
    )
    assert TestClient(loading).get("/info").status_code == 503


def test_every_route_is_in_the_openapi_schema():
    from fastapi.routing import APIRoute

    from cisrank.api.docs import DOCS_URL, OAUTH2_REDIRECT_URL, REDOC_URL
    from cisrank.api.routes import router

    app = create_app(ServerConfig(), rerankers={"dense": OverlapReranker()}, api_keys=[])
    with TestClient(app) as client:
        schema = client.get("/openapi.json").json()
    pages = {DOCS_URL, REDOC_URL, OAUTH2_REDIRECT_URL}
    # the API's routes and any the app adds itself (FastAPI may nest the included router)
    routes = {
        (method.lower(), route.path)
        for route in [*router.routes, *app.routes]
        if isinstance(route, APIRoute) and route.path not in pages
        for method in route.methods
    }
    documented = {(m, path) for path, ops in schema["paths"].items() for m in ops}
    assert routes == documented
    assert {("post", "/rerank"), ("post", "/v2/rerank"), ("get", "/health"), ("get", "/info")} <= (
        documented
    )
    # /rerank reads either shape: both are documented, each with its own answer
    body = schema["paths"]["/rerank"]["post"]["requestBody"]["content"]["application/json"]
    shapes = body["schema"]["oneOf"]
    assert shapes[0] == {"$ref": "#/components/schemas/RerankRequest"}
    assert {"query", "texts", "raw_scores"} <= set(shapes[1]["properties"])
    answer = schema["paths"]["/rerank"]["post"]["responses"]["200"]["content"]
    assert len(answer["application/json"]["schema"]["oneOf"]) == 2
    assert "RerankRequest" in schema["components"]["schemas"]


@pytest.mark.parametrize(
    ("page", "kinds"),
    [("/docs", {"javascript", "css", "png"}), ("/redoc", {"javascript", "png"})],
)
def test_docs_render_from_installed_assets(page, kinds):
    app = create_app(ServerConfig(), rerankers={"dense": OverlapReranker()}, api_keys=[])
    with TestClient(app) as client:
        html = client.get(page)
        assert html.status_code == 200 and "text/html" in html.headers["content-type"]
        urls = re.findall(r"""(?:src|href|spec-url)\s*=\s*["']([^"']+)["']""", html.text)
        urls += re.findall(r"""url:\s*["']([^"']+)["']""", html.text)  # the schema it reads
        assert urls and "/openapi.json" in urls
        assert not re.search(r"https?://|//[a-z]", html.text, re.IGNORECASE), html.text
        served = set()
        for url in urls:
            assert url.startswith("/"), url  # this server, never a CDN
            r = client.get(url)
            assert r.status_code == 200 and r.content, url
            served |= {k for k in ("javascript", "css", "png") if k in r.headers["content-type"]}
        assert served == kinds
