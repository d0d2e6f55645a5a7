"""CISReranker against its contract (`cisrank.rerank.cis` docstring) computed by brute force (float64, one forward each)."""

from __future__ import annotations

import json
import random
import subprocess
import sys

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from cisrank.errors import CisrankError
from cisrank.rerank import CISReranker, load_reranker
from cisrank.rerank.cis import TEMPLATES
from cisrank.rerank.prior_store import PriorStore

TOL = 1e-3
QUERY = "When was the author of Hamlet born?"
PASSAGES = [
    "Shakespeare was born in 1564 in Stratford-upon-Avon.",
    "Hamlet is a tragedy set in Denmark.",
    "Paris is the capital of France.",
    "When was the author of Hamlet born? The author of Hamlet.",
    "Shakespeare was born in 1564 in Stratford-upon-Avon.",
    "Fleas can live up to a year depending on conditions.",
]


def brute(ref, tok, template: str, query: str, passage: str, max_doc: int = 512):
    """(log p(K|Q), log p(K), n) exactly as the `cisrank.rerank.cis` contract says, float64, full logits."""
    bos = tok.bos_token_id if tok.bos_token_id is not None else tok.eos_token_id
    d = tok(passage, add_special_tokens=False)["input_ids"][:max_doc]
    p = tok(template.format(query=query), add_special_tokens=False)["input_ids"]

    def lp(ctx):
        with torch.no_grad():
            logits = ref(torch.tensor([ctx + d])).logits[0].double()
        ls = torch.log_softmax(logits, -1)
        return sum(float(ls[len(ctx) - 1 + i, t]) for i, t in enumerate(d))

    return lp([bos, *p]), lp([bos]), len(d)


@pytest.fixture(scope="module")
def refs(tiny_gpt2_dir, tiny_llama_dir, tiny_gpt2_bpe_dir):
    out = {}
    for name, path in (
        ("gpt2", tiny_gpt2_dir),
        ("llama", tiny_llama_dir),
        ("bpe", tiny_gpt2_bpe_dir),
    ):
        out[name] = (
            path,
            AutoModelForCausalLM.from_pretrained(path, dtype=torch.float64).eval(),
            AutoTokenizer.from_pretrained(path),
        )
    return out


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
@pytest.mark.parametrize("template", ["plain", "qa"])
def test_matches_brute_force(refs, arch, template, tmp_path):
    path, ref, tok = refs[arch]
    exp = [brute(ref, tok, TEMPLATES[template], QUERY, k) for k in PASSAGES]
    r = CISReranker(str(path), template=template, device="cpu", batch_size=4, estimator="forward")
    assert np.abs(np.array(r.log_conditional(QUERY, PASSAGES)) - [e[0] for e in exp]).max() <= TOL
    assert np.abs(np.array(r.log_prior(PASSAGES)) - [e[1] for e in exp]).max() <= TOL
    cis = [e[0] - e[1] for e in exp]
    assert np.abs(np.array(r.score(QUERY, PASSAGES)) - cis).max() <= TOL
    mean = CISReranker(
        str(path), template=template, normalize="mean", engine=r.engine, estimator="forward"
    )
    assert (
        np.abs(
            np.array(mean.score(QUERY, PASSAGES))
            - [c / e[2] for c, e in zip(cis, exp, strict=True)]
        ).max()
        <= TOL / 10
    )
    # invariance: batch sizes, padding side, shuffled order, warm vs cold store
    store = PriorStore(tmp_path / "priors.sqlite")
    order = list(range(len(PASSAGES)))
    random.Random(1).shuffle(order)
    for bs, side in ((1, "left"), (2, "right"), (len(PASSAGES), "left")):
        rr = CISReranker(
            str(path),
            template=template,
            batch_size=bs,
            padding_side=side,
            prior_store=store,
            estimator="forward",
        )
        got = rr.score(QUERY, [PASSAGES[i] for i in order])
        assert np.abs(np.array(got) - [cis[i] for i in order]).max() <= TOL, (bs, side)
    assert store.count() == len(set(PASSAGES))  # one entry per distinct passage
    assert store.stats() == {"hits": 2 * len(PASSAGES), "misses": len(PASSAGES)}


