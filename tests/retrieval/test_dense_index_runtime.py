"""A dense index and its queries run one encoder path (`cisrank.runtimes.embedder.open_embedder`,
the dense reranker's): the build records the runtime and precision in the manifest, the retriever
embeds its queries on them, and a caller expecting another runtime is refused in one line. Checked
against the dense reranker's own embeddings of the same texts (the reference every runtime is
tested against in tests/rerank/test_dense_runtimes.py) and, for int8, bit for bit."""

from __future__ import annotations

import importlib.util
import json

import numpy as np
import pytest

from cisrank.data.manifest import read_manifest
from cisrank.errors import DataError
from cisrank.indexes.build import build_index
from cisrank.indexes.kinds import open_index
from cisrank.rerank.dense import DenseReranker

needs_onnxruntime = pytest.mark.skipif(
    importlib.util.find_spec("onnxruntime") is None,
    reason="the onnx backend needs the 'onnx' extra: pip install 'cisrank[onnx]'",
)

ROWS = [
    ("p1", "the quick brown fox jumps over the lazy dog"),
    ("p2", "a fox is a small wild animal"),
    ("p3", "dogs are loyal animals and good friends"),
    ("p4", "who wrote hamlet and when was he born"),
]


@pytest.fixture
def corpus(write_corpus):
    return write_corpus(ROWS)


@pytest.fixture(scope="module")
def onnx_cache(tmp_path_factory):
    cache = tmp_path_factory.mktemp("index-onnx-cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("XDG_CACHE_HOME", str(cache))
        yield cache


def test_torch_build_records_its_runtime_and_embeds_as_the_reranker(
    tmp_path, corpus, tiny_bert_dir
):
    out = tmp_path / "torch"
    m = build_index("dense", corpus, out, {"model": str(tiny_bert_dir)}, progress=False)
    assert (m.model["runtime"], m.model["dtype"]) == ("torch", "float32")
    assert read_manifest(out).model["runtime"] == "torch"
    stored = np.load(out / "embeddings.npy")
    texts = [t for _, t in ROWS]
    reranker = DenseReranker(model=str(tiny_bert_dir))
    assert np.abs(stored - reranker.embed(texts)).max() < 1e-6  # float32 rounding by batch
    r = open_index(out)
    assert (r.runtime, r.dtype) == ("torch", "float32")
    assert np.abs(r.embed_queries(texts) - stored).max() < 1e-6
    assert r.search(ROWS[1][1], 1)[0].docid == "p2"


@needs_onnxruntime
def test_onnx_int8_index_and_its_queries_are_the_same_bits(
    tmp_path, corpus, tiny_bert_dir, onnx_cache
):
    out = tmp_path / "int8"
    params = {"model": str(tiny_bert_dir), "backend": "onnx", "dtype": "int8", "shard_size": 3}
    m = build_index("dense", corpus, out, params, progress=False)
    assert (m.model["runtime"], m.model["dtype"]) == ("onnx", "int8")
    stored = np.load(out / "embeddings.npy")
    texts = [t for _, t in ROWS]
    # one passage a batch whatever batch_size says (64): a passage's int8 embedding is its own,
    # so the index holds exactly what the reranker and the retriever's queries compute
    reranker = DenseReranker(model=str(tiny_bert_dir), backend="onnx", dtype="int8")
    assert np.array_equal(stored, reranker.embed(texts))
    r = open_index(out)
    assert (r.runtime, r.dtype, r.batch_size) == ("onnx", "int8", 1)
    assert np.array_equal(r.embed_queries(texts), stored)
    # and it is int8, not float32 under another name
    f32 = DenseReranker(model=str(tiny_bert_dir), backend="onnx").embed(texts)
    assert np.abs(f32 - stored).max() > 1e-6


@needs_onnxruntime
def test_auto_build_records_what_auto_chose(tmp_path, corpus, tiny_bert_dir, onnx_cache):
    from cisrank.runtimes.auto import resolve_embedder_backend

    m = build_index(
        "dense",
        corpus,
        tmp_path / "a",
        {"model": str(tiny_bert_dir), "backend": "auto"},
        progress=False,
    )
    chosen = resolve_embedder_backend("auto", None, None)
    assert m.model["runtime"] == chosen[0]
    assert m.params["backend"] == "auto"  # asked; the model section says what ran
    r = open_index(tmp_path / "a")
    assert r.runtime == m.model["runtime"] and r.dtype == m.model["dtype"]


def test_a_caller_expecting_another_runtime_is_refused_in_one_line(tmp_path, corpus, tiny_bert_dir):
    out = tmp_path / "torch"
    build_index("dense", corpus, out, {"model": str(tiny_bert_dir)}, progress=False)
    with pytest.raises(DataError) as err:
        open_index(out, backend="onnx")
    msg = str(err.value)
    assert "\n" not in msg
    assert "embedded with backend torch, not onnx" in msg and "--backend onnx" in msg
    with pytest.raises(DataError, match="dtype float32, not int8"):
        open_index(out, dtype="int8")
    assert open_index(out, backend="torch", dtype="float32").runtime == "torch"
    assert open_index(out, backend="auto").runtime == "torch"  # auto: the index's own


def test_an_index_from_before_runtimes_were_recorded_is_torch(tmp_path, corpus, tiny_bert_dir):
    """Manifests written before `model.runtime` existed: the torch path, the precision asked
    for then."""
    out = tmp_path / "old"
    build_index("dense", corpus, out, {"model": str(tiny_bert_dir)}, progress=False)
    path = out / "manifest.json"
    manifest = json.loads(path.read_text())
    del manifest["model"]["runtime"]
    manifest["params"].pop("backend")
    manifest.pop("digest", None)  # written by hand here, as older manifests were
    path.write_text(json.dumps(manifest))
    r = open_index(out)
    assert (r.runtime, r.dtype) == ("torch", None)
    assert r.encoder.compute_type == "float32"
