"""Options shared by several verbs (`eval`, `rerank`, `distill`, `index`, `serve`), declared once,
and the flag groups that several verbs take whole (`takes`).

The reranker-specific flags are not here: `cisrank.cli.reranker_flags` generates them from the
reranker configs.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from pathlib import Path
from typing import (
    TYPE_CHECKING,
    Annotated,
    Any,
    Generic,
    NamedTuple,
    TypeVar,
    cast,
    get_type_hints,
    overload,
)

import typer

from cisrank.rerank.registry import KINDS, available, default_model

if TYPE_CHECKING:
    from cisrank.jobs.pool import WorkerOptions
    from cisrank.jobs.ray import RayOptions
    from cisrank.rerank.chunking import Chunking

Built = TypeVar("Built")
Command = TypeVar("Command", bound=Callable[..., None])


class FlagGroup(Generic[Built]):
    """Flags that several verbs take together, declared once: each verb gets the one value that
    `build` makes of them (a `WorkerOptions`, an `Engine`, ...) instead of a parameter per flag.

    `flags` is a class whose annotated attributes are the flags, in help order, each as a verb
    would declare it: `name: Annotated[type, typer.Option(...)] = default`. `build` is called
    with their values as keywords; by default the class itself (a dataclass) holds them."""

    @overload
    def __init__(self: FlagGroup[Built], flags: type[Built]) -> None: ...
    @overload
    def __init__(self, flags: type, build: Callable[..., Built]) -> None: ...
    def __init__(self, flags: type, build: Callable[..., Built] | None = None) -> None:
        self.build: Callable[..., Built] = build or flags
        P = inspect.Parameter
        self.parameters = [
            P(name, P.KEYWORD_ONLY, default=getattr(flags, name, P.empty), annotation=hint)
            for name, hint in get_type_hints(flags, include_extras=True).items()
        ]

    @property
    def names(self) -> list[str]:
        return [p.name for p in self.parameters]


def takes(**groups: FlagGroup[Any]) -> Callable[[Command], Command]:
    """`@takes(workers=WORKER_FLAGS)`: the verb's parameter `workers` stands for the group. The
    signature typer reads has the group's flags in its place (so the help lists them where the
    parameter is), and the verb is called with the group's built value under that name."""

    def decorate(command: Command) -> Command:
        signature = inspect.signature(command, eval_str=True)
        missing = set(groups) - set(signature.parameters)
        if missing:
            raise TypeError(f"{command.__name__} has no parameter {', '.join(sorted(missing))}")
        params: list[inspect.Parameter] = []
        for param in signature.parameters.values():
            if param.name in groups:
                params += groups[param.name].parameters
            elif param.kind is param.VAR_KEYWORD:
                params.append(param)
            else:
                params.append(param.replace(kind=inspect.Parameter.KEYWORD_ONLY))
        names = [p.name for p in params]
        if len(names) != len(set(names)):
            raise TypeError(f"{command.__name__}: a flag group repeats a parameter name")

        def verb(**values: Any) -> None:
            for name, group in groups.items():
                values[name] = group.build(**{flag: values.pop(flag) for flag in group.names})
            command(**values)

        # The command's name and help text; its parameters are the signature set here (typer
        # reads it, and `reranker_flags` may extend it).
        verb.__name__, verb.__qualname__ = command.__name__, command.__qualname__
        verb.__module__, verb.__doc__ = command.__module__, command.__doc__
        cast(Any, verb).__signature__ = signature.replace(parameters=params)
        return cast(Command, verb)

    return decorate


