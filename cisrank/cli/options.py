"""Options shared by several verbs (`eval`, `rerank`, `distill`, `serve`), declared once.

Reranker-specific options default to None and are passed through `reranker_options`: None means
"the reranker's own default", which lives in its config class and nowhere else.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

RerankerOpt = Annotated[
    str,
    typer.Option(
        "--reranker",
        "-r",
        help="Reranker to apply to the first-stage candidates: none, dense, ...",
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
# Options of the CIS reranker (`--reranker cis`); rejected by rerankers they do not apply to.
TemplateOpt = Annotated[
    str | None,
    typer.Option(
        "--template",
        help="CIS query template: plain, qa, chat (the tokenizer's chat template), or a custom "
        "string holding {query}.",
    ),
]
EstimatorOpt = Annotated[
    str | None,
    typer.Option(
        "--estimator",
        help="CIS: forward (log p(K|Q) - log p(K), default), reverse (log p(Q|K), no prior) or "
        "both (their mean).",
    ),
]
ReverseTemplateOpt = Annotated[
    str | None,
    typer.Option(
        "--reverse-template",
        help="CIS reverse estimator: upr (default), chat, or a custom string holding {passage} "
        "and ending with {query}.",
    ),
]
PriorStoreOpt = Annotated[
    Path | None,
    typer.Option(
        "--prior-store",
        help="CIS: stored log p(K): a SQLite file (created if absent), a Parquet prior table "
        "or a prior index folder (read-only), or several comma-separated (tables first, one "
        "SQLite file last to cache the passages they lack).",
    ),
]
MaxDocTokensOpt = Annotated[
    int | None,
    typer.Option("--max-doc-tokens", min=1, help="CIS: passage tokens kept (default 512)."),
]
NormalizeOpt = Annotated[
    str | None,
    typer.Option("--normalize", help="CIS: 'sum' of token log-probs (default) or 'mean'."),
]
# Option of the cross-encoder reranker (`--reranker cross-encoder`).
QuantizeOpt = Annotated[
    str | None,
    typer.Option(
        "--quantize",
        help="cross-encoder: 'int8' (CPU: dynamic int8 Linear layers, faster, scores move by "
        "quantization noise) or 'none' (default).",
    ),
]

# Options of the hybrid reranker (`--reranker hybrid`).
FuseOpt = Annotated[
    str | None,
    typer.Option(
        "--fuse",
        help="hybrid: components and weights, e.g. 'cis:0.5,dense:0.3,first-stage:0.2' "
        "(--model goes to the first component taking a model).",
    ),
]
FusionOpt = Annotated[
    str | None,
    typer.Option(
        "--fusion",
        help="hybrid: 'linear' (per-query min-max normalized weighted sum, default) or 'rrf'.",
    ),
]


def reranker_options(
    template: str | None,
    prior_store: Path | None,
    max_doc_tokens: int | None,
    normalize: str | None,
    quantize: str | None = None,
    estimator: str | None = None,
    reverse_template: str | None = None,
    fuse: str | None = None,
    fusion: str | None = None,
) -> dict[str, Any]:
    """Reranker-specific flags (CIS, cross-encoder) as `load_reranker` keyword options; None
    values are dropped there, and a flag the chosen reranker does not take is an error there."""
    return {
        "template": template,
        "prior_store": str(prior_store) if prior_store is not None else None,
        "max_doc_tokens": max_doc_tokens,
        "normalize": normalize,
        "quantize": quantize,
        "estimator": estimator,
        "reverse_template": reverse_template,
        "fuse": fuse,
        "fusion": fusion,
    }


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
