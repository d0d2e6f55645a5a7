"""ONNX int8 on lanes (`int8_lanes`): a one-thread session runs a text (a pair) a batch on as
many threads as asked, and every embedding and score is the bits of the one-thread run, whatever
the thread count, the order and the company of the texts."""

from __future__ import annotations

import numpy as np
import pytest

from cisrank.runtimes import embedder_onnx, encoder_onnx
from cisrank.runtimes.onnx_export import int8_lanes
from cisrank.testing import SAMPLE_SENTENCES

pytest.importorskip("onnxruntime")

QUERY = "When was the author of Hamlet born?"
TEXTS = [*SAMPLE_SENTENCES, QUERY]


@pytest.fixture(autouse=True)
def _own_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.getbasetemp() / "lanes-cache"))


def test_only_int8_over_one_thread_runs_on_lanes():
    assert int8_lanes("float32", 4) == (4, None)
    assert int8_lanes("int8", 1) == (1, None)
    threads, lanes = int8_lanes("int8", 3)
    assert threads == 1 and lanes is not None and lanes._max_workers == 3
    lanes.shutdown()


def test_int8_embeddings_on_lanes_are_the_one_thread_sessions(tiny_bert_dir):
    one = embedder_onnx.load(str(tiny_bert_dir), "int8", threads=1)
    four = embedder_onnx.load(str(tiny_bert_dir), "int8", threads=4)
    assert one.lanes is None and four.lanes is not None
    alone = np.stack([one.embed([t], 1)[0] for t in TEXTS])
    assert np.array_equal(four.embed(TEXTS, 1), alone)
    assert np.array_equal(four.embed(TEXTS[::-1], 1)[::-1], alone)
    # float32 batches on intra-op threads: no lanes
    assert embedder_onnx.load(str(tiny_bert_dir), "float32", threads=4).lanes is None


def test_int8_cross_encoder_scores_on_lanes_are_the_one_thread_sessions(ce_dir):
    from cisrank.rerank.cross_encoder import CrossEncoderReranker

    one = CrossEncoderReranker(model=str(ce_dir), backend="onnx", dtype="int8")
    one.runner = encoder_onnx.load(str(ce_dir), "int8", threads=1)
    assert one.runner.lanes is None and one.batch_size == 1
    alone = [one.score(QUERY, [t])[0] for t in SAMPLE_SENTENCES]
    four = CrossEncoderReranker(model=str(ce_dir), backend="onnx", dtype="int8")
    four.runner = encoder_onnx.load(str(ce_dir), "int8", threads=4)
    assert four.runner.lanes is not None
    assert four.score(QUERY, SAMPLE_SENTENCES) == alone
    assert four.score(QUERY, SAMPLE_SENTENCES[::-1])[::-1] == alone
