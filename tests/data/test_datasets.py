"""Local dataset folders: parsing, duplicate collapse, and errors that name the file and line."""

import json
import re
import types

import pytest
from builders import hit, write_folder

from cisrank.data import datasets
from cisrank.data.datasets import load_folder, load_named
from cisrank.errors import DataError


@pytest.mark.parametrize("gz", [False, True])
def test_load_folder_reads_all_three_files(tmp_path, gz):
    folder = write_folder(
        tmp_path / "ds",
        {("q1", "first query"): [hit("d2", 2, 1.0, "two"), hit("d1", 1, 2.0, "one")]},
        gz=gz,
    )
    ds = load_folder(folder)
    assert ds.name == "ds"
    assert ds.topics == {"q1": "first query"}
    assert ds.qrels == {"q1": {"d1": 2}}
    assert [h.docid for h in ds.candidates["q1"]] == ["d1", "d2"]  # sorted by rank
    assert ds.passages() == {"d1": "one", "d2": "two"}


def test_duplicate_candidates_are_collapsed_and_reported(tmp_path):
    folder = write_folder(
        tmp_path / "ds", {("q1", "x"): [hit("d1", 1, 3.0), hit("d1", 2, 2.0), hit("d2", 3, 1.0)]}
    )
    ds = load_folder(folder)
    assert [h.docid for h in ds.candidates["q1"]] == ["d1", "d2"]
    assert ds.notes and "1 duplicate" in ds.notes[0]


def test_topics_fall_back_to_candidate_queries(tmp_path):
    folder = write_folder(
        tmp_path / "ds", {("q1", "from candidates"): [hit("d1", 1, 1.0)]}, topics=None
    )
    assert load_folder(folder).topics == {"q1": "from candidates"}


def test_malformed_qrels_name_the_line(tmp_path):
    folder = write_folder(
        tmp_path / "ds", {("q1", "x"): [hit("d1", 1, 1.0)]}, qrels="q1 Q0 d1 2\nq1 d2 1\n"
    )
    with pytest.raises(DataError, match=r"qrels.txt:2: expected 'qid Q0 docid grade'"):
        load_folder(folder)


def test_bad_grade_and_bad_json(tmp_path):
    folder = write_folder(
        tmp_path / "a", {("q1", "x"): [hit("d1", 1, 1.0)]}, qrels="q1 Q0 d1 high\n"
    )
    with pytest.raises(DataError, match=r"qrels.txt:1: grade 'high' is not an integer"):
        load_folder(folder)
    folder = tmp_path / "b"
    folder.mkdir()
    (folder / "candidates-bm25-top100.json").write_text("[{not json")
    with pytest.raises(DataError, match="not a readable candidates JSON"):
        load_folder(folder)


def test_missing_folder_and_unknown_name(tmp_path, monkeypatch):
    with pytest.raises(DataError, match="does not exist"):
        load_folder(tmp_path / "nope")
    monkeypatch.setenv("CISRANK_DATA_DIR", str(tmp_path))
    with pytest.raises(DataError, match="unknown dataset 'mystery'"):
        load_named("mystery")


def test_real_dl19_folder(dl19_dir):
    ds = load_folder(dl19_dir)
    assert len(ds.qids) == 43
    assert sum(len(h) for h in ds.candidates.values()) == 4300
    assert len(ds.passages()) == 4297
    assert sum(len(j) for j in ds.qrels.values()) == 9260


