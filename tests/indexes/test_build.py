"""Build jobs: manifests written last, refusal to clobber, clean restarts, and a dense build that is
really killed midway (SIGKILL after its first shard) and then resumed."""

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from cisrank.cli import app
from cisrank.errors import CisrankError, DataError
from cisrank.indexes import build as build_mod
from cisrank.indexes.build import STATE_FILE, build_index
from cisrank.data.manifest import MANIFEST_FILE, read_manifest, write_manifest
from cisrank.indexes.kinds import open_index

ROWS = [
    ("p1", "the quick brown fox jumps over the lazy dog"),
    ("p2", "a fox is a small wild animal"),
    ("p3", "dogs are loyal animals and good friends"),
    ("p4", "the weather today is sunny and warm"),
    ("p5", "quick brown dogs run in the park"),
    ("p6", "cats sleep most of the day"),
    ("p7", "the park has a small lake"),
]


@pytest.fixture
def corpus(tmp_path) -> Path:
    p = tmp_path / "corpus.jsonl"
    p.write_text("".join(json.dumps({"id": d, "text": t}) + "\n" for d, t in ROWS))
    return p


def test_bm25_manifest_and_index_info(tmp_path, corpus):
    out = tmp_path / "idx"
    m = build_index("bm25", corpus, out, {"k1": 1.1}, progress=False)
    on_disk = read_manifest(out)
    assert on_disk.to_json() == json.loads((out / MANIFEST_FILE).read_text())
    assert on_disk.kind == "bm25"
    assert on_disk.params["k1"] == 1.1 and on_disk.params["b"] == 0.4
    assert on_disk.params["stemmer"] == "porter"
    assert on_disk.corpus["sha256"] == hashlib.sha256(corpus.read_bytes()).hexdigest()
    assert on_disk.corpus["size_bytes"] == corpus.stat().st_size
    assert on_disk.corpus["passages"] == len(ROWS)
    assert on_disk.libraries["bm25s"] and on_disk.libraries["cisrank"]
    assert on_disk.build["finished_at"] and on_disk.build["resumed"] is False
    assert all((out / f).exists() for f in m.files)
    assert not (out / STATE_FILE).exists()
    res = CliRunner().invoke(app, ["index", "info", str(out)])
    assert res.exit_code == 0, res.output
    assert "kind      bm25" in res.output and "7 passages" in res.output
    res = CliRunner().invoke(app, ["index", "info", str(out), "--json"])
    assert json.loads(res.stdout)["params"]["k1"] == 1.1


def test_refuses_to_clobber(tmp_path, corpus):
    out = tmp_path / "idx"
    build_index("bm25", corpus, out, progress=False)
    with pytest.raises(CisrankError, match="already holds a complete index"):
        build_index("bm25", corpus, out, progress=False)
    m = build_index("bm25", corpus, out, {"b": 0.5}, overwrite=True, progress=False)
    assert m.params["b"] == 0.5
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    with pytest.raises(CisrankError, match="not a cisrank index folder"):
        build_index("bm25", corpus, foreign, progress=False)
    assert (foreign / "notes.txt").read_text() == "keep me"


