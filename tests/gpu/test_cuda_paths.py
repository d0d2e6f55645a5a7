"""The GPU paths against the CPU: the engine, CIS and the cross-encoder on CUDA.

CI has no GPU, so every test here skips there; `bench/gpu_check.sh` runs them on a lent GPU
machine. What they hold to: float32 on CUDA is exact (the brute-force float64 reference to 1e-3,
as on CPU; PyTorch leaves TF32 off for matmuls unless asked), large GPU batches change no score,
and the bf16 default stays within bf16's rounding of the float32 scores.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from references import brute_tokens
from transformers import AutoModelForCausalLM, AutoTokenizer

from cisrank.lm.engine import CausalLMEngine
from cisrank.rerank.cis import CISReranker
from cisrank.rerank.cross_encoder import CrossEncoderReranker
from cisrank.testing import SAMPLE_SENTENCES

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="no CUDA device: the GPU paths run on a lent GPU machine (bench/gpu_check.sh)",
)

TOL = 1e-3
QUERY = "when was the author of hamlet born ?"


def brute_sums(path, prefix: list[int], conts: list[list[int]]) -> np.ndarray:
    """Summed log p(cont | prefix), the float64 reference on the CPU."""
    ref = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float64).eval()
    return np.array([sum(brute_tokens(ref, prefix, cont)) for cont in conts])


@pytest.fixture(scope="module", params=["gpt2", "llama"])
def lm(request, tiny_gpt2_dir, tiny_llama_dir):
    path = tiny_gpt2_dir if request.param == "gpt2" else tiny_llama_dir
    tok = AutoTokenizer.from_pretrained(path)
    prefix = [tok.bos_token_id, *tok(QUERY)["input_ids"]]
    rng = random.Random(0)
    # 120 continuations of 1 to 40 sentences' words: batches of many lengths, padding on GPU
    words = " ".join(SAMPLE_SENTENCES).split()
    texts = [" ".join(rng.choices(words, k=rng.randint(1, 40))) for _ in range(120)]
    conts = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    return path, prefix, conts, brute_sums(path, prefix, conts)


def test_engine_float32_on_cuda_matches_brute_force_at_any_batching(lm):
    path, prefix, conts, want = lm
    for kwargs in (
        {},  # the GPU defaults: 32768 padded tokens a batch, padding bound 0.25
        {"batch_size": 1},
        {"batch_size": 7, "padding_side": "left", "max_padding": 0.99},
        {"use_prefix_cache": False, "batch_tokens": 512},
    ):
        engine = CausalLMEngine(str(path), device="cuda", dtype=torch.float32, **kwargs)
        got = np.array(engine.score_continuations(prefix, conts).logprobs)
        assert np.abs(got - want).max() <= TOL, kwargs


def test_engine_score_spans_on_cuda_matches_brute_force(lm):
    path, prefix, conts, want = lm
    engine = CausalLMEngine(str(path), device="cuda", dtype=torch.float32)
    got = engine.score_spans([(prefix, c) for c in conts])
    assert np.abs(np.array(got.logprobs) - want).max() <= TOL


def test_engine_default_on_cuda_is_half_precision_within_its_rounding(lm):
    path, prefix, conts, want = lm
    engine = CausalLMEngine(str(path), device="cuda")
    half = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    assert next(engine.backend.model.parameters()).dtype == half
    got = engine.score_continuations(prefix, conts)
    per_token = np.abs(np.array(got.logprobs) - want) / np.array(got.num_tokens)
    # bf16 keeps 8 significant bits (relative 2^-8): on logits of a few nats that is a few
    # hundredths a token at worst; a head or log-softmax run in bf16 would be far off.
    assert per_token.mean() <= 0.02 and per_token.max() <= 0.1, per_token.max()


def test_cis_reranker_on_cuda_float32_equals_cpu(tiny_llama_dir):
    passages = SAMPLE_SENTENCES
    for estimator in ("reverse", "forward"):
        cpu = CISReranker(model=str(tiny_llama_dir), device="cpu", estimator=estimator)
        gpu = CISReranker(
            model=str(tiny_llama_dir), device="cuda", dtype="float32", estimator=estimator
        )
        a, b = np.array(cpu.score(QUERY, passages)), np.array(gpu.score(QUERY, passages))
        assert np.abs(a - b).max() <= TOL, estimator
        assert gpu.config.dtype == "float32" and gpu.config.backend == "torch"


def test_cross_encoder_on_cuda_float32_equals_cpu_and_bf16_stays_close(ce_dir):
    pairs = [(s, t) for s in SAMPLE_SENTENCES[:4] for t in SAMPLE_SENTENCES]
    # float32 by name: on a CPU with native bf16 (the lent H200's host has it) the default is bf16
    cpu_ref = CrossEncoderReranker(model=str(ce_dir), device="cpu", dtype="float32")
    assert cpu_ref.dtype == torch.float32
    cpu = np.array(cpu_ref.score_pairs(pairs))
    exact = CrossEncoderReranker(model=str(ce_dir), device="cuda", dtype="float32")
    assert np.abs(np.array(exact.score_pairs(pairs)) - cpu).max() <= 1e-4
    fast = CrossEncoderReranker(model=str(ce_dir), device="cuda")
    assert fast.dtype in (torch.bfloat16, torch.float16)
    got = np.array(fast.score_pairs(pairs))
    assert np.corrcoef(got, cpu)[0, 1] >= 0.999
    assert np.abs(got - cpu).max() <= 0.05 * np.abs(cpu).max()
