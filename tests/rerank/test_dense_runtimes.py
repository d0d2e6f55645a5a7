"""The dense reranker on every runtime of the table: torch float32 and bf16, ONNX Runtime float32
and dynamic int8, each checked against a brute-force torch float32 computation made here (mean
of the non-pad tokens' last hidden states, L2-normalized, dot product), and the pairs no runtime
computes refused in one line."""

from __future__ import annotations

import importlib.util
import json

import numpy as np
import pytest
import torch
from transformers import AutoModel, AutoTokenizer

from cisrank.errors import CisrankError
from cisrank.rerank import load_reranker
from cisrank.rerank.configs import DenseRerankerConfig
from cisrank.rerank.dense import DenseReranker
from cisrank.runtimes import embedder_onnx
from cisrank.testing import SAMPLE_SENTENCES

needs_onnxruntime = pytest.mark.skipif(
    importlib.util.find_spec("onnxruntime") is None,
    reason="the onnx backend needs the 'onnx' extra: pip install 'cisrank[onnx]'",
)

QUERY = "When was the author of Hamlet born?"
PASSAGES = [*SAMPLE_SENTENCES[:6], SAMPLE_SENTENCES[0]]

BF16_BOUND = 1e-3
"""bf16 (autocast) against float32, per cosine, on the tiny random BERT (measured 9e-6: its
cosines sit near 0.92 and move little); on all-MiniLM-L6-v2 over DL19 passages about 0.003
(bench/dense_runtimes.py, bench/RESULTS.md)."""
INT8_BOUND = 1e-3
"""Dynamic int8 against float32, per cosine, on the tiny BERT (measured 4e-5); on
all-MiniLM-L6-v2 over DL19 passages about 0.02 (bench/RESULTS.md)."""
RAN = 1e-6
"""A gap that shows the reduced precision really ran: float32 on either runtime is within 2e-7."""


def brute_force(path, query, passages) -> np.ndarray:
    """Cosines of mean-pooled, normalized float32 embeddings, one text at a time (no padding)."""
    tok = AutoTokenizer.from_pretrained(str(path))
    model = AutoModel.from_pretrained(str(path), dtype=torch.float32).eval()

    def embed(text: str) -> torch.Tensor:
        enc = tok(text, return_tensors="pt", truncation=True, max_length=512)
        with torch.no_grad():
            v = model(**enc).last_hidden_state[0].mean(dim=0)
        return v / v.norm()

    q = embed(query)
    return np.array([float(embed(p) @ q) for p in passages])


@pytest.fixture(scope="module")
def reference(tiny_bert_dir) -> np.ndarray:
    return brute_force(tiny_bert_dir, QUERY, PASSAGES)


