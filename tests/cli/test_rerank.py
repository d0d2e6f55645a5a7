"""`cisrank rerank`: a file of passages ranked for one query, and its help and errors."""

import json

from cli.helpers import cli, help_text


def test_cli_rerank_dense(tiny_bert_dir, tmp_path):
    passages = tmp_path / "p.jsonl"
    passages.write_text(
        '{"id": "x", "text": "Paris is the capital of France."}\n{"text": "Hamlet is a tragedy."}\n'
    )
    p = cli(
        "rerank",
        "--reranker",
        "dense",
        "--model",
        str(tiny_bert_dir),
        "--query",
        "capital of France",
        "--passages",
        str(passages),
        "--json",
    )
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert {r["id"] for r in out["results"]} == {"x", "1"}
    assert out["results"][0]["score"] >= out["results"][1]["score"]
    # transformers' own "Loading weights" bars (two of them) stay out of cisrank's output
    assert "Loading weights" not in p.stderr and "it/s" not in p.stderr, p.stderr


def _rerank(tmp_path, *args: str, lines: tuple[str, ...] = ("a passage",)):
    passages = tmp_path / "p.jsonl"
    passages.write_text("\n".join(lines) + "\n")
    return cli("rerank", "--query", "q", "--passages", str(passages), *args)


def _last_line(p) -> str:
    assert "Traceback" not in p.stderr, p.stderr
    return p.stderr.strip().splitlines()[-1]


def test_reranker_help_names_every_kind_and_no_first_stage():
    row = next(line for line in help_text("rerank").splitlines() if "--reranker" in line)
    assert "first-stage" not in row and "..." not in row
    assert "cis, cross-encoder, dense, hybrid" in row
    assert "first-stage candidates" in help_text("eval", "run")  # eval has a first stage


def test_no_reranker_names_the_kinds_to_choose(tmp_path):
    p = _rerank(tmp_path, "--reranker", "none")
    assert p.returncode == 2
    assert (
        _last_line(p)
        == "error: `rerank` needs a reranker: --reranker cis, cross-encoder, dense, hybrid, student"
    )


def test_a_broken_json_line_says_so_with_line_and_column(tmp_path):
    lines = ('{"text": "fine"}', '{"text": "broken", }')
    p = _rerank(tmp_path, "-r", "dense", lines=lines)
    assert p.returncode == 2
    last = _last_line(p)
    assert last.endswith(
        "p.jsonl:2: invalid JSON (Expecting property name enclosed in double quotes at column 20)"
    ), last
    p = _rerank(tmp_path, "-r", "dense", lines=('{"title": "no text"}',))
    assert _last_line(p).endswith("p.jsonl:1: expected a JSON object with a 'text' field")


def test_another_kinds_flag_is_refused_naming_flags_not_fields(tmp_path):
    p = _rerank(tmp_path, "-r", "dense", "--estimator", "reverse")
    last = _last_line(p)
    assert p.returncode == 2 and "--estimator: option(s) of the cis reranker, not of dense" in last
    assert last.endswith("(dense takes --passage-cache-mb, --backend, --dtype)")
    p = _rerank(tmp_path, "-r", "cis", "--quantize", "int8")
    last = _last_line(p)
    assert "--quantize: option(s) of the cross-encoder reranker, not of cis" in last
    assert "cis takes --estimator, --template, --reverse-template, --max-doc-tokens" in last
    assert "max_doc_tokens" not in last and "batch_size" not in last


def test_a_hostile_passages_file_is_one_line_naming_its_line(tmp_path):
    """`rerank --passages` read the whole file with `read_text`: a byte that is not UTF-8 was a
    UnicodeDecodeError traceback, and a line had no size cap. Each is one line naming `file:line`
    and exit 2, before any model loads."""
    passages = tmp_path / "p.jsonl"
    passages.write_bytes(b'{"text": "fine"}\n{"text": "caf\xe9"}\n')
    p = cli("rerank", "-r", "dense", "--query", "q", "--passages", str(passages))
    assert p.returncode == 2
    assert _last_line(p) == (
        f"error: {passages}:2: not UTF-8 (byte 0xe9 at column 14): give the passages file as UTF-8"
    )


def test_a_long_passage_is_ranked_by_its_best_window_as_the_library_ranks_it(
    tiny_bert_dir, tmp_path
):
    """`cisrank rerank` chunks as `cisrank serve` does: a passage over the window is scored by
    its best window, the span and the windows counted in the JSON, the scores the library's."""
    from cisrank.rerank import load_reranker
    from cisrank.rerank.chunking import Chunking

    long = " ".join(["the weather in spring is mild and wet"] * 6) + " paris is the capital"
    texts = [long, "Hamlet is a tragedy."]
    passages = tmp_path / "p.jsonl"
    passages.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    query = "capital of France"
    p = cli(
        "rerank", "--reranker", "dense", "--model", str(tiny_bert_dir), "--query", query,
        "--passages", str(passages), "--chunk-window-tokens", "8", "--chunk-overlap-tokens", "2",
        "--json",
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    chunking = Chunking(window_tokens=8, overlap_tokens=2)
    reranker = load_reranker("dense", str(tiny_bert_dir))
    want = reranker.rank(query, texts, chunking=chunking)
    assert [r["index"] for r in out["results"]] == [w.index for w in want]
    for got, w in zip(out["results"], want, strict=True):
        assert abs(got["score"] - w.score) < 1e-5
        assert got["best_chunk"]["start"] == w.best_chunk.start
        assert got["best_chunk"]["end"] == w.best_chunk.end
    assert out["chunks"]["chunked_documents"] == 1
    assert out["chunks"]["windows_scored"] == want.chunks.windows_scored > 2
