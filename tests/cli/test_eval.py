"""`cisrank eval` as a user runs it, in a subprocess; the one-line errors and the help of every
verb."""

import json

import pytest
from builders import write_mini
from cli.helpers import cli, help_text, main_in_process


@pytest.fixture
def folder(tmp_path):
    return write_mini(tmp_path / "mini")


def test_cli_eval_run_on_folder(folder, tmp_path):
    args = ["eval", "run", "--data-dir", str(folder), "--output", str(tmp_path / "o"), "--json"]
    p = cli(*args)  # q3 is judged and has no candidates: refused by default, named
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert p.stderr.strip().splitlines()[-1] == (
        "error: dataset 'mini': 1 of its 3 judged queries cannot be run: 1 no candidates (q3): "
        "give the topics and candidates of the whole query set, or pass --missing zero (count "
        "them 0, as trec_eval -c does) or --missing skip (evaluate the 2 that can be run)"
    )
    p = cli(*args, "--missing", "zero")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["runs"]["first-stage"]["nDCG@1"] == pytest.approx(1 / 3)
    assert out["judged_not_run"] == {"missing": "zero", "no_topic": [], "no_candidates": ["q3"]}
    p = cli(*args, "--missing", "skip")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["runs"]["first-stage"]["nDCG@1"] == pytest.approx(1 / 2)


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


def test_eval_refuses_unreadable_files_and_a_partial_query_set_in_one_line(
    dl19_dir, tmp_path, monkeypatch, capsys
):
    """Binary qrels or topics were a UnicodeDecodeError traceback, a `.gz` that is not gzip a
    BadGzipFile one; topics cut to 5 of DL19's 43 queries printed "5 queries" and nDCG@10 0.0533
    with exit 0. Each is now exit 2 with one line; the cut set is evaluated when the user asks how
    (`--missing zero`: the same 0.0533, said so)."""
    binary = tmp_path / "binary.txt"
    binary.write_bytes(bytes(range(256)) * 4)
    not_gzip = tmp_path / "topics.tsv.gz"
    not_gzip.write_text("156493\tdo goldfish grow\n")
    gzipped = tmp_path / "qrels-gz"  # gzip bytes under a plain name
    import gzip

    gzipped.write_bytes(gzip.compress((dl19_dir / "qrels.txt").read_bytes()))
    files = {
        "--topics": dl19_dir / "topics.tsv",
        "--qrels": dl19_dir / "qrels.txt",
        "--candidates": dl19_dir / "candidates-bm25-top100.json",
    }
    cases = [
        (
            "--qrels",
            binary,
            f"error: {binary}:2: not a UTF-8 qrels file (byte 0x80 at column 118): give "
            "a UTF-8 text file (is it binary, or in another encoding?)",
        ),
        ("--topics", binary, f"error: {binary}:2: not a UTF-8 topics file"),
        ("--topics", not_gzip, f"error: {not_gzip}: not a readable gzip file (Not a gzipped file"),
        (
            "--qrels",
            gzipped,
            f"error: {gzipped}:1: not a UTF-8 qrels file (byte 0x8b at column 2): it "
            "is gzip-compressed: name it .gz or gunzip it",
        ),
        ("--candidates", not_gzip, f"error: {not_gzip}: not a readable candidates JSON file"),
    ]
    for flag, path, message in cases:
        args = [str(a) for kv in {**files, flag: path}.items() for a in kv]
        run = main_in_process(monkeypatch, capsys, "eval", "run", *args, "-q", "--json")
        assert run.code == 2 and "Traceback" not in run.err, (flag, path, run.err)
        assert run.last_line.startswith(message), (flag, run.last_line)

    cut = tmp_path / "five.tsv"
    cut.write_text("".join((dl19_dir / "topics.tsv").read_text().splitlines(True)[:5]))
    args = [str(a) for kv in {**files, "--topics": cut}.items() for a in kv]
    out = ["--output", str(tmp_path / "out"), "-q", "--json"]
    run = main_in_process(monkeypatch, capsys, "eval", "run", *args, *out)
    assert run.code == 2 and "38 of its 43 judged queries cannot be run" in run.last_line
    run = main_in_process(monkeypatch, capsys, "eval", "run", *args, *out, "--missing", "zero")
    assert run.code == 0, run.err
    report = json.loads(run.out)
    assert round(report["runs"]["first-stage"]["nDCG@10"], 4) == 0.0533
    assert report["judged_not_run"]["missing"] == "zero"
    assert len(report["judged_not_run"]["no_topic"]) == 38
    run = main_in_process(monkeypatch, capsys, "eval", "run", *args, *out, "--missing", "some")
    assert run.code == 2 and run.last_line == (
        "error: --missing 'some': choose one of refuse, zero, skip"
    )


