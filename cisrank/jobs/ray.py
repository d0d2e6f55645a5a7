"""`--engine ray`: the offline jobs' shards scored by a pool of Ray actors (Ray Data).

The jobs themselves (the prior job, the dense encoding, teacher scoring) keep their own shard
plans and output files, and the shard runner (`cisrank.jobs.shards`) finds the shards that
are missing and writes their files; this module only distributes the scoring of those. One Ray Data pipeline per job:

    shards (one Arrow block each, put in the object store by the driver as it reads the corpus)
      -> map_batches(ShardActor, actor pool): each actor loads the model once (`job.load()`) and
         scores whole blocks with the job's own scoring code (`job.score()`, which calls the CIS
         engine, the dense encoder or the teacher: no second copy of the hot loop)
      -> the driver, streaming the results: a shard's rows are written (temp file + rename) as
         soon as all of them have arrived, so a shard file that exists is complete.

Actors take one GPU each where the cluster has GPUs (Ray pins each to its own device through
CUDA_VISIBLE_DEVICES), else `num_cpus` CPUs each (torch then runs that many threads). Ray Data
restarts an actor that dies and retries its blocks (the default; at least once: a block that had
finished as the actor died may be scored again, and the driver keeps its first copy);
`max_retries=0` makes a dead actor fail the job instead, and a rerun scores only the shards that
were not written.

The cluster: `address` (or RAY_ADDRESS) joins a running one; otherwise a local one is started for
the job and stopped after it. A cluster already initialized in this process (a test fixture, a
notebook) is used as is. On a multi-machine cluster the workers must see the model (a shared
folder or the hub cache) and the driver writes every output file, so only the driver needs the
output folder; the corpus is read by the driver alone and shipped through the object store.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol

from cisrank.errors import CisrankError, MissingExtraError

log = logging.getLogger(__name__)


class Engine(StrEnum):
    """Where an offline job's shards are scored (`cisrank.jobs.shards` dispatches on it)."""

    LOCAL = "local"
    """This process, or a pool of local worker processes."""
    RAY = "ray"
    """A pool of Ray actors (this module)."""


ENGINES = tuple(e.value for e in Engine)
SHARD = "shard"
"""Column that every block and every result row carries: the shard it belongs to."""
POS = "pos"
"""Column of each row's position inside its shard: results are put back in this order."""


def check_engine(engine: str | None) -> Engine:
    engine = engine or Engine.LOCAL
    if engine not in ENGINES:
        raise CisrankError(f"--engine must be one of {', '.join(ENGINES)}, not '{engine}'")
    return Engine(engine)


def import_ray():
    """`ray` with Ray Data, or a one-line error naming the extra."""
    try:
        import ray
        import ray.data
    except ImportError as exc:
        raise MissingExtraError("ray", "ray", "--engine ray") from exc
    return ray


@dataclass(frozen=True)
class RayOptions:
    """How the Ray engine runs a job (none of it changes the outputs)."""

    address: str | None = None
    """Cluster to join (`ray://...`, `host:port` or `auto`); None: RAY_ADDRESS, else local."""
    actors: int | None = None
    """Actors in the pool; None: one per GPU of the cluster, else one per `num_cpus` CPUs."""
    num_gpus: float | None = None
    """GPUs per actor; None: 1 where the cluster has GPUs, else 0 (CPU actors)."""
    num_cpus: float | None = None
    """CPUs per actor; None: 1."""
    max_retries: int | None = None
    """Restarts of a dead actor and retries of its block; None: Ray Data's default (retry)."""
    local_cpus: int | None = None
    """CPUs of a local cluster started for the job; None: all of this machine's."""


@contextmanager
def ray_session(options: RayOptions) -> Iterator[Any]:
    """A connected Ray: the one this process already has, the cluster at `address` (or
    RAY_ADDRESS), or a local cluster started now and shut down on exit."""
    ray = import_ray()
    if ray.is_initialized():
        yield ray
        return
    address = options.address or os.environ.get("RAY_ADDRESS") or None
    kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": True}
    if address is None and options.local_cpus is not None:
        kwargs["num_cpus"] = options.local_cpus
    try:
        ray.init(address=address, **kwargs)
    except ConnectionError as exc:
        raise CisrankError(f"cannot join the Ray cluster at '{address}': {exc}") from None
    try:
        yield ray
    finally:
        ray.shutdown()


class ShardJob(Protocol):
    """A job's scoring, as the actors run it. Must pickle (it travels to every actor)."""

    def load(self) -> Any:
        """Load the model: once per actor."""
        ...

    def describe(self, state: Any) -> dict[str, Any]:
        """What identifies the outputs (model fingerprint, dtype, device), from a loaded model."""
        ...

    def score(self, state: Any, batch: Any) -> Any:
        """Score one block (a pyarrow Table with SHARD and POS columns); return a pyarrow Table
        of result rows, each with the SHARD and POS of its input row."""
        ...


def text_block(shard: int, texts: Sequence[str]) -> Any:
    """One shard of passages as a block: its SHARD and POS columns and the passages' `text`."""
    import pyarrow as pa

    return pa.table(
        {
            SHARD: pa.array([shard] * len(texts), pa.int64()),
            POS: pa.array(range(len(texts)), pa.int64()),
            "text": pa.array(texts, pa.string()),
        }
    )


class ShardActor:
    """The Ray Data callable class: the model loaded once, then block after block."""

    def __init__(self, job: ShardJob) -> None:
        self.job = job
        self.state = job.load()

    def __call__(self, batch: Any) -> Any:
        return self.job.score(self.state, batch)


