"""What a bare `cisrank serve` serves (`ServerConfig()`): all-MiniLM-L6-v2 on `--backend auto`
(ONNX Runtime int8 with the `onnx` extra) as the default of /v1/rerank, the shipped student by
name, and the same bi-encoder in float32 as the encoder of /v1/embeddings; `/v1/models` and
`/info` say the runtime and number format of each; without onnxruntime, `auto`'s fallback,
said in the log and in `/info`.

The serving tests run the default specs with the model swapped for the tiny BERT (the options,
the names and the embeddings choice as the default has them), checked against a float32 mean
pooling computed here and against the int8 reranker loaded directly."""

from __future__ import annotations

import importlib.util
import logging

import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient
from transformers import AutoModel, AutoTokenizer

from cisrank.api.app import create_app
from cisrank.rerank import load_reranker
from cisrank.rerank.configs import DenseRerankerConfig
from cisrank.runtimes import auto
from cisrank.serving.config import RerankerSpec, ServerConfig
from cisrank.testing import SAMPLE_SENTENCES

needs_onnxruntime = pytest.mark.skipif(
    not all(importlib.util.find_spec(name) for name in ("onnxruntime", "onnx")),
    reason="the default's runtime needs the 'onnx' extra: pip install 'cisrank[onnx]'",
)

QUERY = "When was the author of Hamlet born?"
TEXTS = list(SAMPLE_SENTENCES[:4])


def float32_embeddings(path, texts) -> np.ndarray:
    """Mean-pooled, L2-normalized float32 embeddings, one text at a time (no padding): the tiny
    BERT's sentence-transformers pooling, computed without sentence-transformers."""
    tok = AutoTokenizer.from_pretrained(str(path))
    model = AutoModel.from_pretrained(str(path), dtype=torch.float32).eval()
    rows = []
    for text in texts:
        enc = tok(text, return_tensors="pt", truncation=True, max_length=512)
        with torch.no_grad():
            v = model(**enc).last_hidden_state[0].mean(dim=0)
        rows.append((v / v.norm()).numpy())
    return np.stack(rows)


def default_config_on(model: str, *, student: bool = False) -> ServerConfig:
    """The bare server's config with each bi-encoder's model set to `model` (and the student
    left out unless asked: it is the real shipped one)."""
    bare = ServerConfig()
    specs = {
        name: spec.model_copy(update={"model": model})
        for name, spec in bare.rerankers.items()
        if spec.kind == "dense"
    }
    if student:
        specs["student"] = bare.rerankers["student"]
    order = [n for n in bare.rerankers if n in specs]
    return ServerConfig(rerankers={n: specs[n] for n in order}, embeddings=bare.embeddings)


@pytest.fixture
def on_cpu(monkeypatch):
    monkeypatch.setattr(auto, "_on_gpu", lambda device: False)


@pytest.fixture
def export_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("default-onnx-cache")))


@needs_onnxruntime
def test_the_default_is_minilm_int8_on_onnx_and_embeddings_are_its_float32(on_cpu):
    """Where onnxruntime is installed, the default reranker resolves to all-MiniLM-L6-v2 on ONNX
    Runtime int8 (DL21 0.5801, bench/RESULTS.md) and the embeddings encoder to the same model
    in float32."""
    bare = ServerConfig()
    rerank = bare.rerankers[bare.default_reranker_name]
    embed = bare.rerankers[bare.embeddings or ""]
    for spec, runs_on in ((rerank, ("onnx", "int8")), (embed, ("onnx", "float32"))):
        c = DenseRerankerConfig().replace(model=spec.model, **spec.options)
        assert spec.kind == "dense" and c.model == "all-MiniLM-L6-v2"
        assert auto.resolve_embedder_backend(c.backend, c.device, c.dtype) == runs_on
    assert bare.rerankers["student"] == RerankerSpec(kind="student")


