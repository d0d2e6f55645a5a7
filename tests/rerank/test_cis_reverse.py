"""The reverse CIS estimator (log p(Q|K) under a passage-first template) and the engine's
`score_spans` shape, against a brute-force full forward of each whole sequence (float64)."""

from __future__ import annotations

import random
import shutil

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from cisrank.errors import CisrankError
from cisrank.lm.engine import CausalLMEngine
from cisrank.lm.prompts import REVERSE_TEMPLATES
from cisrank.rerank.cis import CISReranker

TOL = 1e-4  # float32 engine against a float64 reference, summed over the query's tokens
QUERY = "When was the author of Hamlet born?"
PASSAGES = [
    "Shakespeare was born in 1564 in Stratford-upon-Avon.",
    "Hamlet is a tragedy set in Denmark.",
    "Paris is the capital of France.",
    "Shakespeare was born in 1564 in Stratford-upon-Avon.",
    "Fleas can live up to a year depending on conditions, and the author of Hamlet was not one.",
    "born",
]


def _load(path):
    return (
        AutoModelForCausalLM.from_pretrained(path, dtype=torch.float64).eval(),
        AutoTokenizer.from_pretrained(path),
    )


def _logprob(ref, context: list[int], target: list[int]) -> float:
    with torch.no_grad():
        logits = ref(torch.tensor([context + target])).logits[0].double()
    ls = torch.log_softmax(logits, -1)
    return sum(float(ls[len(context) - 1 + i, t]) for i, t in enumerate(target))


def brute_reverse(ref, tok, template: str, query: str, passage: str, max_doc: int = 512) -> float:
    """log p(Q | [BOS, before, D, between]) written out from the template text itself."""
    bos = tok.bos_token_id if tok.bos_token_id is not None else tok.eos_token_id
    before, rest = template.split("{passage}")
    between = rest[: -len("{query}")]
    q = query
    if between.endswith(" "):
        between, q = between[:-1], " " + query

    def enc(text: str) -> list[int]:
        return tok(text, add_special_tokens=False)["input_ids"]

    d = enc(passage)[:max_doc]
    return _logprob(ref, [bos, *enc(before), *d, *enc(between)], enc(q))


@pytest.fixture(scope="module")
def models(tiny_gpt2_dir, tiny_llama_dir, tiny_gpt2_bpe_dir):
    return {
        "gpt2": (tiny_gpt2_dir, *_load(tiny_gpt2_dir)),
        "llama": (tiny_llama_dir, *_load(tiny_llama_dir)),
        "bpe": (tiny_gpt2_bpe_dir, *_load(tiny_gpt2_bpe_dir)),
    }


@pytest.mark.parametrize("arch", ["gpt2", "llama", "bpe"])
@pytest.mark.parametrize(
    "template",
    [REVERSE_TEMPLATES["upr"], "{passage}\n{query}", "Read: {passage} Ask:{query}"],
)
def test_reverse_matches_brute_force(models, arch, template):
    path, ref, tok = models[arch]
    r = CISReranker(str(path), estimator="reverse", reverse_template=template, device="cpu")
    got = r.score(QUERY, PASSAGES)
    exp = [brute_reverse(ref, tok, template, QUERY, p) for p in PASSAGES]
    assert np.allclose(got, exp, atol=TOL, rtol=0), (got, exp)
    assert got[0] == got[3]  # the same passage twice: scored once
    n_query = len(
        tok((" " if template.endswith(" {query}") else "") + QUERY, add_special_tokens=False)[
            "input_ids"
        ]
    )
    mean = CISReranker(
        str(path), estimator="reverse", reverse_template=template, normalize="mean", engine=r.engine
    ).score(QUERY, PASSAGES)
    assert np.allclose(mean, np.asarray(exp) / n_query, atol=TOL, rtol=0)


def test_reverse_is_batch_and_padding_independent(models):
    path, ref, tok = models["bpe"]
    template = REVERSE_TEMPLATES["upr"]
    exp = [brute_reverse(ref, tok, template, QUERY, p, max_doc=12) for p in PASSAGES]
    other = "Who wrote Hamlet?"
    exp_other = [brute_reverse(ref, tok, template, other, p, max_doc=12) for p in PASSAGES]
    rng = random.Random(3)
    for batch_size, side, padding in [(1, "right", 0.0), (3, "left", 0.5), (64, "right", 0.9)]:
        r = CISReranker(
            str(path),
            estimator="reverse",
            device="cpu",
            batch_size=batch_size,
            padding_side=side,
            max_padding=padding,
            max_doc_tokens=12,
        )
        shuffled = PASSAGES[:]
        rng.shuffle(shuffled)
        got = r.score_batch([(QUERY, shuffled), (other, PASSAGES)])
        assert np.allclose(got[0], [exp[PASSAGES.index(p)] for p in shuffled], atol=TOL, rtol=0)
        assert np.allclose(got[1], exp_other, atol=TOL, rtol=0)


