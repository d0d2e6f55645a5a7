"""`cisrank context` and `cisrank generate` through the real command line: JSON out, one-line
errors with exit 2, and their help."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest
from cli.helpers import help_text
from context.helpers import QUESTION, passages
from typer.testing import CliRunner

from cisrank.cli import app, main
from cisrank.context import ContextAssembler, Decoding
from cisrank.testing import SAMPLE_SENTENCES


@pytest.fixture
def passages_file(tmp_path):
    path = tmp_path / "top.jsonl"
    rows = [{"id": p.docid, "title": p.title, "text": p.text} for p in passages(4)]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def run_main(monkeypatch, capsys, *args: str) -> tuple[int, str, str]:
    monkeypatch.setattr(sys, "argv", ["cisrank", *args])
    with pytest.raises(SystemExit) as exit_info:
        main()
    out = capsys.readouterr()
    return int(exit_info.value.code or 0), out.out, out.err


def test_context_prints_order_scores_gauge_prompt(tiny_gpt2_dir, passages_file, tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(
        "\n".join(json.dumps({"id": f"c{i}", "text": s}) for i, s in enumerate(SAMPLE_SENTENCES))
    )
    args = ["context", "--query", QUESTION, "--passages", str(passages_file)]
    args += ["--model", str(tiny_gpt2_dir), "--arrange", "curvature", "--pmi"]
    res = CliRunner().invoke(app, [*args, "--noise", "2", "--noise-from", str(corpus)])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    want = ContextAssembler(str(tiny_gpt2_dir), "qa").arrange(QUESTION, passages(4), "curvature")
    assert out["arrange"] == "curvature" and out["template"] == "qa"
    assert out["order"] == want.order and len(out["candidates"]) == 4
    assert out["scores"] == pytest.approx(want.scores, abs=1e-5)
    assert out["noise"] == 2 and len(out["ids"]) == 6
    # noise from the corpus, never a retrieved passage's text (the first 4 corpus lines are)
    assert set(out["ids"][:2]) <= {f"c{i}" for i in range(4, 10)}
    assert out["ids"][2:] == [f"p{i}" for i in want.order]
    assert set(out["gauge"]) == {
        "mean_logprob",
        "logprob",
        "num_tokens",
        "pmi",
        "mean_logprob_no_context",
    }
    assert out["prompt"].endswith(f"Question: {QUESTION}\nAnswer:")
    again = CliRunner().invoke(app, [*args, "--noise", "2", "--noise-from", str(corpus)])
    assert json.loads(again.stdout) == out  # seeded
    words = CliRunner().invoke(app, [*args, "--noise", "1", "--arrange", "reverse"])
    assert words.exit_code == 0, words.output
    assert json.loads(words.stdout)["ids"][0] == "noise-0"


def test_context_errors_are_one_line_exit_2(
    tiny_gpt2_dir, passages_file, tmp_path, monkeypatch, capsys
):
    model = ["--model", str(tiny_gpt2_dir), "--query", QUESTION]
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    many = tmp_path / "many.txt"
    many.write_text("\n".join(SAMPLE_SENTENCES * 10))
    latin = tmp_path / "latin.txt"  # was a UnicodeDecodeError traceback
    latin.write_bytes(b"a passage\ncaf\xe9 au lait\n")
    cases = [
        (["--passages", str(empty)], "holds no passages"),
        (["--passages", str(latin)], f"{latin}:2: not UTF-8 (byte 0xe9 at column 4)"),
        (["--passages", str(many)], "100 passages make a prompt of"),
        (
            ["--passages", str(passages_file), "--template", "{intro} {documents} {question}"],
            "unknown field '{intro}'",
        ),
        (["--passages", str(passages_file), "--arrange", "sideways"], "--arrange 'sideways'"),
        (["--passages", str(passages_file), "--field", "oops"], "expected NAME=VALUE"),
    ]
    for extra, message in cases:
        code, out, err = run_main(monkeypatch, capsys, "context", *model, *extra)
        assert code == 2, (extra, out, err)
        # the last line (model loading may draw a progress bar before it) is the whole error
        last = err.rstrip("\n").split("\n")[-1]
        assert last.startswith("error: ") and message in last, err


def test_generate_prints_answer_and_attribution(tiny_gpt2_dir, tmp_path, monkeypatch, capsys):
    from cisrank.context.decoding import EnsembleDecoder

    scored = tmp_path / "scored.jsonl"
    rows = [
        {"id": p.docid, "title": p.title, "text": p.text, "score": s}
        for p, s in zip(passages(3), [1.5, 0.2, -0.4], strict=True)
    ]
    scored.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    args = ["generate", "--query", QUESTION, "--passages", str(scored)]
    args += ["--model", str(tiny_gpt2_dir), "--max-new-tokens", "4"]
    res = CliRunner().invoke(app, [*args, "--decoding", "clehe", "--layers", "1,2"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    want = EnsembleDecoder(ContextAssembler(str(tiny_gpt2_dir), "entropy"), layers=[1, 2])
    gen = want.generate(QUESTION, passages(3), "clehe", max_new_tokens=4)
    assert out["decoding"] == "clehe" and out["tokens"] == gen.tokens
    assert out["answer"] == gen.text
    assert out["attribution"] == [f"p{s.passage}" for s in gen.steps]
    assert all(abs(sum(w) - 1) < 1e-6 and len(w) == 3 for w in out["weights"])
    assert set(out["layers"]) <= {1, 2}
    rep = CliRunner().invoke(app, [*args, "--decoding", "replug"])
    assert rep.exit_code == 0, rep.output
    w = np.exp([1.5, 0.2, -0.4]) / np.exp([1.5, 0.2, -0.4]).sum()
    assert np.allclose(json.loads(rep.stdout)["weights"][0], w)
    naive = CliRunner().invoke(app, [*args, "--arrange", "reverse"])
    assert json.loads(naive.stdout)["order"] == [2, 1, 0]

    # a scored arrangement costs its K search prompts; the arranged one is generated, not gauged
    from cisrank.lm.engine import CausalLMEngine

    rows: list[int] = []
    score_spans = CausalLMEngine.score_spans

    def counted(self, spans, **kw):
        rows.append(len(spans))
        return score_spans(self, spans, **kw)

    monkeypatch.setattr(CausalLMEngine, "score_spans", counted)
    five = tmp_path / "five.jsonl"
    five.write_text("\n".join(json.dumps({"id": p.docid, "text": p.text}) for p in passages(5)))
    args5 = ["generate", "--query", QUESTION, "--passages", str(five), "--arrange", "curvature"]
    res = CliRunner().invoke(app, [*args5, "--model", str(tiny_gpt2_dir), "--max-new-tokens", "2"])
    assert res.exit_code == 0, res.output
    order = json.loads(res.stdout)["order"]
    assert order not in [[(i + s) % 5 for i in range(5)] for s in range(5)]  # not a rotation
    assert sum(rows) == 5

    plain = tmp_path / "plain.txt"
    plain.write_text("\n".join(p.text for p in passages(2)))
    model = ["--model", str(tiny_gpt2_dir), "--query", QUESTION]
    for extra, message in [
        (["--passages", str(plain), "--decoding", "replug"], "needs a 'score' on every line"),
        (["--passages", str(plain), "--decoding", "beam"], "--decoding 'beam'"),
        (["--passages", str(plain), "--decoding", "clehe", "--layers", "x"], "--layers 'x'"),
        (["--passages", str(plain), "--decoding", "clehe", "--layers", "9"], "layers must be in"),
    ]:
        code, _, err = run_main(monkeypatch, capsys, "generate", *model, *extra)
        last = err.rstrip("\n").split("\n")[-1]
        assert code == 2 and last.startswith("error: ") and message in last, err


@pytest.mark.parametrize("verb", ["context", "generate"])
def test_model_is_required_and_shown_so(verb, passages_file):
    row = next(line for line in help_text(verb).splitlines() if "--model" in line)
    assert "[required]" in row and "causal LM" in row and "reranker" not in row
    res = CliRunner().invoke(app, [verb, "--query", QUESTION, "--passages", str(passages_file)])
    assert res.exit_code == 2 and "Missing option '--model'" in res.output


def test_generate_template_help_says_what_the_default_prompt_is():
    out = " ".join(help_text("generate").split())
    assert "entropy ('Write a high-quality answer for the given question" in out
    assert "seed" not in out and "paper's prompts" not in out


def test_an_empty_answer_is_warned_about(tiny_gpt2_dir, tmp_path):
    """The tiny random model's greedy CLeHe answer is all `<unk>`, which the text leaves out."""
    path = tmp_path / "p.jsonl"
    path.write_text("\n".join(json.dumps({"text": t}) for t in SAMPLE_SENTENCES[:3]) + "\n")
    args = ["generate", "--query", "who wrote hamlet", "--passages", str(path)]
    args += ["--model", str(tiny_gpt2_dir), "--decoding", "clehe", "--max-new-tokens", "3"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["answer"] == ""
    assert res.stderr.strip().splitlines()[-1] == (
        "warning: the answer is empty: its 3 token(s) ('<unk>', '<unk>', '<unk>') are special "
        "tokens or white space, which the answer leaves out"
    )


def test_an_answer_ended_at_once_points_to_the_chat_template(word_tokenizer):
    """SmolLM2-135M-Instruct, given the entropy prompt outside its chat template, answers
    `<|im_end|>` (its EOS) at once: the answer is empty; with --chat it answers."""
    from cisrank.context import Generation

    eos = word_tokenizer.eos_token_id
    ended = Generation(Decoding.NAIVE, "", [eos])
    assert ended.why_empty(word_tokenizer, chat=False) == (
        "the model ended it at once with its end-of-sequence token '<eos>' (an instruct model "
        "answers in its chat template: --chat)"
    )
    assert ended.why_empty(word_tokenizer, chat=True).endswith("end-of-sequence token '<eos>'")
    assert Generation(Decoding.NAIVE, "Hamlet", [5]).why_empty(word_tokenizer, chat=False) is None
