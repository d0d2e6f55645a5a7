"""The causal-LM engine against a brute-force reference (one full float64 forward per sequence)."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from references import brute_tokens
from transformers import AutoModelForCausalLM, AutoTokenizer

from cisrank.errors import CisrankError
from cisrank.lm.engine import CausalLMEngine
from cisrank.testing import SAMPLE_SENTENCES

TOL = 1e-3


@pytest.fixture(scope="module", params=["gpt2", "llama"])
def setup(request, tiny_gpt2_dir, tiny_llama_dir):
    path = tiny_gpt2_dir if request.param == "gpt2" else tiny_llama_dir
    ref = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float64).eval()
    tok = AutoTokenizer.from_pretrained(path)
    prefix = [tok.bos_token_id, *tok("when was the author of hamlet born ?")["input_ids"]]
    conts = [tok(s, add_special_tokens=False)["input_ids"] for s in SAMPLE_SENTENCES]
    expected = [brute_tokens(ref, prefix, c) for c in conts]
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    return model, tok, prefix, conts, expected


def test_matches_brute_force_any_batching(setup):
    path, tok, prefix, conts, expected = setup
    sums = [sum(e) for e in expected]
    for side in ("right", "left"):
        for cache in (True, False):
            for bs in range(1, len(conts) + 1, 3):
                # max_padding 0.99: rows of any lengths share a batch, so padding is exercised
                engine = CausalLMEngine(
                    path,
                    tok,
                    batch_size=bs,
                    padding_side=side,
                    use_prefix_cache=cache,
                    head_chunk_rows=5,
                    max_padding=0.99,
                )
                got = engine.score_continuations(prefix, conts, return_tokens=True)
                assert np.abs(np.array(got.logprobs) - sums).max() <= TOL, (side, cache, bs)
                assert got.num_tokens == [len(c) for c in conts]
                for toks, exp in zip(got.token_logprobs, expected, strict=True):
                    assert np.allclose(toks, exp, atol=1e-4)


def test_shuffled_order_duplicates_and_token_budget(setup):
    path, tok, prefix, conts, expected = setup
    sums = [sum(e) for e in expected]
    order = list(range(len(conts))) * 2
    random.Random(0).shuffle(order)
    engine = CausalLMEngine(path, tok, batch_tokens=16)
    seen: list[int] = []
    handle = engine.backend.base.register_forward_hook(
        lambda m, a, kw, out: seen.append(kw["input_ids"].shape[0]), with_kwargs=True
    )
    got = engine.score_continuations(prefix, [conts[i] for i in order]).logprobs
    handle.remove()
    assert np.abs(np.array(got) - [sums[i] for i in order]).max() <= TOL
    # one prefix forward plus batches covering each distinct continuation exactly once
    assert sum(seen) - 1 == len({tuple(c) for c in conts})
    # identical continuations get bit-identical scores
    for i, a in enumerate(order):
        for j, b in enumerate(order):
            if a == b:
                assert got[i] == got[j]


@pytest.mark.parametrize("max_padding", [0.0, 0.3])
def test_rows_carry_at_most_max_padding(setup, max_padding):
    path, tok, prefix, conts, expected = setup
    engine = CausalLMEngine(path, tok, max_padding=max_padding)
    rows: list[tuple[int, list[int]]] = []

    def hook(module, args, kw, out):
        if kw["input_ids"].shape[1] != len(prefix):  # not the prefix forward
            width = kw["input_ids"].shape[1]
            rows.append((width, kw["attention_mask"][:, -width:].sum(1).tolist()))

    handle = engine.backend.base.register_forward_hook(hook, with_kwargs=True)
    got = engine.score_continuations(prefix, conts).logprobs
    handle.remove()
    assert np.abs(np.array(got) - [sum(e) for e in expected]).max() <= TOL
    assert sum(len(r) for _, r in rows) == len({tuple(c) for c in conts})
    for width, real in rows:
        assert all(width - n <= max_padding * width for n in real), (width, real)
    if max_padding == 0.0:
        assert all(len(set(real)) == 1 for _, real in rows)
    with pytest.raises(CisrankError, match="max_padding"):
        CausalLMEngine(path, tok, max_padding=1.0)


def test_lm_head_sees_only_continuation_positions_in_chunks(setup):
    path, tok, prefix, conts, expected = setup
    engine = CausalLMEngine(path, tok, head_chunk_rows=7)
    rows: list[tuple[int, ...]] = []
    handle = engine.backend.lm_head.register_forward_hook(
        lambda m, inp, out: rows.append(tuple(inp[0].shape))
    )
    got = engine.score_continuations(prefix, conts).logprobs
    handle.remove()
    total = sum(len(c) for c in conts)
    assert sum(r[0] for r in rows) == total  # one head row per continuation token, no more
    assert all(len(r) == 2 and r[0] <= 7 for r in rows)  # 2D [rows, hidden], chunk-bounded
    assert np.abs(np.array(got) - [sum(e) for e in expected]).max() <= TOL


def test_empty_continuation_and_errors(setup):
    path, tok, prefix, conts, _ = setup
    engine = CausalLMEngine(path, tok)
    got = engine.score_continuations(prefix, [[], conts[0]])
    assert got.logprobs[0] == 0.0 and got.num_tokens == [0, len(conts[0])]
    with pytest.raises(CisrankError, match="at least one token"):
        engine.score_continuations([], conts)
    with pytest.raises(CisrankError, match="exceed the context"):
        engine.score_continuations(prefix, [conts[0] * 400])
    with pytest.raises(CisrankError, match="padding_side"):
        CausalLMEngine(path, tok, padding_side="middle")


def test_fingerprint_tracks_weights_not_process(tiny_gpt2_dir, tiny_llama_dir):
    a = CausalLMEngine(str(tiny_gpt2_dir), device="cpu")
    b = CausalLMEngine(str(tiny_gpt2_dir), device="cpu")
    assert a.fingerprint() == b.fingerprint()
    assert CausalLMEngine(str(tiny_llama_dir), device="cpu").fingerprint() != a.fingerprint()
    with torch.no_grad():
        b.torch_backend().model.transformer.h[0].mlp.c_fc.weight.mul_(1.01)
    b._fingerprint = None
    assert b.fingerprint() != a.fingerprint()


def test_unknown_model_is_a_clean_error(tmp_path):
    with pytest.raises(CisrankError, match="does not exist"):
        CausalLMEngine(str(tmp_path / "nope" / "model"))
    with pytest.raises(CisrankError, match="HF_HUB_OFFLINE"):
        CausalLMEngine("no-such-org/no-such-model")
