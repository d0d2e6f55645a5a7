"""Every LM backend scores what the torch engine scores (float32 within 1e-3 on summed
log-probabilities, the contract), keeps scores batch-independent, and is keyed apart."""

from __future__ import annotations

import numpy as np
import pytest

from cisrank.errors import CisrankError
from cisrank.lm.backends import load_engine
from cisrank.lm.engine import CausalLMEngine
from cisrank.rerank.cis import CISReranker
from cisrank.testing import SAMPLE_SENTENCES

QUERY = "When was the author of Hamlet born?"


@pytest.fixture(scope="module")
def torch_engine(tiny_llama_dir):
    return CausalLMEngine(str(tiny_llama_dir), device="cpu")


@pytest.mark.parametrize("backend", ["ctranslate2", "onnx"])
def test_a_backend_at_float32_scores_as_torch_in_any_batch(
    backend, tiny_llama_dir, torch_engine, tmp_path, monkeypatch
):
    pytest.importorskip({"ctranslate2": "ctranslate2", "onnx": "onnxruntime"}[backend])
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    engine = load_engine(str(tiny_llama_dir), backend=backend, dtype="float32", batch_size=2)
    assert engine.backend.name == backend and engine.compute_type == "float32"
    enc, bos = torch_engine.encode, torch_engine.bos_id
    spans = [([bos, *enc(p)], enc(QUERY)) for p in SAMPLE_SENTENCES[:6]]
    spans += [([bos], enc("Hamlet")), ([bos, *enc("Paris")], [])]
    want = torch_engine.score_spans(spans).logprobs
    got = engine.score_spans(spans).logprobs
    assert np.allclose(got, want, atol=1e-3, rtol=0), (got, want)
    alone = [engine.score_spans([s]).logprobs[0] for s in spans]
    assert np.allclose(alone, got, atol=1e-5, rtol=0)
    prefix = [bos, *enc("Question: " + QUERY + " Answer:")]
    conts = [enc(p) for p in SAMPLE_SENTENCES[:4]]
    assert np.allclose(
        engine.score_continuations(prefix, conts).logprobs,
        torch_engine.score_continuations(prefix, conts).logprobs,
        atol=1e-3,
        rtol=0,
    )
    # the prior store keys another runtime's priors apart from torch's
    assert engine.fingerprint() != torch_engine.fingerprint()
    reverse = CISReranker(str(tiny_llama_dir), engine=engine, estimator="reverse")
    reference = CISReranker(str(tiny_llama_dir), engine=torch_engine, estimator="reverse")
    assert np.allclose(
        reverse.score(QUERY, SAMPLE_SENTENCES[:5]),
        reference.score(QUERY, SAMPLE_SENTENCES[:5]),
        atol=1e-3,
        rtol=0,
    )
    with pytest.raises(CisrankError, match="scores only"):
        engine.prefill_lockstep([[bos, 5, 6]])


def test_unknown_backends_and_compute_types_are_one_line_errors(tiny_llama_dir):
    with pytest.raises(CisrankError, match="unknown LM backend 'tensorrt'"):
        load_engine(str(tiny_llama_dir), backend="tensorrt")
    with pytest.raises(CisrankError, match="not a compute type of the onnx backend"):
        load_engine(str(tiny_llama_dir), backend="onnx", dtype="int4")
