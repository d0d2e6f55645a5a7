"""Entropy-based decoding ("Entropy-Based Decoding for Retrieval-Augmented Large Language
Models"): every step's merged log-probabilities against a from-scratch recomputation (a full
float64 forward of each row plus the tokens so far, no cache), and the limits tau -> inf (LeEns =
AvgEns) and beta = 0 (CLeHe = LeEns)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from context.helpers import QUESTION, passages

from cisrank.context import ContextAssembler
from cisrank.context.decoding import EnsembleDecoder, default_layers
from cisrank.errors import CisrankError

TOL = 1e-4
STEPS = 3


def reference_step(tiny, rows, generated, layers):
    """Row log-probs [R, V] and the no-passage row's early-exit log-probs per layer, float64."""
    final_norm = tiny.ref.transformer.ln_f if tiny.arch == "gpt2" else tiny.ref.model.norm
    n_layers = tiny.ref.config.num_hidden_layers
    lps, early = [], {}
    with torch.no_grad():
        for r, row in enumerate(rows):
            out = tiny.ref(torch.tensor([row + generated]), output_hidden_states=True)
            lps.append(torch.log_softmax(out.logits[0, -1], dim=-1))
            if r == 0:
                for x in layers:
                    h = out.hidden_states[x][0, -1]
                    h = final_norm(h) if x < n_layers else h
                    early[x] = torch.log_softmax(tiny.ref.lm_head(h), dim=-1)
    return torch.stack(lps), early


def reference_merge(mode, lp, early, tau, beta, fixed):
    """Entropy-Based Decoding, Eq. 1-7, written out again from the row log-probabilities."""
    if mode == "naive":
        return lp[0], None
    docs = lp[1:]
    ent = -(docs.exp() * docs).sum(-1)
    k = docs.shape[0]
    if mode == "avg_ens":
        w = torch.full((k,), 1 / k, dtype=torch.float64)
    elif mode == "replug":
        w = torch.tensor(fixed, dtype=torch.float64)
    else:
        w = torch.exp(-ent / tau) / torch.exp(-ent / tau).sum()
    ens = (w[:, None] * docs).sum(0)
    if mode == "clehe":
        h = {x: float(-(q.exp() * q).sum()) for x, q in early.items()}
        best = max(h, key=lambda x: (h[x], -x))
        ens = (1 + beta) * ens - beta * early[best]
    return torch.log_softmax(ens, -1), w


@pytest.mark.parametrize("mode", ["naive", "avg_ens", "replug", "leens", "clehe"])
def test_each_step_equals_a_from_scratch_recomputation(tiny, mode):
    asm = ContextAssembler(tiny.engine, "entropy")
    docs = passages(3)
    scores = [2.0, 0.5, -1.0]
    dec = EnsembleDecoder(asm, tau=0.5, beta=0.7, layers=[0, 1, 2])
    gen = dec.generate(
        QUESTION, docs, mode, max_new_tokens=STEPS, scores=scores, stop_at_eos=False, trace=True
    )
    assert len(gen.tokens) == STEPS == len(gen.steps)
    if mode == "naive":
        rows = [asm.render(QUESTION, docs).ids]
    else:
        single = asm.template.single()
        rows = [asm.render(QUESTION, []).ids]
        rows += [asm.render(QUESTION, [d], template=single).ids for d in docs]
        assert "Document (Title: Hamlet) William" in asm.render(QUESTION, docs[:1], single).text
    fixed = np.exp(scores) / np.exp(scores).sum()
    for t, rec in enumerate(gen.steps):
        lp, early = reference_step(tiny, rows, gen.tokens[:t], [0, 1, 2])
        want, w = reference_merge(mode, lp, early, 0.5, 0.7, fixed)
        assert np.abs(rec.merged - want.numpy()).max() <= TOL, (mode, t)
        assert rec.token == gen.tokens[t] == int(np.argmax(rec.merged))
        if w is not None:
            assert np.allclose(rec.weights, w.numpy(), atol=TOL)
            docs_ent = -(lp[1:].exp() * lp[1:]).sum(-1)
            assert rec.passage == int(torch.argmin(docs_ent))
    if mode == "clehe" and tiny.arch == "gpt2":  # here the max-entropy layer moves (2, 2, 1, ...)
        assert len({r.layer for r in gen.steps}) > 1


