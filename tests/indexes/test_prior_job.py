"""The prior job (`index build prior`): every stored log p(K) is the CIS reranker's own, the store is
used as is by a CIS reranker, an interrupted build resumes computing only what is missing, and the
CLI builds, describes and refuses bad input."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from typer.testing import CliRunner

from cisrank import testing
from cisrank.cli import app
from cisrank.data.manifest import MANIFEST_FILE, read_manifest
from cisrank.errors import CisrankError, DataError
from cisrank.indexes.build import STATE_FILE, build_index
from cisrank.indexes.kinds import open_index
from cisrank.indexes.prior import PRIOR_FILE
from cisrank.lm.engine import CausalLMEngine
from cisrank.rerank.cis import CISReranker
from cisrank.rerank.prior_store import PriorStore, passage_key

TOL = 1e-4
QUERY = "When was the author of Hamlet born?"
S = testing.SAMPLE_SENTENCES
# 20 passages, 19 distinct contents: the last repeats the first under another id (one prior).
ROWS = [{"id": f"p{i}", "text": s} for i, s in enumerate(S)]
ROWS += [{"id": f"c{i}", "text": f"{S[i]} {S[(3 * i + 1) % len(S)]}"} for i in range(9)]
ROWS[10]["title"] = "Hamlet"  # a passage is its contents: title and text
ROWS.append({"id": "dup", "text": S[0]})
CONTENTS = [f"{r['title']}\n{r['text']}" if r.get("title") else r["text"] for r in ROWS]
DISTINCT = len(set(CONTENTS))


@pytest.fixture
def corpus(tmp_path) -> Path:
    p = tmp_path / "corpus.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return p


@pytest.fixture(scope="module")
def ref(tiny_gpt2_dir) -> CISReranker:
    """The reranker built independently of the job (no store: priors in its memory cache)."""
    return CISReranker(str(tiny_gpt2_dir), estimator="forward")


def _stored(store_path: Path, reranker: CISReranker, texts: list[str]) -> list[tuple[float, int]]:
    keys = [passage_key(d) for d in reranker.passage_ids(texts)]
    found = PriorStore(store_path).get_many(reranker.store_fingerprint, keys)
    assert set(keys) <= set(found), "some passages have no stored prior"
    return [found[k] for k in keys]


def _brute_priors(path: Path, texts: list[str]) -> list[float]:
    """log p(K) exactly as the `cisrank.rerank.cis` contract says: one float64 forward of [BOS, D] each, full logits."""
    lm = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float64).eval()
    tok = AutoTokenizer.from_pretrained(path)
    bos = tok.bos_token_id if tok.bos_token_id is not None else tok.eos_token_id
    out = []
    for text in texts:
        d = tok(text, add_special_tokens=False)["input_ids"][:512]
        with torch.no_grad():
            ls = torch.log_softmax(lm(torch.tensor([[bos, *d]])).logits[0].double(), -1)
        out.append(sum(float(ls[i, t]) for i, t in enumerate(d)))
    return out


def test_stored_priors_are_the_rerankers(tmp_path, corpus, tiny_gpt2_dir, ref):
    out = tmp_path / "prior"
    m = build_index(
        "prior",
        corpus,
        out,
        {"model": str(tiny_gpt2_dir)},
        progress=False,
        options={"batch_size": 8},
    )
    assert sorted(p.name for p in out.iterdir()) == [MANIFEST_FILE, PRIOR_FILE]  # WAL folded in
    assert m.kind == "prior" and m.files == [PRIOR_FILE] and read_manifest(out).kind == "prior"
    assert m.params["model"] == str(tiny_gpt2_dir) and m.params["max_doc_tokens"] == 512
    assert m.params["batch_size"] == 8 and m.params["batch_tokens"] >= 1
    assert m.model["store_fingerprint"] == ref.store_fingerprint
    assert m.model["fingerprint"] == ref.engine.fingerprint() and m.model["dtype"] == "float32"
    assert m.build["passages"] == len(ROWS) and m.build["resumed"] is False
    assert m.build["priors_computed"] == m.build["priors_stored"] == DISTINCT
    assert m.build["priors_reused"] == len(ROWS) - DISTINCT  # the repeat, found in the store
    assert PriorStore(out / PRIOR_FILE).count() == DISTINCT

    stored = _stored(out / PRIOR_FILE, ref, CONTENTS)
    values = np.array([lp for lp, _ in stored])
    assert [n for _, n in stored] == [len(d) for d in ref.passage_ids(CONTENTS)]
    assert np.abs(values - ref.log_prior(CONTENTS)).max() <= TOL
    assert np.abs(values - _brute_priors(tiny_gpt2_dir, CONTENTS)).max() <= TOL


def test_reranker_uses_the_store_as_is(tmp_path, corpus, tiny_gpt2_dir, monkeypatch):
    out = tmp_path / "prior"
    build_index("prior", corpus, out, {"model": str(tiny_gpt2_dir)}, progress=False)
    store = PriorStore(out / PRIOR_FILE)
    orig = CausalLMEngine.score_continuations
    prefixes: list[list[int]] = []

    def spy(self, prefix, conts, **kw):
        prefixes.append(list(prefix))
        return orig(self, prefix, conts, **kw)

    monkeypatch.setattr(CausalLMEngine, "score_continuations", spy)
    for template, normalize in (("qa", "sum"), ("plain", "mean")):  # neither enters the key
        with_store = CISReranker(
            str(tiny_gpt2_dir),
            template=template,
            normalize=normalize,
            prior_store=store,
            estimator="forward",
        )
        without = CISReranker(
            template=template, normalize=normalize, engine=with_store.engine, estimator="forward"
        )
        expected = without.score(QUERY, CONTENTS)
        prefixes.clear()
        got = with_store.score(QUERY, CONTENTS)
        assert np.abs(np.array(got) - expected).max() <= TOL
        assert len(prefixes) == 1 and prefixes[0] != [with_store.engine.bos_id]  # log p(K|Q) only
    assert store.stats() == {"hits": 2 * len(ROWS), "misses": 0}
    assert store.count() == DISTINCT  # nothing written back


def test_interrupted_build_resumes_computing_only_the_missing(
    tmp_path, corpus, tiny_gpt2_dir, ref, monkeypatch
):
    out = tmp_path / "prior"
    params = {"model": str(tiny_gpt2_dir)}
    orig = CausalLMEngine.score_continuations
    scored: list[int] = []

    def dies_in_second_batch(self, prefix, conts, **kw):
        if scored:
            raise KeyboardInterrupt  # Ctrl-C in the middle of the second batch
        scored.append(len(conts))
        return orig(self, prefix, conts, **kw)

    monkeypatch.setattr(CausalLMEngine, "score_continuations", dies_in_second_batch)
    with pytest.raises(KeyboardInterrupt):
        build_index("prior", corpus, out, params, progress=False, options={"batch_size": 8})
    assert scored == [8]
    assert not (out / MANIFEST_FILE).exists() and (out / STATE_FILE).exists()
    with pytest.raises(DataError, match="not a complete index"):
        read_manifest(out)
    assert PriorStore(out / PRIOR_FILE).count() == 8  # the first batch was committed

    def counting(self, prefix, conts, **kw):
        scored.append(len(conts))
        return orig(self, prefix, conts, **kw)

    scored.clear()
    monkeypatch.setattr(CausalLMEngine, "score_continuations", counting)
    # another batch size is how the job runs, not what it computes: the rerun still resumes
    m = build_index("prior", corpus, out, params, progress=False, options={"batch_size": 5})
    assert m.build["resumed"] is True and read_manifest(out).kind == "prior"
    assert not (out / STATE_FILE).exists()
    assert sum(scored) == DISTINCT - 8  # only the passages the first run had not stored
    assert m.build["priors_computed"] == DISTINCT - 8 and m.build["priors_stored"] == DISTINCT
    assert m.build["priors_reused"] == len(ROWS) - (DISTINCT - 8)
    values = [lp for lp, _ in _stored(out / PRIOR_FILE, ref, CONTENTS)]
    assert np.abs(np.array(values) - ref.log_prior(CONTENTS)).max() <= TOL


def _cli(monkeypatch, capsys, args: list[str]) -> tuple[int, str, str]:
    """The real entry point (`main`): CisrankError -> one line on stderr, exit 2."""
    from cisrank.cli import main

    monkeypatch.setattr(sys, "argv", ["cisrank", *args])
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        main()
    out = capsys.readouterr()
    return int(exc.value.code or 0), out.out, out.err


def _windows_by_hand(tokenizer_dir: Path, texts: list[str], window: int) -> list[str]:
    """Every window of `texts` cut by hand from the tokenizer's offsets: `window` tokens, each
    starting `window - window // 2` tokens after the last (the default overlap, 32 tokens, is
    capped at half the model's window), until one reaches the last token."""
    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    out = []
    for text in texts:
        offsets = tok(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
        if len(offsets) <= window:
            out.append(text)
            continue
        start = 0
        while True:
            stop = min(start + window, len(offsets))
            out.append(text[offsets[start][0] : offsets[stop - 1][1]])
            if stop == len(offsets):
                break
            start += window - window // 2
    return out


def test_cli_build_info_and_use_as_prior_store(tmp_path, corpus, tiny_gpt2_dir, ref):
    out = tmp_path / "prior"
    runner = CliRunner()
    build = ["index", "build", "prior", "--corpus", str(corpus), "--out", str(out)]
    model = ["--model", str(tiny_gpt2_dir), "--max-doc-tokens", "6"]
    res = runner.invoke(app, [*build, *model, "--batch-size", "8", "-q"])
    assert res.exit_code == 0, res.output
    assert f"built prior index of {len(ROWS)} passages" in res.output
    res = runner.invoke(app, ["index", "info", str(out)])
    assert res.exit_code == 0, res.output
    assert "kind      prior" in res.output and f"{len(ROWS)} passages" in res.output
    assert "priors    " in res.output and "dim " not in res.output
    data = json.loads(runner.invoke(app, ["index", "info", str(out), "--json"]).stdout)
    short = CISReranker(
        max_doc_tokens=6, engine=ref.engine, estimator="forward"
    )  # truncation is part of the key
    # every 6-token window of every passage has its prior: the values of one [BOS, window]
    # forward each, the windows cut by hand
    windows = _windows_by_hand(tiny_gpt2_dir, CONTENTS, 6)
    keys = {passage_key(d) for d in short.passage_ids(windows)}
    assert len(windows) > 3 * len(CONTENTS)
    assert data["params"]["max_doc_tokens"] == 6
    assert data["params"]["chunking"]["overlap_tokens"] == 32
    assert data["model"]["store_fingerprint"] == short.store_fingerprint
    assert data["build"]["priors_stored"] == len(keys)
    stored = _stored(out / PRIOR_FILE, short, windows)
    brute = _brute_priors(tiny_gpt2_dir, windows)
    assert np.abs(np.array([lp for lp, _ in stored]) - brute).max() <= TOL
    with pytest.raises(CisrankError, match="is a prior index, which is not a retriever"):
        open_index(out)
    res = runner.invoke(app, [*build, *model, "-q"])
    assert res.exit_code != 0 and "already holds a complete index" in str(res.exception)

    passages = tmp_path / "passages.jsonl"
    passages.write_text(
        "".join(
            json.dumps({"id": r["id"], "text": c}) + "\n"
            for r, c in zip(ROWS, CONTENTS, strict=True)
        )
    )
    rerank = ["rerank", "-r", "cis", "--estimator", "forward", "--query", QUERY]
    rerank += ["--passages", str(passages), "--json"]
    rerank += [*model, "--template", "qa"]
    # chunked in full (the default, as the build cut them): every window's prior is found
    store = out / PRIOR_FILE
    res = runner.invoke(app, [*rerank, "--prior-store", str(store)])
    assert res.exit_code == 0, res.output
    assert len(json.loads(res.stdout)["results"]) == len(ROWS)
    assert json.loads(res.stdout)["chunks"]["chunked_documents"] > 0
    assert PriorStore(store).count() == len(keys)  # none added

    # --max-chunks-per-doc 1: each passage's first window, the passage cut at --max-doc-tokens
    first = tmp_path / "first"
    build = ["index", "build", "prior", "--corpus", str(corpus), "--out", str(first)]
    res = runner.invoke(app, [*build, *model, "--max-chunks-per-doc", "1", "-q"])
    assert res.exit_code == 0, res.output
    store = first / PRIOR_FILE
    cut = {passage_key(d) for d in short.passage_ids(CONTENTS)}
    assert PriorStore(store).count() == len(cut) < DISTINCT  # 6 tokens: some passages meet
    res = runner.invoke(app, [*rerank, "--prior-store", str(store), "--max-chunks-per-doc", "1"])
    assert res.exit_code == 0, res.output
    assert PriorStore(store).count() == len(cut)  # every prior found, none added
    res = runner.invoke(app, [*rerank, "--prior-store", str(store)])  # the later windows'
    assert res.exit_code == 0, res.output
    assert PriorStore(store).count() == len(keys)


def test_bad_model_and_bad_params_are_clear_errors(
    tmp_path, corpus, tiny_gpt2_dir, monkeypatch, capsys
):
    out = tmp_path / "prior"
    missing = tmp_path / "no" / "such-model"
    build = ["index", "build", "prior", "--corpus", str(corpus), "--out", str(out)]
    code, _, err = _cli(monkeypatch, capsys, [*build, "--model", str(missing), "-q"])
    assert code == 2 and err.startswith("error: ") and err.count("\n") == 1
    assert str(missing) in err and "does not exist" in err
    assert not (out / MANIFEST_FILE).exists() and not (out / PRIOR_FILE).exists()
    with pytest.raises(CisrankError, match=r"unknown prior parameters \['batch_size'\]"):
        build_index("prior", corpus, tmp_path / "p2", {"model": "x", "batch_size": 8})
    with pytest.raises(CisrankError, match="needs a causal LM"):
        build_index("prior", corpus, tmp_path / "p3", {})


def test_two_workers_store_the_priors_of_one(tmp_path, corpus, tiny_gpt2_dir, ref):
    from cisrank.jobs.pool import WorkerOptions

    out = tmp_path / "prior2"
    m = build_index(
        "prior",
        corpus,
        out,
        {"model": str(tiny_gpt2_dir)},
        progress=False,
        options={"batch_size": 2, "workers": WorkerOptions(workers=2)},
    )
    assert m.build["passages"] == len(ROWS)
    assert m.build["priors_computed"] == m.build["priors_stored"] == DISTINCT
    assert m.build["priors_reused"] == len(ROWS) - DISTINCT
    stored = _stored(out / PRIOR_FILE, ref, CONTENTS)
    assert np.abs(np.array([lp for lp, _ in stored]) - ref.log_prior(CONTENTS)).max() <= TOL


def test_a_backend_keeps_its_own_priors_that_its_reranker_finds(
    tmp_path, corpus, tiny_llama_dir, monkeypatch
):
    pytest.importorskip("onnxruntime")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    out = tmp_path / "prior"
    runner = CliRunner()
    build = ["index", "build", "prior", "--corpus", str(corpus), "--out", str(out), "-q"]
    model = ["--model", str(tiny_llama_dir)]
    res = runner.invoke(app, [*build, *model, "--backend", "onnx", "--dtype", "float32"])
    assert res.exit_code == 0, res.output
    assert read_manifest(out).params["backend"] == "onnx"
    onnx = CISReranker(str(tiny_llama_dir), backend="onnx", dtype="float32", estimator="forward")
    exact = CISReranker(str(tiny_llama_dir), backend="torch", estimator="forward")
    assert onnx.store_fingerprint != exact.store_fingerprint
    found = PriorStore(out / PRIOR_FILE)
    keys = [passage_key(d) for d in onnx.passage_ids(CONTENTS)]
    assert not found.get_many(exact.store_fingerprint, keys)  # torch never reads onnx's priors
    stored = found.get_many(onnx.store_fingerprint, keys)
    assert len(stored) == DISTINCT
    # float32 through ONNX Runtime: the torch reranker's own priors to 1e-3
    want = exact.log_prior(CONTENTS)
    got = [stored[k][0] for k in keys]
    assert np.allclose(got, want, atol=1e-3, rtol=0)
