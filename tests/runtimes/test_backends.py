"""Every LM backend scores what the torch engine scores (float32 within 1e-3 on summed
log-probabilities, the contract), keeps scores batch-independent, and is keyed apart."""

from __future__ import annotations

import numpy as np
import pytest

from cisrank.errors import CisrankError
from cisrank.lm.backends import load_engine
from cisrank.lm.engine import CausalLMEngine
from cisrank.rerank.cis import CISReranker
from cisrank.runtimes import auto as backends_module
from cisrank.runtimes.auto import resolve_lm_backend as resolve_backend
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


def _no_onnxruntime(monkeypatch):
    real = backends_module.importlib.util.find_spec
    monkeypatch.setattr(
        backends_module.importlib.util,
        "find_spec",
        lambda name, *a: None if name == "onnxruntime" else real(name, *a),
    )


def test_auto_means_onnx_int8_on_a_cpu_and_torch_where_exactness_or_a_gpu_is_asked(monkeypatch):
    monkeypatch.delenv("CISRANK_LM_BACKEND")
    pytest.importorskip("onnxruntime")
    # the measured choice (bench/RESULTS.md: 1.73x, nDCG@10 -0.0048 on DL21)
    assert resolve_backend("auto", "cpu", None) == ("onnx", "int8")
    assert resolve_backend("auto", "cpu", "auto") == ("onnx", "int8")
    assert resolve_backend("auto", "cpu", "int8") == ("onnx", "int8")
    # an explicit float type asks for the exact runtime; a GPU gets torch (bf16 by its rules)
    assert resolve_backend("auto", "cpu", "float32") == ("torch", "float32")
    assert resolve_backend("auto", "cpu", "bf16") == ("torch", "bf16")
    assert resolve_backend("auto", "cuda:0", None) == ("torch", None)
    # named backends pass through
    assert resolve_backend("ctranslate2", "cpu", "int8") == ("ctranslate2", "int8")
    assert resolve_backend("torch", "cpu", None) == ("torch", None)
    # without the onnx extra, auto is torch float32 rather than an error
    _no_onnxruntime(monkeypatch)
    assert resolve_backend("auto", "cpu", None) == ("torch", None)


def test_the_environment_variable_decides_what_auto_means(monkeypatch):
    monkeypatch.setenv("CISRANK_LM_BACKEND", "torch")
    assert resolve_backend("auto", "cpu", None) == ("torch", None)
    monkeypatch.setenv("CISRANK_LM_BACKEND", " ONNX ")
    assert resolve_backend("auto", "cpu", "float32") == ("onnx", "float32")
    # it never overrides a backend named on the command line
    assert resolve_backend("torch", "cpu", None) == ("torch", None)
    for bad in ("auto", "tensorrt"):
        monkeypatch.setenv("CISRANK_LM_BACKEND", bad)
        with pytest.raises(CisrankError, match=f"CISRANK_LM_BACKEND='{bad}' is not an LM backend"):
            resolve_backend("auto", "cpu", None)


def test_a_cis_reranker_on_auto_records_the_runtime_that_scores(
    tiny_llama_dir, torch_engine, tmp_path, monkeypatch
):
    pytest.importorskip("onnxruntime")
    monkeypatch.delenv("CISRANK_LM_BACKEND")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert CISReranker(str(tiny_llama_dir), estimator="reverse").config.backend == "torch"
    reranker = CISReranker(str(tiny_llama_dir), estimator="reverse", device="cpu", backend="auto")
    assert (reranker.config.backend, reranker.config.dtype) == ("onnx", "int8")
    assert (reranker.engine.backend.name, reranker.engine.compute_type) == ("onnx", "int8")
    assert reranker.engine.fingerprint() != torch_engine.fingerprint()
    # an engine handed in names the backend, whatever the config asked
    shared = CISReranker(str(tiny_llama_dir), engine=torch_engine, estimator="reverse")
    assert shared.config.backend == "torch"
    monkeypatch.setenv("CISRANK_LM_BACKEND", "torch")
    exact = CISReranker(str(tiny_llama_dir), estimator="reverse", device="cpu", backend="auto")
    assert exact.config.backend == "torch" and exact.engine.backend.name == "torch"
    assert np.allclose(
        exact.score(QUERY, SAMPLE_SENTENCES[:5]),
        shared.score(QUERY, SAMPLE_SENTENCES[:5]),
        atol=1e-6,
        rtol=0,
    )


def test_torch_on_a_cpu_with_native_bf16_defaults_to_bf16_and_float32_stays_on_request(
    monkeypatch,
):
    """bf16 where no type is asked for, on a CPU that computes it natively (or a GPU); an
    explicit type, another CPU and the other runtimes are left as asked."""
    monkeypatch.setenv("CISRANK_CPU_BF16", "1")
    monkeypatch.delenv("CISRANK_LM_BACKEND")
    assert resolve_backend("torch", "cpu", None) == ("torch", "bfloat16")
    assert resolve_backend("torch", "cpu", "auto") == ("torch", "bfloat16")
    assert resolve_backend("torch", "cpu", "float32") == ("torch", "float32")
    assert resolve_backend("onnx", "cpu", None) == ("onnx", None)
    # auto prefers it to ONNX int8 there: -0.0001 nDCG@10 on DL21 against int8's -0.0048
    assert resolve_backend("auto", "cpu", None) == ("torch", "bfloat16")
    assert resolve_backend("auto", "cpu", "int8") == ("onnx", "int8")
    monkeypatch.setenv("CISRANK_CPU_BF16", "0")
    assert resolve_backend("torch", "cpu", None) == ("torch", None)
    monkeypatch.setenv("CISRANK_CPU_BF16", "maybe")
    with pytest.raises(CisrankError, match="CISRANK_CPU_BF16='maybe'"):
        resolve_backend("torch", "cpu", None)


def test_a_cis_reranker_on_a_bf16_cpu_scores_in_bf16_within_its_rounding(
    tiny_llama_dir, torch_engine, monkeypatch
):
    """The default's scores against the exact float32 ones (bf16 runs emulated where the CPU
    lacks it: slower, the same arithmetic); its priors are keyed apart."""
    import torch

    monkeypatch.setenv("CISRANK_CPU_BF16", "1")
    fast = CISReranker(str(tiny_llama_dir), estimator="reverse", device="cpu")
    assert fast.config.dtype == "bfloat16"
    assert next(fast.engine.backend.model.parameters()).dtype == torch.bfloat16
    assert fast.engine.fingerprint() != torch_engine.fingerprint()
    exact = CISReranker(str(tiny_llama_dir), engine=torch_engine, estimator="reverse")
    got, want = fast.score(QUERY, SAMPLE_SENTENCES), exact.score(QUERY, SAMPLE_SENTENCES)
    per_token = np.abs(np.array(got) - np.array(want)) / len(torch_engine.encode(QUERY))
    # bf16 keeps 8 significant bits: a few hundredths of a nat a token at worst
    assert 0 < per_token.max() <= 0.1 and per_token.mean() <= 0.02, per_token
    asked = CISReranker(str(tiny_llama_dir), estimator="reverse", device="cpu", dtype="float32")
    assert np.allclose(asked.score(QUERY, SAMPLE_SENTENCES), want, atol=1e-6, rtol=0)