def _describe(job: ShardJob) -> dict[str, Any]:
    return job.describe(job.load())


@dataclass(frozen=True)
class Resources:
    actors: int
    num_gpus: float
    num_cpus: float


def plan_resources(ray: Any, options: RayOptions) -> Resources:
    cluster = ray.cluster_resources()
    gpus = float(cluster.get("GPU", 0))
    num_gpus = options.num_gpus if options.num_gpus is not None else (1.0 if gpus else 0.0)
    num_cpus = options.num_cpus if options.num_cpus is not None else 1.0
    if options.actors is not None:
        if options.actors < 1:
            raise CisrankError(f"--actors must be >= 1, got {options.actors}")
        actors = options.actors
    elif num_gpus:
        actors = max(1, int(gpus // num_gpus))
    else:
        actors = max(1, int(float(cluster.get("CPU", 1)) // max(num_cpus, 1e-9)))
    return Resources(actors, num_gpus, num_cpus)


def _has_gpu() -> bool:
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency
        return False
    return bool(torch.cuda.is_available())


def describe_remote(ray: Any, job: ShardJob, res: Resources) -> dict[str, Any]:
    """`job.describe()` as the actors will compute: GPU actors describe it in a task on a GPU
    (the GPU decides the dtype, hence the fingerprint; the driver may have no GPU and no room
    for the model). CPU actors compute what the driver computes on its CPU, so it is done here,
    sparing a worker process its start (seconds: torch and transformers to import)."""
    if not res.num_gpus and not _has_gpu():  # else "auto" would pick the driver's GPU
        return _describe(job)
    task = ray.remote(num_gpus=res.num_gpus, num_cpus=res.num_cpus, max_retries=0)(_describe)
    return ray.get(task.remote(job))


def _remote_args(options: RayOptions, res: Resources) -> dict[str, Any]:
    args: dict[str, Any] = {"num_gpus": res.num_gpus, "num_cpus": res.num_cpus}
    if options.max_retries is not None:
        args["max_restarts"] = int(options.max_retries)
        args["max_task_retries"] = int(options.max_retries)
    return args


def _pool_args(ray: Any, size: int) -> dict[str, Any]:
    """A fixed pool of `size` actors, said the way this Ray wants it: `concurrency=` from 2.9
    to 2.50 (`compute=` warned as deprecated), `compute=ActorPoolStrategy` from 2.51 (where
    `concurrency=` warns)."""
    try:
        major, minor = (int(x) for x in ray.__version__.split(".")[:2])
    except ValueError:  # pragma: no cover - a dev build
        major, minor = 99, 0
    if (major, minor) >= (2, 51):
        from ray.data import ActorPoolStrategy

        return {"compute": ActorPoolStrategy(size=size)}
    return {"concurrency": size}


def score_on_actors(
    ray: Any,
    blocks: Iterable[Any],
    job: ShardJob,
    options: RayOptions,
    res: Resources,
    expected: dict[int, int],
    on_shard: Callable[[int, Any], None],
) -> int:
    """Score `blocks` (pyarrow Tables, one per shard to do, each with SHARD and POS columns) on
    an actor pool and hand every shard's complete result (a Table sorted by POS) to `on_shard`
    as soon as its `expected[shard]` rows have all arrived. Returns the shards handed over."""
    refs = [ray.put(b) for b in blocks]
    if not refs:
        return 0
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False  # the job's own bar counts passages
    ctx.print_on_execution_start = False
    ds = ray.data.from_arrow_refs(refs)
    ds = ds.map_batches(
        ShardActor,
        fn_constructor_args=(job,),
        batch_size=None,  # a whole block (one shard) per call: the job batches inside it
        batch_format="pyarrow",
        zero_copy_batch=True,
        **_pool_args(ray, min(res.actors, len(refs))),
        **_remote_args(options, res),
    )
    return assemble_shards(
        ds.iter_batches(batch_size=None, batch_format="pyarrow"), expected, on_shard
    )


def assemble_shards(
    batches: Iterable[Any], expected: dict[int, int], on_shard: Callable[[int, Any], None]
) -> int:
    """Hand each shard's rows (pyarrow Tables carrying SHARD and POS) to `on_shard` once, sorted
    by POS, as soon as its `expected[shard]` rows have all arrived; returns the shards handed.

    Why a shard can come back twice: Ray's retries are at least once. An actor that dies with
    blocks in flight has them run again on its successor, and a block it had finished but whose
    completion had not yet reached the driver is among them, so its rows arrive a second time.
    The scoring is deterministic, so a second copy of a shard already handed over is dropped
    (logged); more rows than expected for a shard still pending is an error."""
    import pyarrow as pa
    import pyarrow.compute as pc

    pending: dict[int, list[Any]] = {}
    handed: set[int] = set()
    for batch in batches:
        if batch.num_rows == 0:
            continue
        shards = batch.column(SHARD)
        for shard in (int(s) for s in pc.unique(shards).to_pylist()):
            if shard in handed:
                log.info("shard %d came back again after a retry: the copy is dropped", shard)
                continue
            pending.setdefault(shard, []).append(batch.filter(pc.equal(shards, shard)))
            rows = sum(p.num_rows for p in pending[shard])
            want = expected[shard]
            if rows > want:
                raise RuntimeError(f"shard {shard}: {rows} result rows, expected {want}")
            if rows == want:
                on_shard(shard, pa.concat_tables(pending.pop(shard)).sort_by(POS))
                handed.add(shard)
    if pending:
        raise RuntimeError(f"shards {sorted(pending)} came back incomplete")
    return len(handed)
