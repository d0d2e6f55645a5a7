"""Local dataset folders: parsing, duplicate collapse, and errors that name the file and line."""

import pytest
from builders import hit, write_folder

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
