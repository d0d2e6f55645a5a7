"""The one shard runner: the dense build, the prior job and teacher scoring write, on every engine,
the bytes they wrote when each ran its own shard loop.

The reference (`tests/shard_outputs.json`) was built at 588e04d, before the runner, on the exact
models of `cisrank.testing` (integer embeddings and log-probabilities, scores read from a file),
so it holds on any CPU; `tests/shard_outputs.py` says what is compared. The real-model jobs'
local and Ray outputs are compared to each other in tests/indexes/test_ray_jobs.py."""

from __future__ import annotations

import json

import pytest
from shard_outputs import CASES, REFERENCE, build, summarize

from cisrank.jobs.ray import Engine
from cisrank.jobs.shards import Progress, Shards, ShardWriter, run_shards


def _compare(root, cases):
    reference = json.loads(REFERENCE.read_text())
    for case in cases:
        assert summarize(root / case, root) == reference[case], case


def test_every_job_writes_what_it_wrote_before_locally(tmp_path):
    build(tmp_path, engines=("local",))
    _compare(tmp_path, [c for c in CASES if not c.endswith("-ray")])


def test_every_job_writes_what_it_wrote_before_on_ray(tmp_path, ray_cluster):
    build(tmp_path, engines=("ray",))
    _compare(tmp_path, [c for c in CASES if c.endswith("-ray")])


class _Squares:
    """A job whose block is a list of ints and whose result is their squares."""

    def __init__(self) -> None:
        self.loads = 0

    def load(self):
        self.loads += 1
        return "model"

    def describe(self, state):
        return {"model": state}

    def score(self, state, block):
        return [x * x for x in block]


def _plan(folder, shards):
    def complete(i, rows):
        path = folder / f"{i}.txt"
        return path.is_file() and len(path.read_text().split()) == rows

    def plan(info):
        return Shards(
            items=shards,
            rows=len,
            block=lambda i, item: item,
            complete=complete,
            folder=folder,
            meta={"info": info},
        )

    return plan


def _writer(folder):
    return ShardWriter(lambda i: folder / f"{i}.txt", lambda i, r: " ".join(map(str, r)).encode())


def test_a_rerun_scores_only_the_missing_shards_and_another_build_starts_clean(tmp_path):
    shards = [[1, 2], [3], [4, 5, 6]]
    folder = tmp_path / "shards"
    args = {"engine": Engine.LOCAL, "progress": Progress("t", "row", False)}
    first = _Squares()
    run = run_shards(first, _plan(folder, shards), _writer(folder), resume=True, **args)
    assert (run.shards, run.reused, run.scored, run.rows) == (3, 0, 3, 6)
    assert [(folder / f"{i}.txt").read_text() for i in range(3)] == ["1 4", "9", "16 25 36"]
    (folder / "1.txt").unlink()
    again = _Squares()
    run = run_shards(again, _plan(folder, shards), _writer(folder), resume=True, **args)
    assert (run.reused, run.scored) == (2, 1) and (folder / "1.txt").read_text() == "9"
    # all written: the model is described but, with `describe`, never loaded
    lazy = _Squares()
    run = run_shards(
        lazy,
        _plan(folder, shards),
        _writer(folder),
        resume=True,
        describe=lambda: {"model": "model"},
        **args,
    )
    assert (run.reused, run.scored, lazy.loads) == (3, 0, 0)
    # without resume (or with another description) the shards are discarded
    run = run_shards(_Squares(), _plan(folder, shards), _writer(folder), resume=False, **args)
    assert (run.reused, run.scored) == (0, 3)


def test_a_failing_shard_keeps_the_shards_written_before_it(tmp_path):
    class FailsOnNine(_Squares):
        def score(self, state, block):
            if 3 in block:
                raise RuntimeError("boom")
            return super().score(state, block)

    folder = tmp_path / "shards"
    plan = _plan(folder, [[1, 2], [3], [4]])
    with pytest.raises(RuntimeError, match="boom"):
        run_shards(FailsOnNine(), plan, _writer(folder), engine=Engine.LOCAL, resume=True,
                   progress=Progress("t", "row", False))  # fmt: skip
    assert sorted(p.name for p in folder.iterdir()) == ["0.txt", "meta.json"]
