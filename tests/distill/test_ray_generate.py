"""`distill generate --engine ray`: the teacher rows of a local run, from a Ray actor pool that
builds the teacher once per actor; a worker killed midway leaves whole shards only, and a rerun
scores only the missing ones."""

from __future__ import annotations

import json
import shutil
from functools import partial

import pytest

from cisrank import testing
from cisrank.distill import rows as R
from cisrank.distill.generate import generate
from cisrank.distill.sources import load_source
from cisrank.distill.teachers import TeacherSpec
from cisrank.errors import DataError
from cisrank.jobs.ray import RayOptions

pytestmark = pytest.mark.timeout(240)


def _scored(log) -> list[int]:
    return sorted(int(x) for x in log.read_text().split()) if log.exists() else []


def test_ray_teacher_rows_equal_local_ones_and_a_rerun_scores_only_missing_shards(
    data_sets, tiny_gpt2_dir, tmp_path, ray_cluster
):
    """A run cut short (its state file and two of its four shards left, as a killed local or Ray
    run leaves them) is finished by --engine ray, which scores only the other two shards; the
    rows are the local run's, every column and value. (Killed workers and drivers are tested on
    the prior job: the Ray engine code is shared.)"""
    source = load_source(dataset="trec-dl22", data_dir=data_sets / "trec-dl22", depth=4)
    spec = TeacherSpec.of("cis", str(tiny_gpt2_dir), template="qa")
    local = generate(source, spec, tmp_path / "local", shard_pairs=4, progress=False)
    assert local.manifest["shards"] == 4

    out, log = tmp_path / "ray", tmp_path / "scored.log"
    out.mkdir()
    state = json.loads((tmp_path / "local" / R.MANIFEST).read_text())["identity"]
    R.write_json(out / R.STATE, {"identity": state, "started": 0.0})
    for i in (0, 2):
        shutil.copy(R.shard_path(tmp_path / "local", i), R.shard_path(out, i))
    with pytest.raises(DataError, match="did not finish"):
        R.read_rows(out)

    res = generate(
        source,
        spec,
        out,
        shard_pairs=4,
        progress=False,
        engine="ray",
        ray=RayOptions(actors=1, num_cpus=2),  # the local run's 2 torch threads: equal bits
        job_wrapper=partial(testing.CountingJob, log=log),
    )
    assert _scored(log) == [1, 3]
    assert res.shards_reused == 2 and res.shards_written == 2
    assert res.manifest["identity"] == local.manifest["identity"]  # the same teacher, described
    assert res.manifest["engine"] == "ray"
    ray_rows = R.read_rows(out).to_pylist()
    local_rows = R.read_rows(tmp_path / "local").to_pylist()
    assert ray_rows == local_rows  # every column, every value: the same teacher rows


def test_ray_generate_needs_a_teacher_spec(data_sets, tiny_gpt2_dir, tmp_path, monkeypatch):
    from cisrank.distill.teachers import ScoresFileTeacher
    from cisrank.errors import CisrankError

    source = load_source(dataset="trec-dl22", data_dir=data_sets / "trec-dl22", depth=2)
    run = tmp_path / "run.trec"
    run.write_text(
        "".join(
            f"{q.qid} Q0 {d} {r} {1.0 / r} t\n"
            for q in source.queries
            for d, r in zip(q.docids, q.ranks, strict=True)
        )
    )
    with pytest.raises(CisrankError, match="spec"):
        generate(source, ScoresFileTeacher(run), tmp_path / "o", engine="ray", progress=False)
