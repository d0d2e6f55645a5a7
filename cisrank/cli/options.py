"""Options shared by several verbs (`eval`, `rerank`, `distill`, `serve`), declared once.

The reranker-specific flags are not here: `cisrank.cli.reranker_flags` generates them from the
reranker configs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from cisrank.rerank.registry import available

RerankerOpt = Annotated[
    str,
    typer.Option(
        "--reranker",
        "-r",
        help=f"Reranker to apply to the first-stage candidates: {', '.join(available())}.",
    ),
]
ModelOpt = Annotated[
    str | None,
    typer.Option("--model", "-m", help="Model for the reranker: Hugging Face id or local folder."),
]
DepthOpt = Annotated[
    int, typer.Option("--depth", min=1, help="How many first-stage candidates to rerank per query.")
]
BatchOpt = Annotated[
    int | None, typer.Option("--batch-size", min=1, help="Passages per model batch.")
]
OutputOpt = Annotated[
    Path | None,
    typer.Option(
        "--output",
        "-o",
        help="Folder for run.trec, metrics.json, per_query.tsv and the delta plot "
        "(default out/eval-<dataset>-<reranker>).",
    ),
]
DataDirOpt = Annotated[
    Path | None,
    typer.Option(
        "--data-dir",
        help="The dataset's folder (topics.tsv, qrels.txt, candidates json). Default: "
        "$CISRANK_DATA_DIR/<dataset>, else ir_datasets.",
    ),
]
DeviceOpt = Annotated[
    str | None, typer.Option("--device", help="torch device (cpu, cuda, cuda:1); auto by default.")
]
QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar.")]
JsonOpt = Annotated[
    bool, typer.Option("--json", help="Print machine-readable JSON instead of a table.")
]
FirstStageOpt = Annotated[
    list[Path] | None,
    typer.Option(
        "--first-stage",
        help="Index folder to retrieve the top --depth from instead of the given run "
        "(repeat to fuse several by RRF).",
    ),
]
# Options of the offline jobs' engine (`index build prior | dense`, `distill generate`).
EngineOpt = Annotated[
    str,
    typer.Option(
        "--engine",
        help="local: this process; ray: a pool of Ray actors, each loading the model once (one "
        "GPU each where the cluster has GPUs), scoring the missing shards (extra `ray`).",
    ),
]
RayAddressOpt = Annotated[
    str | None,
    typer.Option(
        "--ray-address",
        envvar="RAY_ADDRESS",
        help="--engine ray: the cluster to join (host:port, ray://host:10001 or auto); "
        "default: a local cluster started for the job.",
    ),
]
ActorsOpt = Annotated[
    int | None,
    typer.Option(
        "--actors",
        min=1,
        help="--engine ray: actors in the pool (default: one per GPU, else one per CPU).",
    ),
]
ActorGpusOpt = Annotated[
    float | None,
    typer.Option(
        "--actor-gpus",
        min=0.0,
        help="--engine ray: GPUs per actor (default 1 where the cluster has GPUs, else 0; "
        "0.5 puts two actors on a GPU).",
    ),
]
ActorCpusOpt = Annotated[
    float | None,
    typer.Option("--actor-cpus", min=0.0, help="--engine ray: CPUs per actor (default 1)."),
]


def ray_options(
    engine: str,
    address: str | None,
    actors: int | None,
    actor_gpus: float | None,
    actor_cpus: float | None,
):
    """The Ray engine's options from the CLI flags (None for the local engine); a Ray flag
    without `--engine ray` is an error rather than silently ignored."""
    from cisrank.errors import CisrankError
    from cisrank.ray_engine import RayOptions, check_engine

    if check_engine(engine) == "local":
        given = [
            flag
            for flag, value in (
                ("--actors", actors),
                ("--actor-gpus", actor_gpus),
                ("--actor-cpus", actor_cpus),
            )
            if value is not None
        ]
        if given:
            raise CisrankError(f"{', '.join(given)} need --engine ray")
        return None
    return RayOptions(address=address, actors=actors, num_gpus=actor_gpus, num_cpus=actor_cpus)


# One process per core for model work (`cisrank.workers`): eval, rerank, distill generate,
# index build prior.
WorkersOpt = Annotated[
    int | None,
    typer.Option(
        "--workers",
        min=1,
        help="Processes, each with its own copy of the model, sharing the work (default: one "
        "per CPU core; one on a GPU). Scores do not depend on it.",
    ),
]
ThreadsPerWorkerOpt = Annotated[
    int | None,
    typer.Option(
        "--threads-per-worker",
        min=1,
        help="Torch threads of each worker (default 1: on a CPU, two single-threaded "
        "processes run a small LM about 2x one, one process with two threads about 1.4x).",
    ),
]


def worker_options(workers: int | None, threads_per_worker: int | None):
    """The flags as `cisrank.workers.WorkerOptions` (its defaults where a flag is left out)."""
    from cisrank.workers import WorkerOptions

    default = WorkerOptions()
    return WorkerOptions(
        workers=workers,
        threads_per_worker=threads_per_worker or default.threads_per_worker,
    )