def test_limits_tau_to_infinity_and_beta_zero(tiny):
    asm = ContextAssembler(tiny.engine, "entropy")
    docs = passages(4)

    def run(mode, **kw):
        return EnsembleDecoder(asm, layers=[1, 2], **kw).generate(
            QUESTION, docs, mode, max_new_tokens=STEPS, stop_at_eos=False, trace=True
        )

    avg = run("avg_ens")
    hot = run("leens", tau=1e12)
    assert hot.tokens == avg.tokens
    for a, b in zip(avg.steps, hot.steps, strict=True):
        assert np.abs(a.merged - b.merged).max() <= 1e-6
    leens = run("leens", tau=0.25)
    clehe0 = run("clehe", tau=0.25, beta=0.0)
    assert clehe0.tokens == leens.tokens
    for a, b in zip(leens.steps, clehe0.steps, strict=True):
        assert np.abs(a.merged - b.merged).max() <= 1e-9
    # and a real contrast (beta > 0) changes the distribution
    clehe = run("clehe", tau=0.25, beta=0.5)
    first = min(len(leens.steps), len(clehe.steps))
    gaps = [np.abs(leens.steps[t].merged - clehe.steps[t].merged).max() for t in range(first)]
    assert max(gaps) > 1e-3


def test_defaults_and_bad_input(tiny):
    assert default_layers(30) == [16, 18, 20, 22, 24, 26, 28, 30]
    assert default_layers(32) == [16, 18, 20, 22, 24, 26, 28, 30, 32]
    assert default_layers(2) == [2]
    asm = ContextAssembler(tiny.engine, "entropy")
    dec = EnsembleDecoder(asm)
    assert dec.config.tau == 0.25 and dec.config.beta == 0.25 and dec.layers == [2]
    with pytest.raises(CisrankError, match="unknown decoding"):
        dec.generate(QUESTION, passages(2), "beam")
    with pytest.raises(CisrankError, match="no passages"):
        dec.generate(QUESTION, [], "leens")
    with pytest.raises(CisrankError, match="replug needs one reranker score per passage"):
        dec.generate(QUESTION, passages(2), "replug")
    with pytest.raises(CisrankError, match=r"layers must be in 0\.\.2"):
        EnsembleDecoder(asm, layers=[3])
    with pytest.raises(CisrankError, match="exceeds the context"):
        dec.generate(QUESTION, passages(2), "naive", max_new_tokens=5000)


def test_decodings_sharing_one_prefill_equal_each_alone(tiny):
    """generate_many prefills the K + 1 rows once and decodes every mode from it: each result
    must equal a decoding that prefilled on its own (the shared prefill is never written)."""
    asm = ContextAssembler(tiny.engine, "entropy")
    docs = passages(4)
    scores = [1.0, -0.5, 0.25, 2.0]
    dec = EnsembleDecoder(asm, tau=0.5, beta=0.7, layers=[1, 2])
    modes = ["clehe", "naive", "avg_ens", "replug", "leens"]
    kw = dict(max_new_tokens=4, scores=scores, stop_at_eos=False, trace=True)
    together = dec.generate_many(QUESTION, docs, modes, **kw)
    assert list(together) == modes
    for mode in modes:
        alone = dec.generate(QUESTION, docs, mode, **kw)
        got = together[mode]
        assert got.decoding == mode and got.tokens == alone.tokens and got.text == alone.text
        for a, b in zip(got.steps, alone.steps, strict=True):
            assert np.array_equal(a.merged, b.merged), mode
            assert a.weights == b.weights and a.layer == b.layer
    with pytest.raises(CisrankError, match="no decoding"):
        dec.generate_many(QUESTION, docs, [])


def test_prefill_in_length_batches_equals_one_padded_batch(tiny):
    """Rows prefilled in separate batches and laid side by side decode as one left-padded batch
    of all rows does: same logits at every step (float32 noise only), same tokens."""
    eng = tiny.engine
    asm = ContextAssembler(eng, "entropy")
    single = asm.template.single()
    rows = [asm.render(QUESTION, []).ids]
    rows += [asm.render(QUESTION, [d], template=single).ids for d in passages(5)]
    assert len({len(r) for r in rows}) > 2  # lengths differ: padding matters
    seen: dict[str, list[np.ndarray]] = {}
    saved = eng.batch_size, eng.max_padding
    try:
        for name, (size, padding) in {"one batch": (None, 0.99), "one row each": (1, 0.0)}.items():
            eng.batch_size, eng.max_padding = size, padding
            assert len(eng.batcher().plan([len(r) for r in rows])) == (
                1 if name == "one batch" else len(rows)
            )
            logits: list[np.ndarray] = []

            def choose(step, logits=logits):
                logits.append(step.logits.numpy().copy())
                assert set(step.hidden) == {1}
                logits.append(step.hidden[1].numpy().copy())
                return int(step.logits[0].argmax())

            eng.decode_lockstep(rows, choose, 3, layers=[1])
            seen[name] = logits
    finally:
        eng.batch_size, eng.max_padding = saved
    for a, b in zip(seen["one batch"], seen["one row each"], strict=True):
        assert np.abs(a - b).max() <= 1e-4
