"""`cisrank eval` as a user runs it, in a subprocess; the one-line errors and the help of every
verb."""

import json

import pytest
from builders import write_mini
from cli.helpers import cli, help_text


@pytest.fixture
def folder(tmp_path):
    return write_mini(tmp_path / "mini")


def test_cli_eval_run_on_folder(folder, tmp_path):
    p = cli("eval", "run", "--data-dir", str(folder), "--output", str(tmp_path / "o"), "--json")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["runs"]["first-stage"]["nDCG@1"] == pytest.approx(1 / 3)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["eval", "run", "--data-dir", "/no/such/dir"],
            "error: data folder '/no/such/dir' does not exist",
        ),
        (["eval", "trec-dl19", "--reranker", "bogus"], "error: unknown reranker 'bogus'"),
        (["eval", "run"], "error: give --data-dir DIR"),
        (
            ["rerank", "--query", "q", "--passages", "/no/file"],
            "error: passages file '/no/file' does not exist",
        ),
    ],
)
def test_cli_errors_are_one_line(args, message):
    p = cli(*args)
    assert p.returncode == 2
    assert p.stderr.strip().splitlines()[-1].startswith(message)
    assert "Traceback" not in p.stderr


@pytest.mark.parametrize(
    "verb",
    [
        [],
        ["eval"],
        ["eval", "trec-dl19"],
        ["eval", "trec-dl21"],
        ["eval", "run"],
        ["rerank"],
        ["version"],
    ],
)
def test_cli_help(verb):
    p = cli(*verb, "--help")
    assert p.returncode == 0 and "Usage" in p.stdout
    doc = p.stdout.lower()
    assert any(word in doc for word in ("evaluate", "rank", "version", "retrieval"))


def test_candidates_help_describes_the_file_not_a_path_of_this_machine():
    out = " ".join(help_text("eval", "run").split())
    assert "shared/data" not in out
    assert "[{query, hits: [{qid, docid, rank, score, content}]}]" in out
