"""A pair's bf16 score on a CPU is a function of the pair: the same bits alone, in any company, at
any thread count (the engine's fixed shapes), and float32 keeps its batching.

On a CPU with native bf16 the batched kernels moved a real pair's reverse-CIS score by up to
0.33-0.65 nats with the rows beside it (`bench/bf16_invariance.py`); these checks hold the
invariance on whatever host runs them, native bf16 or emulated.
"""

from __future__ import annotations

import random

import pytest
import torch
from transformers import AutoTokenizer

from cisrank.lm.engine import CausalLMEngine
from cisrank.testing import SAMPLE_SENTENCES


@pytest.fixture(scope="module", params=["gpt2", "llama"])
def loaded(request, tiny_gpt2_dir, tiny_llama_dir):
    path = tiny_gpt2_dir if request.param == "gpt2" else tiny_llama_dir
    return str(path), AutoTokenizer.from_pretrained(path)


def _engine(loaded, dtype: str, **options) -> CausalLMEngine:
    # each engine loads its own copy: a model converted in place would change another's dtype
    return CausalLMEngine(loaded[0], device="cpu", dtype=dtype, **options)


def _ids(tok, text: str) -> list[int]:
    return tok(text, add_special_tokens=False)["input_ids"]


@pytest.fixture(scope="module")
def spans(loaded):
    _, tok = loaded
    bos = tok.bos_token_id
    queries = ["when was the author of hamlet born ?", "what is the capital of france ?"]
    # every passage under both queries: contexts that several targets share, in rows of
    # different lengths
    return [([bos, *_ids(tok, p)], _ids(tok, q)) for p in SAMPLE_SENTENCES for q in queries]


def test_fixed_shapes_are_the_default_in_reduced_precision_on_a_cpu_only(loaded):
    assert _engine(loaded, "bfloat16").fixed_shapes
    assert _engine(loaded, "float16").fixed_shapes
    assert not _engine(loaded, "float32").fixed_shapes
    assert not _engine(loaded, "bfloat16", fixed_shapes=False).fixed_shapes


def test_reverse_scores_are_the_same_bits_alone_and_in_any_company(loaded, spans):
    engine = _engine(loaded, "bfloat16")
    alone = [engine.score_spans([s]).logprobs[0] for s in spans]
    together = engine.score_spans(spans).logprobs
    order = list(range(len(spans))) * 2
    random.Random(0).shuffle(order)
    shuffled = engine.score_spans([spans[i] for i in order]).logprobs
    assert together == alone
    assert shuffled == [alone[i] for i in order]


def test_continuations_are_the_same_bits_alone_and_in_any_company(loaded):
    _, tok = loaded
    engine = _engine(loaded, "bfloat16")
    prefix = [tok.bos_token_id, *_ids(tok, "when was the author of hamlet born ?")]
    conts = [_ids(tok, s) for s in SAMPLE_SENTENCES]
    alone = [engine.score_continuations(prefix, [c]).logprobs[0] for c in conts]
    assert engine.score_continuations(prefix, conts).logprobs == alone
    assert engine.score_continuations(prefix, conts[::-1]).logprobs == alone[::-1]


def test_thread_count_does_not_move_a_bf16_score(loaded, spans):
    engine = _engine(loaded, "bfloat16")
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = engine.score_spans(spans).logprobs
        torch.set_num_threads(2)
        two = engine.score_spans(spans).logprobs
    finally:
        torch.set_num_threads(threads)
    assert one == two


def test_fixed_bf16_scores_stay_close_to_float32(loaded, spans):
    # The fixed path computes the same function: it differs from float32 by bf16 rounding only.
    fixed = _engine(loaded, "bfloat16").score_spans(spans).logprobs
    exact = _engine(loaded, "float32").score_spans(spans).logprobs
    assert max(abs(a - b) for a, b in zip(fixed, exact, strict=True)) < 0.1 * max(
        abs(b) for b in exact
    )


def test_fixed_and_batched_keep_their_priors_apart(loaded):
    fixed = _engine(loaded, "bfloat16")
    batched = _engine(loaded, "bfloat16", fixed_shapes=False)
    assert fixed.fingerprint() != batched.fingerprint()
    assert (
        _engine(loaded, "float32").fingerprint()
        == _engine(loaded, "float32", fixed_shapes=True).fingerprint()
    )


def test_one_thread_pins_the_calling_thread_only_and_restores_it():
    import threading

    from cisrank.runtimes.lm_torch import one_thread

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    inside, release = threading.Event(), threading.Event()
    seen: dict[str, int] = {}

    def caller() -> None:
        torch.set_num_threads(2)
        with one_thread():
            seen["inside"] = torch.get_num_threads()
            inside.set()
            release.wait(10)
        seen["after"] = torch.get_num_threads()

    worker = threading.Thread(target=caller, daemon=True)
    try:
        worker.start()
        assert inside.wait(10)
        seen["main meanwhile"] = torch.get_num_threads()
        release.set()
        worker.join(10)
        assert seen == {"inside": 1, "main meanwhile": 2, "after": 2}
    finally:
        release.set()
        torch.set_num_threads(before)