def test_both_is_the_mean_of_forward_and_reverse(models):
    path, _, _ = models["gpt2"]
    fwd = CISReranker(str(path), template="qa", device="cpu", estimator="forward")
    rev = CISReranker(str(path), estimator="reverse", device="cpu", engine=fwd.engine)
    both = CISReranker(str(path), estimator="both", template="qa", device="cpu", engine=fwd.engine)
    f, r, b = fwd.score(QUERY, PASSAGES), rev.score(QUERY, PASSAGES), both.score(QUERY, PASSAGES)
    assert np.allclose(b, (np.asarray(f) + np.asarray(r)) / 2, atol=1e-9, rtol=0)
    assert not np.allclose(f, r)  # two different estimates, not one computed twice


def test_score_spans_with_distinct_contexts(models):
    """The engine's other shape: every row its own context, any mix of lengths."""
    path, ref, _ = models["llama"]
    engine = CausalLMEngine(str(path), device="cpu", batch_size=2, max_padding=0.9)
    enc = engine.encode
    spans = [([engine.bos_id, *enc(p)], enc(QUERY)) for p in PASSAGES] + [
        ([engine.bos_id], enc("Hamlet")),
        ([engine.bos_id, *enc("Paris")], []),
    ]
    res = engine.score_spans(spans, return_tokens=True)
    exp = [_logprob(ref, c, g) if g else 0.0 for c, g in spans]
    assert np.allclose(res.logprobs, exp, atol=TOL, rtol=0)
    assert res.num_tokens == [len(g) for _, g in spans]
    with pytest.raises(CisrankError, match="at least one token"):
        engine.score_spans([([], enc(QUERY))])


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_a_context_shared_by_many_targets_runs_once_and_scores_as_alone(models, arch):
    """One passage under several queries (teacher scoring of a pool): the passage's context is
    fed once, its cache reused by each query, and every pair scores what it scores alone and
    what a brute-force float64 forward gives."""
    path, ref, tok = models[arch]
    template = REVERSE_TEMPLATES["upr"]
    queries = [QUERY, "Who wrote Hamlet?", "Where is Paris?", "born"]
    r = CISReranker(str(path), estimator="reverse", device="cpu")
    fed: list[int] = []
    hook = r.engine.backend.base.register_forward_pre_hook(
        lambda _m, _a, kw: fed.append(int(kw["input_ids"].numel())), with_kwargs=True
    )
    try:
        together = r.score_batch([(q, PASSAGES[:3]) for q in queries])
    finally:
        hook.remove()
    alone = [[r.score(q, [p])[0] for p in PASSAGES[:3]] for q in queries]
    exp = [[brute_reverse(ref, tok, template, q, p) for p in PASSAGES[:3]] for q in queries]
    assert np.allclose(together, exp, atol=TOL, rtol=0)
    assert np.allclose(together, alone, atol=TOL, rtol=0)
    cut = r.reverse_template
    bos, enc = r.engine.bos_id, r.engine.encode
    contexts = [len(cut.ids(enc, bos, d, "x")[0]) for d in r.passage_ids(PASSAGES[:3])]
    targets = [len(cut.ids(enc, bos, [], q)[1]) for q in queries]
    unshared = len(queries) * sum(contexts) + 3 * sum(targets)
    # each context once and each query once per passage (padding allowed), far below feeding
    # every (context, query) row whole
    assert sum(fed) <= sum(contexts) + 2 * 3 * sum(targets) < unshared


def test_chat_templates_render_the_tokenizers_turns(tiny_gpt2_bpe_dir, tmp_path):
    folder = tmp_path / "chat"
    shutil.copytree(tiny_gpt2_bpe_dir, folder)
    tok = AutoTokenizer.from_pretrained(folder)
    tok.chat_template = (
        "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}</{{ m['role'] }}>\n{% endfor %}"
    )
    tok.save_pretrained(folder)
    ref = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float64).eval()
    r = CISReranker(
        str(folder),
        template="chat",
        estimator="both",
        reverse_template="chat",
        device="cpu",
    )
    assert r.template == "<user>{query}</user>\n<assistant>"
    expected_reverse = (
        "<user>{passage}\n\nPlease write a question based on this passage.</user>\n"
        "<assistant>{query}"
    )
    got = r.reverse_batch([(QUERY, PASSAGES[:2])])[0]
    exp = [brute_reverse(ref, tok, expected_reverse, QUERY, p) for p in PASSAGES[:2]]
    assert np.allclose(got, exp, atol=TOL, rtol=0)


def test_bad_reverse_templates_are_one_line_errors(tiny_gpt2_dir):
    for bad, msg in [
        ("{query} then {passage}", "ending with"),
        ("no slots", "ending with"),
        ("{passage} {other} {query}", "braces other than"),
    ]:
        with pytest.raises(CisrankError, match=msg):
            CISReranker(str(tiny_gpt2_dir), estimator="reverse", reverse_template=bad)
    with pytest.raises(CisrankError, match="estimator"):
        CISReranker(str(tiny_gpt2_dir), estimator="sideways")