def test_eval_trec_dl19_and_dl21_still_reproduce_their_reference_figures(
    data_root, tmp_path, monkeypatch, capsys
):
    """Every judged query of DL19 (43) and DL21 (53) has a topic and candidates: the default
    (refuse) evaluates them, to the figures of ../shared/data/README.md."""
    for name, ndcg10 in (("trec-dl19", 0.5058), ("trec-dl21", 0.4458)):
        out = ["--data-dir", str(data_root / name), "--output", str(tmp_path / name), "-q"]
        run = main_in_process(monkeypatch, capsys, "eval", name, *out, "--json")
        assert run.code == 0, run.err
        report = json.loads(run.out)
        assert round(report["runs"]["first-stage"]["nDCG@10"], 4) == ndcg10
        assert report["queries_judged"] == report["queries_evaluated"] == report["queries_run"]
        assert "judged_not_run" not in report


def test_hostile_candidates_and_run_files_are_one_line_through_the_cli_and_leave_no_output(
    folder, tmp_path, monkeypatch, capsys
):
    """End to end: `eval run --candidates` with a line of 100,000 nested brackets ended in a
    RecursionError traceback, a 5,000-digit integer in a ValueError one; `eval fuse --run` files had
    no line size cap (a cap of 64 characters here). Each is exit 2, one line naming the file, and no
    --output folder."""
    topics, qrels = folder / "topics.tsv", folder / "qrels.txt"
    out = tmp_path / "out"
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    digits = tmp_path / "digits.json"
    digits.write_text('[{"query": "q", "hits": [{"rank": 1' + "0" * 5000 + "}]}]")
    for path, says in (
        (deep, "JSON nested too deep: at most 64 levels of arrays and objects"),
        (digits, "a JSON integer is too long: at most 4300 digits are read"),
    ):
        args = ["--topics", str(topics), "--qrels", str(qrels), "--candidates", str(path)]
        ran = main_in_process(monkeypatch, capsys, "eval", "run", *args, "-o", str(out), "-q")
        assert ran.code == 2 and "Traceback" not in ran.err, ran.err
        assert ran.last_line.startswith(
            f"error: {path}: not a readable candidates JSON file: {says}"
        ), ran.last_line
        assert not out.exists()
    from cisrank.data import datasets

    monkeypatch.setattr(datasets, "MAX_JSON_LINE_BYTES", 64)
    run = tmp_path / "dense.trec"
    run.write_text("q1 Q0 a 1 2.0 t\nq1 Q0 b 2 1.0 " + "t" * 80 + "\n")
    args = ["--run", f"dense={run}", "--fuse", "dense:1", "-o", str(out), "--missing", "skip"]
    ran = main_in_process(monkeypatch, capsys, "eval", "fuse", str(folder), *args)
    assert ran.code == 2 and "Traceback" not in ran.err, ran.err
    assert ran.last_line == (
        f"error: {run}:2: a line over 64 characters, the limit of a line of a run file"
    )
    assert not out.exists()