@pytest.fixture(scope="module")
def onnx_cache(tmp_path_factory):
    """One export cache for the module's tests that only read exports (each export of the
    tiny model costs a few seconds)."""
    cache = tmp_path_factory.mktemp("dense-onnx-cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("XDG_CACHE_HOME", str(cache))
        yield cache / "cisrank" / "onnx"


@pytest.fixture
def own_onnx_cache(tmp_path, monkeypatch):
    """A cache of the test's own, for a test that damages its export."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache" / "cisrank" / "onnx"


def test_torch_float32_is_the_default_and_exact(tiny_bert_dir, reference):
    r = DenseReranker(model=str(tiny_bert_dir), batch_size=3)
    assert (r.backend, r.compute_type, r.runner.name) == ("torch", "float32", "torch")
    assert r.config.backend == "torch" and DenseRerankerConfig().backend == "torch"
    got = np.array(r.score(QUERY, PASSAGES))
    assert np.abs(got - reference).max() < 1e-5
    assert repr(r).endswith("backend='torch', dtype='float32')")


def test_torch_bf16_is_autocast_within_its_bound(tiny_bert_dir, reference):
    r = DenseReranker(model=str(tiny_bert_dir), dtype="bfloat16")
    assert (r.backend, r.compute_type) == ("torch", "bfloat16") and r.runner.autocast
    # autocast: the weights stay float32, only the products run in bf16
    assert {p.dtype for p in r.runner.encoder.parameters()} == {torch.float32}
    got = np.array(r.score(QUERY, PASSAGES))
    gap = np.abs(got - reference).max()
    assert RAN < gap < BF16_BOUND  # bf16 did run (not float32), and stays near it
    assert got[0] == got[-1]  # one text, one embedding


@needs_onnxruntime
def test_onnx_float32_agrees_with_brute_force_to_1e5_in_any_batch(
    tiny_bert_dir, reference, onnx_cache
):
    for batch_size in (1, 3, 16):
        r = DenseReranker(model=str(tiny_bert_dir), backend="onnx", batch_size=batch_size)
        assert (r.backend, r.compute_type, r.runner.name) == ("onnx", "float32", "onnx")
        got = np.array(r.score(QUERY, PASSAGES))
        assert np.abs(got - reference).max() < 1e-5
        assert got[0] == got[-1]
    default = DenseReranker(model=str(tiny_bert_dir), backend="onnx")
    assert default.batch_size == 16
    assert default.dimensions == 64
    assert default.pair_token_limit == default.runner.max_length
    emb = default.embed(["a", "who wrote hamlet"])
    assert emb.dtype == np.float32 and np.allclose(np.linalg.norm(emb, axis=1), 1.0, atol=1e-6)
    assert default.embed([]).shape == (0, 64)


@needs_onnxruntime
def test_onnx_int8_is_near_float32_and_a_passage_is_embedded_alone(
    tiny_bert_dir, reference, onnx_cache
):
    r = DenseReranker(model=str(tiny_bert_dir), backend="onnx", dtype="int8")
    assert r.compute_type == "int8" and r.batch_size == 1
    assert (r.runner.folder / "model-int8.onnx").is_file()
    got = np.array(r.score(QUERY, PASSAGES))
    gap = np.abs(got - reference).max()
    assert RAN < gap < INT8_BOUND
    # a passage's embedding does not move with the texts beside it: equal bits
    together = r.embed(PASSAGES)
    alone = np.stack([r.embed([p])[0] for p in PASSAGES])
    assert np.array_equal(alone, together)
    assert np.array_equal(r.embed(PASSAGES[::-1])[::-1], together)
    shuffled = r.score_batch([("another query", PASSAGES[::-1]), (QUERY, PASSAGES[::-1])])[1]
    assert shuffled[::-1] == pytest.approx(got.tolist(), abs=1e-12)  # float64 dot products


@needs_onnxruntime
def test_onnx_reproduces_the_models_own_pooling(tiny_bert_dir, tmp_path, onnx_cache):
    """A sentence-transformers folder with CLS pooling and a Dense layer: the export runs the
    model's modules, so it embeds as `SentenceTransformer.encode` does, not as mean pooling."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.modules import Dense, Normalize, Transformer
    from sentence_transformers.sentence_transformer.modules import Pooling

    torch.manual_seed(1)
    body = Transformer(str(tiny_bert_dir))
    modules = [body, Pooling(64, pooling_mode="cls"), Dense(64, 32), Normalize()]
    folder = tmp_path / "cls-st"
    SentenceTransformer(modules=modules, device="cpu").save(str(folder))
    st = SentenceTransformer(str(folder), device="cpu")
    want = st.encode(PASSAGES, normalize_embeddings=True, convert_to_numpy=True)
    r = DenseReranker(model=str(folder), backend="onnx", batch_size=4)
    got = r.embed(PASSAGES)
    assert got.shape == (len(PASSAGES), 32) and r.dimensions == 32
    assert np.abs(got - want).max() < 1e-5
    assert r.runner.info["modules"] == ["Transformer", "Pooling", "Dense", "Normalize"]
    mean = DenseReranker(model=str(tiny_bert_dir), backend="onnx").embed(PASSAGES)
    assert mean.shape[1] == 64  # another model, another export


@needs_onnxruntime
def test_the_export_is_made_once_and_again_when_damaged(tiny_bert_dir, own_onnx_cache, monkeypatch):
    calls = {"export": 0}
    export = embedder_onnx._export_onnx

    def counted(source, out):
        calls["export"] += 1
        return export(source, out)

    monkeypatch.setattr(embedder_onnx, "_export_onnx", counted)
    want = DenseReranker(model=str(tiny_bert_dir), backend="onnx").score(QUERY, PASSAGES)
    DenseReranker(model=str(tiny_bert_dir), backend="onnx", dtype="int8")
    assert calls["export"] == 1
    (folder,) = [p for p in own_onnx_cache.iterdir() if not p.name.endswith(".lock")]
    assert folder.name.startswith(tiny_bert_dir.name + "-bi-encoder-")
    record = json.loads((folder / "cisrank-onnx.json").read_text())
    assert record["kind"] == "bi-encoder" and record["checked_gap"] < 1e-5
    assert set(record["files"]) >= {"model.onnx", "model-int8.onnx"}
    (folder / "model.onnx").write_bytes(b"not a model")  # damaged: checked, made again
    again = DenseReranker(model=str(tiny_bert_dir), backend="onnx")
    assert calls["export"] == 2
    assert again.score(QUERY, PASSAGES) == pytest.approx(want, abs=1e-7)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            {"backend": "torch", "dtype": "int8"},
            "dtype int8 is the onnx backend's for a bi-encoder",
        ),
        (
            {"backend": "onnx", "dtype": "bfloat16"},
            "dtype bfloat16 is not a compute type of the onnx",
        ),
        (
            {"backend": "onnx", "device": "cuda"},
            "the onnx backend runs on the CPU here, not on cuda",
        ),
        (
            {"backend": "ctranslate2"},
            "ctranslate2 runs causal LMs only; a bi-encoder runs on torch",
        ),
    ],
)
def test_a_pair_no_runtime_computes_is_one_line(tiny_bert_dir, options, message):
    with pytest.raises(CisrankError) as err:
        load_reranker("dense", str(tiny_bert_dir), **options)
    text = str(err.value)
    assert message in text and "\n" not in text