@needs_onnxruntime
def test_the_default_specs_rerank_in_int8_and_embed_in_float32(tiny_bert_dir, on_cpu, export_cache):
    config = default_config_on(str(tiny_bert_dir))
    int8 = load_reranker("dense", str(tiny_bert_dir), backend="onnx", dtype="int8")
    reference = float32_embeddings(tiny_bert_dir, TEXTS)
    # int8 really is further from float32 than float32's rounding: the check below can fail
    assert np.abs(int8.embed(TEXTS) - reference).max() > 1e-5
    app = create_app(config, api_keys=[], preflight=False, hold_until_loaded=lambda: True)
    with TestClient(app) as client:
        models = client.get("/v1/models").json()
        info = client.get("/info").json()
        ranked = client.post("/v1/rerank", json={"query": QUERY, "documents": TEXTS}).json()
        plain = client.post("/v1/embeddings", json={"input": TEXTS}).json()
        by_id = client.post("/v1/embeddings", json={"input": TEXTS, "model": tiny_bert_dir.name})
        named = client.post("/v1/embeddings", json={"input": TEXTS, "model": "dense"}).json()
    assert (models["default"], models["embeddings"]) == ("dense", "dense-float32")
    assert [(m["id"], m["runtime"], m["dtype"]) for m in models["data"]] == [
        ("dense", "onnx", "int8"),
        ("dense-float32", "onnx", "float32"),
    ]
    assert (info["served_model_name"], info["model_runtime"], info["model_dtype"]) == (
        "dense",
        "onnx",
        "int8",
    )
    assert info["embeddings"] == {
        "served_model_name": "dense-float32",
        "model_id": tiny_bert_dir.name,
        "model_dtype": "float32",
        "model_runtime": "onnx",
    }
    assert [(r["served_model_name"], r["model_dtype"]) for r in info["rerankers"]] == [
        ("dense", "int8"),
        ("dense-float32", "float32"),
    ]
    # /v1/rerank without a model: the int8 reranker's scores
    assert ranked["model"] == "dense"
    got = {r["index"]: r["relevance_score"] for r in ranked["results"]}
    assert [got[i] for i in range(len(TEXTS))] == pytest.approx(int8.score(QUERY, TEXTS), abs=1e-6)
    # /v1/embeddings without a model and by model id (shared with the int8 reranker): float32
    for body in (plain, by_id.json()):
        assert body["model"] == "dense-float32"
        rows = np.array([d["embedding"] for d in body["data"]], dtype=np.float32)
        np.testing.assert_allclose(rows, reference, atol=1e-5)
    # named by reranker, the int8 encoder embeds
    assert named["model"] == "dense"
    rows = np.array([d["embedding"] for d in named["data"]], dtype=np.float32)
    assert np.array_equal(rows, int8.embed(TEXTS))


def test_without_onnxruntime_the_default_falls_back_as_auto_does_and_says_so(
    tiny_bert_dir, on_cpu, monkeypatch, caplog
):
    """No `onnx` extra: the bi-encoders and the student run on torch float32, also on a CPU with
    native bf16 (pinned here: bf16 moved scores with their company beyond DL21's tolerance),
    each runtime in the startup log and in `/info`."""
    monkeypatch.setattr(auto, "_onnxruntime_installed", lambda: False)
    monkeypatch.setenv("CISRANK_CPU_BF16", "1")
    config = default_config_on(str(tiny_bert_dir), student=True)
    app = create_app(config, api_keys=[], preflight=False, hold_until_loaded=lambda: True)
    with caplog.at_level(logging.INFO), TestClient(app) as client:
        info = client.get("/info").json()
        plain = client.post("/v1/embeddings", json={"input": TEXTS}).json()
    assert [
        (r["served_model_name"], r["model_runtime"], r["model_dtype"]) for r in info["rerankers"]
    ] == [
        ("dense", "torch", "float32"),
        ("student", "torch", "float32"),
        ("dense-float32", "torch", "float32"),
    ]
    assert info["embeddings"]["served_model_name"] == "dense-float32"
    logged = caplog.text
    assert "the onnx extra is not installed: the bi-encoder runs on torch float32" in logged
    assert f"loaded reranker dense (dense, {tiny_bert_dir.name} on torch float32)" in logged
    assert "loaded reranker student (student, cisrank-student on torch float32)" in logged
    rows = np.array([d["embedding"] for d in plain["data"]], dtype=np.float32)
    np.testing.assert_allclose(rows, float32_embeddings(tiny_bert_dir, TEXTS), atol=1e-5)