def test_interrupted_bm25_build_looks_incomplete_then_restarts(tmp_path, corpus, monkeypatch):
    out = tmp_path / "idx"

    def boom(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr("cisrank.retrieval.bm25.write_docstore", boom)
    with pytest.raises(KeyboardInterrupt):
        build_index("bm25", corpus, out, progress=False)
    assert not (out / MANIFEST_FILE).exists() and (out / STATE_FILE).exists()
    with pytest.raises(DataError, match="not a complete index"):
        open_index(out)
    monkeypatch.undo()
    m = build_index("bm25", corpus, out, progress=False)
    assert m.build["resumed"] is True
    assert [h.docid for h in open_index(out).search("brown fox", 2)] == ["p1", "p2"]


def test_bad_corpus_fails_before_touching_anything_else(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "text": "ok"}\n{"id": "a", "text": "dup"}\n')
    with pytest.raises(DataError, match=r"bad\.jsonl:2: duplicate passage id 'a'"):
        build_index("bm25", bad, tmp_path / "idx", progress=False)
    assert not (tmp_path / "idx" / MANIFEST_FILE).exists()
    res = CliRunner().invoke(
        app,
        [
            "index",
            "build",
            "bm25",
            "--corpus",
            str(bad),
            "--out",
            str(tmp_path / "i2"),
            "--on-error",
            "skip",
            "-q",
        ],
    )
    assert res.exit_code == 0, res.output
    assert "1 bad lines skipped" in res.output
    assert read_manifest(tmp_path / "i2").corpus["skipped"] == {"duplicate_id": 1}


def test_cli_errors_are_one_line_exit_2(tmp_path):
    res = subprocess.run(
        [sys.executable, "-m", "cisrank.cli", "index", "info", str(tmp_path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert res.returncode == 2
    assert res.stderr.strip().startswith("error: ") and "not a complete index" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1


_KILLABLE = """
import sys, time
import sentence_transformers
orig = sentence_transformers.SentenceTransformer.encode
calls = []
def encode(self, *a, **k):
    calls.append(1)
    if len(calls) > 1:  # park inside the second shard until killed
        time.sleep(600)
    return orig(self, *a, **k)
sentence_transformers.SentenceTransformer.encode = encode
from cisrank.indexes.build import build_index
build_index("dense", sys.argv[1], sys.argv[2], {"model": sys.argv[3], "shard_size": 3}, progress=False)
"""


def test_dense_build_killed_midway_resumes(tmp_path, corpus, tiny_bert_dir, monkeypatch):
    out = tmp_path / "dense"
    proc = subprocess.Popen(
        [sys.executable, "-c", _KILLABLE, str(corpus), str(out), str(tiny_bert_dir)],
        env={**os.environ, "TOKENIZERS_PARALLELISM": "false"},
    )
    first = out / "shards" / "emb-00000.npy"
    deadline = time.monotonic() + 300
    while not first.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert first.exists(), "the build never finished its first shard"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert not (out / MANIFEST_FILE).exists()
    assert not (out / "shards" / "emb-00001.npy").exists()
    with pytest.raises(DataError, match="not a complete index"):
        open_index(out)

    import sentence_transformers

    orig = sentence_transformers.SentenceTransformer.encode
    encoded: list[int] = []

    def counting(self, texts, *a, **k):
        encoded.append(len(texts))
        return orig(self, texts, *a, **k)

    monkeypatch.setattr(sentence_transformers.SentenceTransformer, "encode", counting)
    params = {"model": str(tiny_bert_dir), "shard_size": 3}
    m = build_index("dense", corpus, out, params, progress=False)
    assert m.build["resumed"] is True and m.build["shards_reused"] == 1 and m.build["shards"] == 3
    assert encoded == [3, 1]  # shards 1 and 2 only: 7 passages = 3 + 3 + 1
    assert not (out / "shards").exists()
    assert m.model["fingerprint"] and m.model["dimension"] == 64

    clean = build_index("dense", corpus, tmp_path / "clean", params, progress=False)
    assert clean.build["resumed"] is False
    np.testing.assert_allclose(
        np.load(out / "embeddings.npy"), np.load(tmp_path / "clean" / "embeddings.npy"), atol=1e-5
    )
    # exact inner-product search equals brute force over the stored embeddings (random weights
    # give near-tied scores, so compare scores, and each hit's score with its own embedding)
    r = open_index(out)
    emb = np.load(out / "embeddings.npy")
    full = emb @ r.embed_queries(["quick brown fox"])[0]
    hits = r.search("quick brown fox", 4)
    assert [h.score for h in hits] == pytest.approx(sorted(full, reverse=True)[:4], abs=1e-5)
    row = {d: i for i, (d, _) in enumerate(ROWS)}
    assert [h.score for h in hits] == pytest.approx([full[row[h.docid]] for h in hits], abs=1e-5)
    assert hits[0].text == ROWS[row[hits[0].docid]][1]


@pytest.mark.parametrize("index_type", ["hnsw", "ivf"])
def test_approximate_dense_indexes_find_the_exact_top1(tmp_path, corpus, tiny_bert_dir, index_type):
    params = {"model": str(tiny_bert_dir), "index_type": index_type, "ivf_nprobe": 4}
    build_index("dense", corpus, tmp_path / "a", params, progress=False)
    r = open_index(tmp_path / "a")
    emb = np.load(tmp_path / "a" / "embeddings.npy")
    for text in ("the park", "small wild animal", "sunny weather"):
        full = emb @ r.embed_queries([text])[0]
        hit = r.search(text, 1)[0]
        assert hit.score == pytest.approx(float(full.max()), abs=1e-5)
        assert hit.score == pytest.approx(
            float(full[[d for d, _ in ROWS].index(hit.docid)]), abs=1e-5
        )


def test_unknown_kind_and_a_non_retriever_kind(tmp_path, corpus):
    with pytest.raises(CisrankError, match="unknown index kind 'colbert'"):
        build_index("colbert", corpus, tmp_path / "x")
    assert set(build_mod.builder_kinds()) >= {"bm25", "lucene", "dense"}
    out = tmp_path / "idx"
    m = build_index("bm25", corpus, out, progress=False)
    m.kind = "prior"  # a prior store is an index folder too, but nothing to search
    write_manifest(out, m)  # rewritten through the writer: its digest matches its content
    with pytest.raises(CisrankError, match="is a prior index, which is not a retriever"):
        open_index(out)


_KILLABLE_OVERWRITE = """
import sys, time
from pathlib import Path
import cisrank.retrieval.bm25 as bm25
marker = Path(sys.argv[1])
def parked(*a, **k):  # the bm25s arrays of the new index are written: park until killed
    marker.write_text("parked")
    time.sleep(600)
bm25.write_docstore = parked
from cisrank.cli import main
sys.argv = ["cisrank", *sys.argv[2:]]
main()
"""


def test_overwrite_killed_midway_keeps_the_old_index_live(tmp_path, corpus):
    """kill -9 of a real `cisrank index build --overwrite` midway: the old index still opens,
    verifies and answers; a completed overwrite leaves the new index and no temp folder."""
    out = tmp_path / "idx"
    build_index("bm25", corpus, out, progress=False)
    before = [h.docid for h in open_index(out).search("brown fox", 3)]
    marker = tmp_path / "parked"
    args = ["index", "build", "bm25", "--corpus", str(corpus), "--out", str(out)]
    args += ["--b", "0.75", "--overwrite", "-q"]
    proc = subprocess.Popen([sys.executable, "-c", _KILLABLE_OVERWRITE, str(marker), *args])
    deadline = time.monotonic() + 120
    while not marker.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert marker.exists(), "the overwrite never reached its docstore"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL

    # the old index is live and whole: same manifest, every checksum, same answers
    assert read_manifest(out).params["b"] == 0.4
    assert [h.docid for h in open_index(out).search("brown fox", 3)] == before
    res = CliRunner().invoke(app, ["index", "verify", str(out)])
    assert res.exit_code == 0 and "intact" in res.output, res.output
    staging = build_mod.staging_folder(out)
    assert (staging / STATE_FILE).exists()  # the interrupted overwrite waits there
    with pytest.raises(CisrankError, match="interrupted --overwrite build waits"):
        build_index("bm25", corpus, out, {"b": 0.75}, progress=False)

    m = build_index("bm25", corpus, out, {"b": 0.75}, overwrite=True, progress=False)
    assert m.build["resumed"] is True and read_manifest(out).params["b"] == 0.75
    assert [h.docid for h in open_index(out).search("brown fox", 3)][:1] == ["p1"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus.jsonl", "idx", "parked"]
    assert not (out / STATE_FILE).exists()


def test_overwrite_swaps_a_complete_index_in_and_leaves_nothing_behind(
    tmp_path, corpus, monkeypatch
):
    out = tmp_path / "idx"
    build_index("bm25", corpus, out, progress=False)
    inode = out.stat().st_ino
    m = build_index("bm25", corpus, out, {"b": 0.5}, overwrite=True, progress=False)
    assert m.build["resumed"] is False and read_manifest(out).params["b"] == 0.5
    assert out.stat().st_ino != inode  # a new folder swapped in, not the old one rewritten
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus.jsonl", "idx"]
    # without an atomic exchange (other platforms): two renames, same result
    monkeypatch.setattr(build_mod, "exchange_folders", lambda a, b: False)
    build_index("bm25", corpus, out, {"b": 0.6}, overwrite=True, progress=False)
    assert read_manifest(out).params["b"] == 0.6
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus.jsonl", "idx"]