def test_without_the_prior_it_ranks_by_log_p_k_given_q_alone(refs, tmp_path):
    """`prior=False` is the paper's "w/o p(K)" ablation (Table 4): log p(K|Q) by brute force,
    summed or per token, with no prior computed or stored; the reverse estimator has no prior
    term to drop, so asking for it is a one-line error."""
    path, ref, tok = refs["llama"]
    exp = [brute(ref, tok, TEMPLATES["qa"], QUERY, k) for k in PASSAGES]
    store = PriorStore(tmp_path / "priors.sqlite")
    r = CISReranker(
        str(path), template="qa", prior=False, prior_store=store, device="cpu", estimator="forward"
    )
    got = r.score_batch([(QUERY, PASSAGES), (QUERY, [])])
    assert np.abs(np.array(got[0]) - [e[0] for e in exp]).max() <= TOL and got[1] == []
    assert store.count() == 0  # no log p(K) was computed for it
    mean = CISReranker(
        str(path),
        template="qa",
        prior=False,
        normalize="mean",
        engine=r.engine,
        estimator="forward",
    )
    want = [e[0] / e[2] for e in exp]
    assert np.abs(np.array(mean.score(QUERY, PASSAGES)) - want).max() <= TOL / 10
    both = CISReranker(str(path), template="qa", estimator="both", prior=False, engine=r.engine)
    reverse = CISReranker(str(path), estimator="reverse", engine=r.engine).score(QUERY, PASSAGES)
    halves = (np.array([e[0] for e in exp]) + reverse) / 2
    assert np.abs(np.array(both.score(QUERY, PASSAGES)) - halves).max() <= TOL
    with pytest.raises(CisrankError, match="reverse estimator has no prior term"):
        load_reranker("cis", str(path), estimator="reverse", prior=False)
    # a distillation teacher without the prior teaches log p(K|Q), not CIS
    from cisrank.distill.teachers import load_teacher

    teacher = load_teacher("cis", str(path), template="qa", prior=False, estimator="forward")
    taught = teacher.score("q", QUERY, [str(i) for i in range(len(PASSAGES))], PASSAGES)
    assert np.abs(np.array(taught.score) - [e[0] for e in exp]).max() <= TOL


def test_each_side_reads_only_the_options_its_setting_names(refs):
    """`CISRerankerConfig.side_setting` is what stored sums are keyed by (`cisrank eval rag`):
    settings it calls one must give the same sums, and the templates it tells apart must not.
    log p(K|Q) reads the forward template alone, log p(Q|K) the reverse one, log p(K) neither."""
    from cisrank.rerank.configs import CISRerankerConfig

    path, _, _ = refs["gpt2"]
    base = CISReranker(str(path), device="cpu", estimator="both")
    requests = [(QUERY, PASSAGES)]

    def sums(side, **options):
        r = CISReranker(str(path), engine=base.engine, estimator="both", **options)
        setting = CISRerankerConfig(estimator="both", **options).side_setting(side)
        return [p[side] for p in r.parts_batch(requests, [side])[0]], setting

    cases = {
        "conditional": (
            {"reverse_template": "Text: {passage} Query: {query}"},
            {"template": "plain"},
        ),
        "prior": (
            {"template": "plain", "reverse_template": "Text: {passage} Query: {query}"},
            {"max_doc_tokens": 4},
        ),
        "query_likelihood": (
            {"template": "plain"},
            {"reverse_template": "Text: {passage} Query: {query}"},
        ),
    }
    for side, (ignored, read) in cases.items():
        default, key = sums(side)
        same, same_key = sums(side, **ignored)
        other, other_key = sums(side, **read)
        assert same == default and same_key == key, side
        assert other != default and other_key != key, side
    explicit = CISRerankerConfig(template="qa", reverse_template="upr", normalize="mean")
    assert explicit.side_setting("conditional") == CISRerankerConfig().side_setting("conditional")
    with pytest.raises(ValueError, match="unknown CIS side"):
        CISRerankerConfig().side_setting("posterior")


def test_custom_template_and_bpe_boundary(refs):
    """Prefix and passage are tokenized apart: a BPE merge across the boundary cannot change D."""
    path, ref, tok = refs["bpe"]
    template, query, passage = "Q: {query}", "the author of Hamlet is Shakesp", "eare."
    joint = tok(template.format(query=query) + passage, add_special_tokens=False)["input_ids"]
    sep = tok(passage, add_special_tokens=False)["input_ids"]
    assert joint[-len(sep) :] != sep  # the joint string really tokenizes differently
    r = CISReranker(str(path), template=template, device="cpu", estimator="forward")
    c, p, _ = brute(ref, tok, template, query, passage)
    assert abs(r.log_conditional(query, [passage])[0] - c) <= TOL
    assert abs(r.score(query, [passage])[0] - (c - p)) <= TOL