RerankerOpt = Annotated[
    str,
    typer.Option(
        "--reranker",
        "-r",
        help=f"Reranker to apply to the first-stage candidates: {', '.join(available())}.",
    ),
]
RERANKER_KINDS = ", ".join(sorted(KINDS))
PassageRerankerOpt = Annotated[
    str,
    typer.Option(
        "--reranker",
        "-r",
        help=f"Reranker that orders the passages: {RERANKER_KINDS}. Default: student, the "
        "cross-encoder shipped with cisrank (DL19 nDCG@10 0.6458 at about 110 pairs/s on 2 "
        "cores, bench/RESULTS.md).",
    ),
]
"""`--reranker` of a verb with no first stage (`rerank` is given the passages) and so no `none`."""
ModelOpt = Annotated[
    str | None,
    typer.Option(
        "--model",
        "-m",
        help="Model for the reranker: a Hugging Face id, a local folder or a catalogue name "
        "(cisrank models list; pulled on first use); unset, the kind's default ("
        + "; ".join(f"{k}: {m}" for k in sorted(KINDS) if (m := default_model(k)))
        + ").",
    ),
]
LanguageModelOpt = Annotated[
    str,
    typer.Option(
        "--model",
        "-m",
        help="The causal LM: a Hugging Face id, a local folder or a pulled model's name.",
    ),
]
"""`--model` of `context` and `generate`, which need one."""
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
MissingOpt = Annotated[
    str,
    typer.Option(
        "--missing",
        help="Judged queries without a topic or candidates: refuse (the default: exit 2 naming "
        "them), zero (count them 0, as trec_eval -c does) or skip (leave them out).",
    ),
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


class Engine(NamedTuple):
    """`--engine` and its Ray flags: the engine (`local` or `ray`) and the Ray options (None for
    the local engine)."""

    name: str
    ray: RayOptions | None


def engine_options(
    engine: str,
    ray_address: str | None,
    actors: int | None,
    actor_gpus: float | None,
    actor_cpus: float | None,
) -> Engine:
    """The engine and its Ray options from the CLI flags; a Ray flag without `--engine ray` is
    an error rather than silently ignored."""
    from cisrank.errors import CisrankError
    from cisrank.jobs.ray import RayOptions, check_engine

    name = check_engine(engine)
    if name == "local":
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
        return Engine(name, None)
    options = RayOptions(
        address=ray_address, actors=actors, num_gpus=actor_gpus, num_cpus=actor_cpus
    )
    return Engine(name, options)


class _EngineFlags:
    engine: EngineOpt = "local"
    ray_address: RayAddressOpt = None
    actors: ActorsOpt = None
    actor_gpus: ActorGpusOpt = None
    actor_cpus: ActorCpusOpt = None


ENGINE_FLAGS = FlagGroup(_EngineFlags, engine_options)
"""The offline jobs' engine (`index build prior | dense`, `distill generate`)."""


# One process per core for model work (`cisrank.jobs.pool`): eval, rerank, distill generate,
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


def worker_options(workers: int | None, threads_per_worker: int | None) -> WorkerOptions:
    """The flags as `cisrank.jobs.pool.WorkerOptions` (its defaults where a flag is left out)."""
    from cisrank.jobs.pool import WorkerOptions

    default = WorkerOptions()
    return WorkerOptions(
        workers=workers,
        threads_per_worker=threads_per_worker or default.threads_per_worker,
    )


class _WorkerFlags:
    workers: WorkersOpt = None
    threads_per_worker: ThreadsPerWorkerOpt = None


WORKER_FLAGS = FlagGroup(_WorkerFlags, worker_options)
"""A worker per core (`eval`, `rerank`, `distill generate`, `index build prior`)."""


def _chunk_help(field: str) -> str:
    """A chunking flag's help, from its field: declared once, in `Chunking`."""
    from cisrank.rerank.chunking import Chunking

    info = Chunking.model_fields[field]
    return f"{info.description} Default: {info.default} (serve: the config file's chunking)."


class ChunkChanges(dict[str, Any]):
    """The chunking flags given (None: not given), as `Chunking.replace` takes them."""

    def over(self, chunking: Chunking) -> Chunking:
        """`chunking` with the flags given, checked as one `Chunking` (an overlap over the
        window is one line, exit 2)."""
        return chunking.replace(**self)


class _ChunkFlags:
    chunk_window_tokens: Annotated[
        int | None,
        typer.Option("--chunk-window-tokens", min=1, help=_chunk_help("window_tokens")),
    ] = None
    chunk_overlap_tokens: Annotated[
        int | None,
        typer.Option("--chunk-overlap-tokens", min=0, help=_chunk_help("overlap_tokens")),
    ] = None
    chunk_pooling: Annotated[
        str | None, typer.Option("--chunk-pooling", help=_chunk_help("pooling"))
    ] = None
    max_chunks_per_doc: Annotated[
        int | None,
        typer.Option("--max-chunks-per-doc", min=1, help=_chunk_help("max_chunks_per_doc")),
    ] = None


def _chunk_changes(
    chunk_window_tokens: int | None,
    chunk_overlap_tokens: int | None,
    chunk_pooling: str | None,
    max_chunks_per_doc: int | None,
) -> ChunkChanges:
    return ChunkChanges(
        window_tokens=chunk_window_tokens,
        overlap_tokens=chunk_overlap_tokens,
        pooling=chunk_pooling,
        max_chunks_per_doc=max_chunks_per_doc,
    )


CHUNK_FLAGS = FlagGroup(_ChunkFlags, _chunk_changes)
"""How long documents are cut into windows and pooled (`serve`, `rerank`)."""
