"""`--engine ray` of the prior job and the dense build, on a local Ray cluster of 2 CPUs and tiny
models: the same outputs as `--engine local`, a killed worker or driver leaves only complete shards
(and no manifest), a rerun scores only the missing shards, and the Parquet prior table gives the
CIS reranker the same scores as the SQLite store."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from cisrank import testing
from cisrank.cli import app
from cisrank.data.manifest import MANIFEST_FILE, read_manifest
from cisrank.errors import CisrankError, DataError
from cisrank.indexes.build import build_index
from cisrank.indexes.integrity import verify_index
from cisrank.indexes.prior import PRIOR_FILE
from cisrank.jobs.ray import RayOptions
from cisrank.rerank.cis import CISReranker
from cisrank.rerank.prior_store import PriorStore
from cisrank.rerank.prior_table import TABLE_FILE, PriorTable, TieredPriors, open_prior_store

S = testing.SAMPLE_SENTENCES
# 20 passages, 19 distinct contents (the last repeats the first under another id)
ROWS = [{"id": f"p{i}", "text": s} for i, s in enumerate(S)]
ROWS += [{"id": f"c{i}", "text": f"{S[i]} {S[(3 * i + 1) % len(S)]}"} for i in range(9)]
ROWS.append({"id": "dup", "text": S[0]})
TEXTS = [r["text"] for r in ROWS]
SHARD = 4  # passages per shard: 5 shards
BATCH = 4  # the local job's batch: the same engine batches as one Ray shard
QUERY = "When was the author of Hamlet born?"

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    p = tmp_path_factory.mktemp("corpus") / "corpus.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return p


@pytest.fixture(scope="module")
def local_prior(corpus, tiny_gpt2_dir, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("local") / "prior"
    build_index(
        "prior",
        corpus,
        out,
        {"model": str(tiny_gpt2_dir)},
        progress=False,
        options={"batch_size": BATCH},
    )
    return out


# One actor of 2 CPUs: torch then runs the 2 threads of the local job, which makes the values
# bit-identical (summation order depends on the thread count: about 1e-7 apart otherwise).
ONE_ACTOR = RayOptions(actors=1, num_cpus=2)


def _ray_prior(corpus, model, out, ray_cluster, **options):
    opts = {"engine": "ray", "shard_size": SHARD, "batch_size": BATCH, **options}
    opts.setdefault("ray", ONE_ACTOR)
    return build_index("prior", corpus, out, {"model": str(model)}, progress=False, options=opts)


@pytest.fixture(scope="module")
def ray_prior(corpus, tiny_gpt2_dir, tmp_path_factory, ray_cluster) -> Path:
    """The Ray build, through the CLI (it finds the test's cluster initialized and joins it)."""
    out = tmp_path_factory.mktemp("ray") / "prior"
    res = CliRunner().invoke(
        app,
        ["index", "build", "prior", "--corpus", str(corpus), "--out", str(out),
         "--model", str(tiny_gpt2_dir), "--engine", "ray", "--actors", "1", "--actor-cpus", "2",
         "--shard-size", str(SHARD), "--batch-size", str(BATCH), "-q"],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    assert "built prior index of 20 passages" in res.output
    info = CliRunner().invoke(app, ["index", "info", str(out)])
    assert "19 in a Parquet prior table, by Ray (1 actors, 5 shards of 4, 0 reused)" in info.output
    return out


def _table_rows(path: Path) -> dict[str, tuple[float, int]]:
    t = pq.read_table(path).to_pydict()
    return {
        k: (lp, n) for k, lp, n in zip(t["passage_key"], t["logprob"], t["num_tokens"], strict=True)
    }


def _scored(log: Path) -> list[int]:
    return sorted(int(x) for x in log.read_text().split()) if log.exists() else []


def test_ray_prior_table_equals_the_local_store(local_prior, ray_prior, tiny_gpt2_dir):
    m = read_manifest(ray_prior)
    assert m.files == [TABLE_FILE] and m.build["engine"] == "ray"
    assert m.build["shards"] == 5 and m.build["shards_scored"] == 5
    assert sorted(p.name for p in ray_prior.iterdir()) == [MANIFEST_FILE, TABLE_FILE]
    assert m.model["store_fingerprint"] == read_manifest(local_prior).model["store_fingerprint"]
    table = _table_rows(ray_prior / TABLE_FILE)
    assert len(table) == m.build["priors_stored"] == len(set(TEXTS)) == 19
    keys = list(table)
    assert keys == sorted(keys)  # sorted by key, one row per distinct passage
    local = PriorStore(local_prior / PRIOR_FILE).get_many(m.model["store_fingerprint"], keys)
    assert set(local) == set(table)
    for k in keys:
        assert table[k][1] == local[k][1]
        assert abs(table[k][0] - local[k][0]) <= 1e-5
    report = verify_index(ray_prior)
    assert [c.status for c in report.checks] == ["ok"]


def test_ray_stores_every_window_as_the_local_store_does(
    corpus, tiny_gpt2_dir, tmp_path, ray_cluster
):
    """At 6 tokens a window, passages have several windows: a shard's rows are then more than
    its passages, and the table still holds every window's prior of the local store, the shard
    files counting passages, not rows."""
    params = {"model": str(tiny_gpt2_dir), "max_doc_tokens": 6}
    local = tmp_path / "local"
    build_index("prior", corpus, local, params, progress=False, options={"batch_size": BATCH})
    out = tmp_path / "ray"
    opts = {"engine": "ray", "shard_size": SHARD, "batch_size": BATCH, "ray": ONE_ACTOR}
    m = build_index("prior", corpus, out, params, progress=False, options=opts)
    table = _table_rows(out / TABLE_FILE)
    fingerprint = m.model["store_fingerprint"]
    store = PriorStore(local / PRIOR_FILE)
    assert len(table) == m.build["priors_stored"] == store.count(fingerprint) > 2 * len(ROWS)
    found = store.get_many(fingerprint, list(table))
    assert set(found) == set(table)
    assert max(abs(table[k][0] - found[k][0]) for k in table) <= 1e-5
    assert m.build["passages"] == len(ROWS)


def test_the_parquet_table_gives_the_cis_scores_of_the_sqlite_store(
    local_prior, ray_prior, tiny_gpt2_dir, tmp_path
):
    passages = TEXTS[:12]
    by_store = CISReranker(
        str(tiny_gpt2_dir), prior_store=str(local_prior / PRIOR_FILE), estimator="forward"
    )
    want = by_store.score(QUERY, passages)
    for spec in (ray_prior / TABLE_FILE, ray_prior):  # the file, or the prior index folder
        r = CISReranker(str(tiny_gpt2_dir), prior_store=str(spec), estimator="forward")
        assert isinstance(r.prior_store, TieredPriors)
        assert r.score(QUERY, passages) == want  # identical, not close: the same stored values
        assert r.prior_store.stats() == {"hits": 12, "misses": 0}
    # A table plus a SQLite file: ad-hoc passages go to the file, the table stays as it was.
    cache = tmp_path / "adhoc.sqlite"
    r = CISReranker(
        str(tiny_gpt2_dir), prior_store=f"{ray_prior / TABLE_FILE},{cache}", estimator="forward"
    )
    adhoc = ["an ad hoc passage about the weather"]
    r.score(QUERY, [*passages[:2], *adhoc])
    assert r.prior_store.stats() == {"hits": 2, "misses": 1}
    assert PriorStore(cache).count() == 1
    assert PriorTable(ray_prior / TABLE_FILE).count() == 19


def test_a_damaged_table_is_an_error_naming_it_never_a_wrong_score(
    local_prior, ray_prior, tiny_gpt2_dir, tmp_path
):
    good = (ray_prior / TABLE_FILE).read_bytes()
    r = CISReranker(str(tiny_gpt2_dir), prior_store=str(ray_prior), estimator="forward")
    want = r.score(QUERY, TEXTS)
    bad, errors = tmp_path / TABLE_FILE, 0
    for pos in range(8, len(good) - 8, len(good) // 24):  # a flipped bit anywhere in the file
        data = bytearray(good)
        data[pos] ^= 0x10
        bad.write_bytes(bytes(data))
        try:
            r.prior_store = open_prior_store(bad)
            got = r.score(QUERY, TEXTS)
        except DataError as exc:
            assert str(bad) in str(exc)  # one line naming the file
            errors += 1
            continue
        assert got == want  # Parquet metadata the reader does not need: the values are intact
    assert errors >= 10
    # the folder form checks the file against the sha256 blocks of its manifest first
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / MANIFEST_FILE).write_bytes((ray_prior / MANIFEST_FILE).read_bytes())
    data = bytearray(good)
    data[len(good) // 2] ^= 0x10
    (folder / TABLE_FILE).write_bytes(bytes(data))
    with pytest.raises(DataError, match=TABLE_FILE):
        open_prior_store(folder)


def test_a_killed_worker_fails_the_job_then_a_rerun_scores_only_the_missing_shards(
    corpus, tiny_gpt2_dir, ray_prior, tmp_path, ray_cluster
):
    out, log, marker = tmp_path / "prior", tmp_path / "scored.log", tmp_path / "kill-me"
    marker.touch()
    # shard 3 kills its actor (os._exit) the first time; no restarts: the job fails
    wrap = partial(testing.ExitOnceJob, log=log, marker=marker, shard=3)
    with pytest.raises(Exception):  # noqa: B017 - Ray's error type for a dead actor varies
        _ray_prior(
            corpus,
            tiny_gpt2_dir,
            out,
            ray_cluster,
            ray=RayOptions(actors=1, num_cpus=2, max_retries=0),
            job_wrapper=wrap,
        )
    assert not marker.exists()
    assert not (out / MANIFEST_FILE).exists() and not (out / TABLE_FILE).exists()
    done = sorted(int(p.stem.split("-")[1]) for p in (out / "shards").glob("prior-*.parquet"))
    assert 3 not in done and set(done) <= set(_scored(log))  # only scored shards have files
    for i in done:  # and each is complete
        assert pq.ParquetFile(out / "shards" / f"prior-{i:05d}.parquet").metadata.num_rows == 4
    with pytest.raises(DataError, match="not a complete index"):
        open_prior_store(out)

    log.unlink(missing_ok=True)
    m = _ray_prior(
        corpus,
        tiny_gpt2_dir,
        out,
        ray_cluster,
        job_wrapper=partial(testing.CountingJob, log=log),
    )
    missing = sorted(set(range(5)) - set(done))
    assert _scored(log) == missing  # only the missing shards, each once
    assert m.build["shards_reused"] == len(done) and m.build["shards_scored"] == len(missing)
    assert m.build["resumed"] is True
    assert (out / TABLE_FILE).read_bytes() == (ray_prior / TABLE_FILE).read_bytes()


_DRIVER = """
import sys
from functools import partial
import ray
ray.init(address=sys.argv[4], log_to_driver=False)
from cisrank import testing
from cisrank.indexes.build import build_index
from cisrank.jobs.ray import RayOptions
build_index("prior", sys.argv[1], sys.argv[2], {"model": sys.argv[3]}, progress=False,
    options={"engine": "ray", "shard_size": 4, "batch_size": 4,
             "ray": RayOptions(actors=1, num_cpus=2),
             "job_wrapper": partial(testing.SlowJob, log=sys.argv[5], delay=1.0)})
"""


def test_a_driver_killed_with_sigkill_leaves_nothing_complete_looking(
    corpus, tiny_gpt2_dir, ray_prior, tmp_path, ray_cluster
):
    out, log = tmp_path / "prior", tmp_path / "scored.log"
    address = ray_cluster.get_runtime_context().gcs_address
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            _DRIVER,
            str(corpus),
            str(out),
            str(tiny_gpt2_dir),
            address,
            str(log),
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    shards = out / "shards"
    try:
        deadline = time.monotonic() + 150
        while not list(shards.glob("prior-*.parquet")):
            assert proc.poll() is None, "the driver ended before writing a shard"
            assert time.monotonic() < deadline, "no shard written in time"
            time.sleep(0.1)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    done = sorted(int(p.stem.split("-")[1]) for p in shards.glob("prior-*.parquet"))
    assert 0 < len(done) < 5
    assert not (out / MANIFEST_FILE).exists() and not (out / TABLE_FILE).exists()
    for i in done:  # a shard file that exists is whole (temp file and rename)
        assert pq.ParquetFile(shards / f"prior-{i:05d}.parquet").metadata.num_rows == 4
    with pytest.raises(DataError, match="not a complete index"):
        read_manifest(out)
    with pytest.raises(DataError, match="not a complete index"):
        open_prior_store(out)

    log2 = tmp_path / "rerun.log"
    m = _ray_prior(
        corpus, tiny_gpt2_dir, out, ray_cluster, job_wrapper=partial(testing.CountingJob, log=log2)
    )
    assert _scored(log2) == sorted(set(range(5)) - set(done))
    assert m.build["shards_reused"] == len(done)
    assert (out / TABLE_FILE).read_bytes() == (ray_prior / TABLE_FILE).read_bytes()


# ------------------------------------------------------------------------------------- dense


def test_ray_dense_index_equals_the_local_one_even_when_a_worker_dies(
    corpus, tiny_bert_dir, tmp_path, ray_cluster
):
    """A worker killed midway is restarted by Ray (the default) and its shard retried: the job
    completes in one run, every shard is written once, and the index is the local build's.
    Ray retries at least once: a shard the actor had finished but whose completion had not yet
    reached the driver when it died may be scored again (seen under load), so the log holds
    every shard, the killed one once (it died before logging), and at most the blocks in
    flight twice; the driver hands each shard over once (`assemble_shards`)."""
    import faiss

    params = {"model": str(tiny_bert_dir), "shard_size": 4, "batch_size": 4}
    local = build_index("dense", corpus, tmp_path / "local", params, progress=False)
    out, log, marker = tmp_path / "ray", tmp_path / "scored.log", tmp_path / "kill-me"
    marker.touch()
    m = build_index(
        "dense",
        corpus,
        out,
        params,
        progress=False,
        options={
            "engine": "ray",
            "ray": ONE_ACTOR,
            "job_wrapper": partial(testing.ExitOnceJob, log=log, marker=marker, shard=2),
        },
    )
    assert not marker.exists()  # the actor did die once
    scored = _scored(log)
    assert sorted(set(scored)) == [0, 1, 2, 3, 4] and scored.count(2) == 1
    assert m.build["shards_scored"] == 5
    assert m.build["engine"] == "ray" and m.model["dtype"] == local.model["dtype"] == "float32"
    a = np.load(tmp_path / "local" / "embeddings.npy")
    b = np.load(out / "embeddings.npy")
    assert a.shape == b.shape == (20, a.shape[1])
    assert (a == b).all()  # the same encoder over the same shards, the same threads
    fa = faiss.read_index(str(tmp_path / "local" / "faiss.index"))
    fb = faiss.read_index(str(out / "faiss.index"))
    assert fa.ntotal == fb.ntotal == 20
    assert (fa.reconstruct_n(0, 20) == fb.reconstruct_n(0, 20)).all()
    assert (fa.search(a[:5], 5)[1] == fb.search(a[:5], 5)[1]).all()
    assert sorted(p.name for p in out.iterdir()) == sorted(
        p.name for p in (tmp_path / "local").iterdir()
    )
    assert (out / "docs.sqlite").read_bytes() == (tmp_path / "local" / "docs.sqlite").read_bytes()


# --------------------------------------------------------------------------------------- CLI


_NO_RAY = """
import sys
sys.modules["ray"] = None  # as if the extra were not installed: import ray raises ImportError
from cisrank.cli.app import main
sys.argv = ["cisrank", *sys.argv[1:]]
main()
"""


def test_cli_engine_ray_without_ray_is_one_line_naming_the_extra(corpus, tiny_gpt2_dir, tmp_path):
    res = subprocess.run(
        [sys.executable, "-c", _NO_RAY, "index", "build", "prior", "--corpus", str(corpus),
         "--out", str(tmp_path / "o"), "--model", str(tiny_gpt2_dir), "--engine", "ray", "-q"],
        capture_output=True, text=True, check=False,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )  # fmt: skip
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ")
    assert "pip install 'cisrank[ray]'" in lines[0]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--engine", "spark"], "--engine must be one of local, ray"),
        (["--actors", "2"], "--actors need --engine ray"),
        (["--shard-size", "8"], "--shard-size needs --engine ray"),
    ],
)
def test_cli_refuses_bad_engine_flags(corpus, tiny_gpt2_dir, tmp_path, args, message):
    res = CliRunner().invoke(
        app,
        ["index", "build", "prior", "--corpus", str(corpus), "--out", str(tmp_path / "o"),
         "--model", str(tiny_gpt2_dir), "-q", *args],
    )  # fmt: skip
    assert isinstance(res.exception, CisrankError) and res.exception.exit_code == 2
    assert message in str(res.exception)
    assert not (tmp_path / "o").exists()