def test_auto_picks_by_the_dtype_asked(monkeypatch):
    from cisrank.runtimes import auto

    monkeypatch.setattr(auto, "_on_gpu", lambda device: False)
    monkeypatch.setattr(auto, "_onnxruntime_installed", lambda: True)
    pick = auto.resolve_embedder_backend
    assert pick("auto", None, None) == ("onnx", "int8")  # the fastest DL21 accepts
    assert pick("auto", None, "float32") == ("onnx", "float32")
    assert pick("auto", None, "int8") == ("onnx", "int8")
    assert pick("auto", None, "bfloat16") == ("torch", "bfloat16")
    assert pick("torch", None, None) == ("torch", None)
    monkeypatch.setattr(auto, "_onnxruntime_installed", lambda: False)
    monkeypatch.setenv("CISRANK_CPU_BF16", "1")  # native bf16: still float32, bf16 moved too far
    assert pick("auto", None, None) == ("torch", None)
    assert pick("auto", None, "float32") == ("torch", "float32")
    monkeypatch.setattr(auto, "_on_gpu", lambda device: True)
    assert pick("auto", "cuda", None) == ("torch", None)


@needs_onnxruntime
def test_the_server_embeds_on_the_runtime_it_says(tiny_bert_dir, onnx_cache):
    """`/v1/embeddings` embeds through the served dense reranker's runtime, and `/info` says
    which runtime and number format that is."""
    from fastapi.testclient import TestClient

    from cisrank.api.app import create_app
    from cisrank.serving.config import RerankerSpec, ServerConfig

    r = load_reranker("dense", str(tiny_bert_dir), backend="onnx", dtype="int8")
    assert (r.runtime, r.compute_type) == ("onnx", "int8")
    spec = RerankerSpec(kind="dense", model=str(tiny_bert_dir))
    app = create_app(ServerConfig(rerankers={"d": spec}), rerankers={"d": r}, api_keys=[])
    with TestClient(app) as client:
        info = client.get("/info").json()
        got = client.post("/v1/embeddings", json={"input": PASSAGES[:2]}).json()
    assert (info["model_runtime"], info["model_dtype"]) == ("onnx", "int8")
    rows = np.array([d["embedding"] for d in got["data"]], dtype=np.float32)
    assert np.array_equal(rows, r.embed(PASSAGES[:2]))


@needs_onnxruntime
def test_a_dense_teacher_records_the_runtime_that_ran(tiny_bert_dir, onnx_cache, monkeypatch):
    """A teacher set names the runtime that scored, never `auto`."""
    from cisrank.distill.teachers import RerankerTeacher
    from cisrank.runtimes import auto

    monkeypatch.setattr(auto, "_on_gpu", lambda device: False)
    teacher = RerankerTeacher("dense", str(tiny_bert_dir), {"backend": "auto"})
    assert teacher.describe()["backend"] == "onnx"
    assert teacher.reranker.compute_type == "int8"