@pytest.mark.parametrize(
    ("hits", "message"),
    [
        ([{"docid": "d1", "rank": 1, "score": 1.0, "qid": "q1"}], "without field 'content'"),
        ([dict(hit("d1", 1, None), qid="q1")], "score None or rank 1 is not a number"),
        ([dict(hit("d1", "first", 1.0), qid="q1")], "rank 'first' is not a number"),
        ([dict(hit("d1", 1, 1.0, text=None), qid="q1")], "content is not a string"),
        (["d1"], "first hit has no 'qid'"),
        ({"qid": "q1"}, "'hits' is not an array"),
    ],
)
def test_malformed_candidates_are_one_line_data_errors(tmp_path, hits, message):
    folder = tmp_path / "ds"
    folder.mkdir()
    payload = [{"query": "x", "hits": hits}]
    (folder / "candidates-bm25-top100.json").write_text(json.dumps(payload))
    (folder / "qrels.txt").write_text("q1 Q0 d1 1\n")
    with pytest.raises(DataError, match=r"entry 0 is malformed \(.*" + re.escape(message)) as info:
        load_folder(folder)
    assert info.value.__cause__ is None and info.value.__suppress_context__


def test_a_bug_while_reading_candidates_keeps_its_traceback(tmp_path, monkeypatch):
    """A TypeError raised by our own code is a bug, not a data error: it must not be reworded."""
    folder = write_folder(tmp_path / "ds", {("q1", "x"): [hit("d1", 1, 1.0)]})

    def broken_hit(*args, **kwargs):
        raise TypeError("Hit() got an unexpected keyword argument")

    monkeypatch.setattr(datasets, "Hit", broken_hit)
    with pytest.raises(TypeError, match="unexpected keyword argument"):
        load_folder(folder)


class _FakeIrDatasets:
    """Stands in for the ir_datasets module: `load` returns a dataset whose docs store fails."""

    def __init__(self, failure):
        self.failure = failure

    def load(self, dataset_id):
        failure = self.failure
        query = types.SimpleNamespace(query_id="q1", text="query")
        qrel = types.SimpleNamespace(query_id="q1", doc_id="d1", relevance=1)
        scored = types.SimpleNamespace(query_id="q1", doc_id="d1", score=1.0)

        class Store:
            def get_many(self, ids):
                raise failure

        return types.SimpleNamespace(
            queries_iter=lambda: [query],
            qrels_iter=lambda: [qrel],
            scoreddocs_iter=lambda: [scored],
            docs_store=Store,
        )


def test_ir_datasets_download_failure_is_a_data_error(monkeypatch):
    fake = _FakeIrDatasets(ConnectionError("no network"))
    monkeypatch.setattr(datasets, "require", lambda *args: fake)
    with pytest.raises(DataError, match=r"could not load 'x/y' \(ConnectionError: no network\)"):
        datasets.load_ir_datasets("x", "x/y")


def test_ir_datasets_bug_is_not_a_data_error(monkeypatch):
    fake = _FakeIrDatasets(TypeError("unhashable type: 'list'"))
    monkeypatch.setattr(datasets, "require", lambda *args: fake)
    with pytest.raises(TypeError, match="unhashable type"):
        datasets.load_ir_datasets("x", "x/y")


@pytest.mark.parametrize("data_dir_set", [False, True])
def test_no_local_folder_and_no_ir_datasets_says_set_the_data_dir_first(
    tmp_path, monkeypatch, data_dir_set
):
    """Without a local copy the first fix is CISRANK_DATA_DIR (or --data-dir); installing
    ir_datasets to download the set comes after, not before."""
    if data_dir_set:
        monkeypatch.setenv("CISRANK_DATA_DIR", str(tmp_path))
    else:
        monkeypatch.delenv("CISRANK_DATA_DIR", raising=False)
    real_find_spec = datasets.importlib.util.find_spec
    monkeypatch.setattr(
        datasets.importlib.util,
        "find_spec",
        lambda name, *a: None if name == "ir_datasets" else real_find_spec(name, *a),
    )
    with pytest.raises(DataError) as err:
        load_named("trec-dl19")
    message = str(err.value)
    assert message.index("set CISRANK_DATA_DIR") < message.index("pip install")
    assert "--data-dir" in message and "trec-dl19/" in message
    where = f"{tmp_path / 'trec-dl19'} does not exist" if data_dir_set else "is not set"
    assert where in message