def test_store_misses_on_other_model_or_max_doc_tokens(refs, tmp_path):
    store = PriorStore(tmp_path / "priors.sqlite")
    gpt2 = CISReranker(str(refs["gpt2"][0]), prior_store=store, estimator="forward")
    cold = gpt2.log_prior(PASSAGES)
    warm = gpt2.log_prior(PASSAGES)
    assert cold == warm and store.stats() == {"hits": len(PASSAGES), "misses": len(PASSAGES)}
    llama = CISReranker(str(refs["llama"][0]), prior_store=store, estimator="forward")
    llama.log_prior(PASSAGES)
    assert store.stats()["misses"] == 2 * len(PASSAGES)
    short = CISReranker(
        str(refs["gpt2"][0]), prior_store=store, max_doc_tokens=4, estimator="forward"
    )
    got = short.log_prior(PASSAGES)
    assert store.stats()["misses"] == 3 * len(PASSAGES)
    _, ref, tok = refs["gpt2"]
    assert abs(got[0] - brute(ref, tok, "{query}", QUERY, PASSAGES[0], max_doc=4)[1]) <= TOL
    assert store.count() == 3 * len(set(PASSAGES))


def test_validation_and_registry(refs, tmp_path):
    path = str(refs["gpt2"][0])
    with pytest.raises(CisrankError, match="neither a named template"):
        CISReranker(path, template="no placeholder", estimator="forward")
    with pytest.raises(CisrankError, match="unknown CIS reranker option"):
        CISReranker(path, temperature=2, estimator="forward")
    with pytest.raises(CisrankError, match="cis reranker, not of dense"):
        load_reranker("dense", "all-MiniLM-L6-v2", template="qa")
    r = load_reranker(
        "cis",
        path,
        template="qa",
        max_doc_tokens=8,
        prior_store=str(tmp_path / "s"),
        estimator="forward",
    )
    assert isinstance(r, CISReranker) and r.prior_store is not None
    assert r.config.max_doc_tokens == 8 and r.score(QUERY, []) == []
    ranked = r.rank(QUERY, PASSAGES, top_n=2)
    assert [p.score for p in ranked] == sorted(r.score(QUERY, PASSAGES), reverse=True)[:2]


def _cli(monkeypatch, capsys, args: list[str]) -> tuple[int, str, str]:
    from cisrank.cli import main

    monkeypatch.setattr(sys, "argv", ["cisrank", *args])
    capsys.readouterr()  # drop earlier output
    with pytest.raises(SystemExit) as exc:
        main()
    out = capsys.readouterr()
    return int(exc.value.code or 0), out.out, out.err


def test_cli_rerank_and_errors(refs, tmp_path, monkeypatch, capsys):
    path = str(refs["gpt2"][0])
    passages = tmp_path / "p.jsonl"
    passages.write_text(
        "\n".join(json.dumps({"id": f"d{i}", "text": t}) for i, t in enumerate(PASSAGES))
    )
    base = ["rerank", "--query", QUERY, "--passages", str(passages)]
    store = str(tmp_path / "s.db")
    code, out, err = _cli(
        monkeypatch,
        capsys,
        [
            *base,
            *("-r", "cis", "-m", path, "--estimator", "forward", "--template", "qa"),
            *("--prior-store", store, "--json"),
        ],
    )
    assert code == 0, err
    rows = json.loads(out)["results"]
    expected = CISReranker(path, template="qa", estimator="forward").score(QUERY, PASSAGES)
    assert rows[0]["id"] == f"d{int(np.argmax(expected))}"
    assert abs(rows[0]["score"] - max(expected)) <= TOL
    assert PriorStore(store).count() == len(set(PASSAGES))
    # the default estimator is the reverse one (chosen on DL21): query likelihood, no prior
    code, out, err = _cli(monkeypatch, capsys, [*base, "-r", "cis", "-m", path, "--json"])
    assert code == 0, err
    reverse = CISReranker(path, estimator="reverse").score(QUERY, PASSAGES)
    got = {row["id"]: row["score"] for row in json.loads(out)["results"]}
    assert [got[f"d{i}"] for i in range(len(PASSAGES))] == pytest.approx(reverse, abs=TOL)
    code, _, err = _cli(monkeypatch, capsys, [*base, "-r", "cis", "-m", str(tmp_path / "no" / "m")])
    assert code == 2 and err.count("\n") == 1 and "does not exist" in err
    code, _, err = _cli(monkeypatch, capsys, [*base, "-r", "dense", "--template", "qa"])
    assert code == 2 and "--template" in err


def test_import_rerank_does_not_load_transformers():
    code = "import sys, cisrank.rerank; print('transformers' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert out.stdout.strip() == "False", out.stderr
