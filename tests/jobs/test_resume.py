"""The shard-resume helper of the offline jobs (dense build, prior job, teacher scoring): a shard
folder belongs to one build, and a rerun keeps exactly the shards whose file is complete."""

from __future__ import annotations

import json
import logging

from cisrank.jobs.resume import META_FILE, claim_shard_dir, resume_shards


def test_a_shard_folder_is_kept_only_for_a_resumed_build_of_the_same_meta(tmp_path, caplog):
    shards = tmp_path / "shards"
    meta = {"fingerprint": "abc", "shard_size": 4}
    claim_shard_dir(shards, meta, resume=True)
    assert json.loads((shards / META_FILE).read_text()) == meta
    (shards / "emb-00000.npy").write_bytes(b"done")

    claim_shard_dir(shards, dict(meta), resume=True)  # the same build, resumed: kept
    assert (shards / "emb-00000.npy").exists()

    job_log = logging.getLogger("cisrank.test.job")
    with caplog.at_level(logging.INFO, logger="cisrank.test.job"):
        claim_shard_dir(shards, meta, resume=False, logger=job_log)  # a fresh build: discarded
    assert not (shards / "emb-00000.npy").exists()
    assert [r.name for r in caplog.records] == ["cisrank.test.job"]
    assert "discarding shards of a different build" in caplog.text

    (shards / "emb-00000.npy").write_bytes(b"done")
    other = {**meta, "fingerprint": "xyz"}
    claim_shard_dir(shards, other, resume=True)  # another build: discarded, its meta written
    assert sorted(p.name for p in shards.iterdir()) == [META_FILE]
    assert json.loads((shards / META_FILE).read_text()) == other


def test_a_folder_without_meta_is_not_resumed(tmp_path):
    shards = tmp_path / "shards"
    shards.mkdir()
    (shards / "prior-00000.parquet").write_bytes(b"whose?")
    claim_shard_dir(shards, {"a": 1}, resume=True)
    assert sorted(p.name for p in shards.iterdir()) == [META_FILE]


def test_resume_splits_the_shards_into_kept_and_todo_in_one_streaming_pass():
    complete_files = {0: 3, 2: 2}  # shard 2's file is short: scored again
    asked: list[tuple[int, int]] = []

    def complete(index: int, rows: int) -> bool:
        asked.append((index, rows))
        return complete_files.get(index) == rows

    shards = iter([["a", "b", "c"], ["d", "e", "f"], ["g", "h", "i"], ["j"]])
    plan = resume_shards(shards, len, complete)
    assert asked == [(0, 3), (1, 3), (2, 3), (3, 1)]
    assert next(shards, None) is None  # read once, to the end
    assert plan.sizes == (3, 3, 3, 1) and plan.shards == 4 and plan.rows == 10
    assert plan.todo == ((1, ["d", "e", "f"]), (2, ["g", "h", "i"]), (3, ["j"]))
    assert plan.reused == 1 and plan.done_rows == 3
    assert plan.expected == {1: 3, 2: 3, 3: 1}


def test_resume_of_no_shards_and_of_all_shards_done():
    empty = resume_shards([], len, lambda i, n: False)
    assert (empty.shards, empty.rows, empty.reused, empty.done_rows) == (0, 0, 0, 0)
    assert empty.todo == () and empty.expected == {}

    done = resume_shards([[1, 2], [3]], len, lambda i, n: True)
    assert done.todo == () and done.reused == 2 and done.done_rows == done.rows == 3
