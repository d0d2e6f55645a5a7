"""`cisrank distill pool | generate | train | run`: the training pool, teacher rows, student
training, the last three chained."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from cisrank.cli.config_flags import config_flags
from cisrank.cli.defaults import field_help
from cisrank.cli.options import ENGINE_FLAGS, WORKER_FLAGS, Engine, FlagGroup, takes
from cisrank.cli.reranker_flags import reranker_flags
from cisrank.distill.config import RunPlan, SynthConfig, TrainConfig
from cisrank.distill.teachers import TeacherSpec, teacher_kind, teacher_list
from cisrank.distill.trainset import EXCLUDED_SETS, POOL_SETS
from cisrank.jobs.pool import WorkerOptions
from cisrank.rerank.registry import CIS

distill_app = typer.Typer(
    help="Distil a teacher (CIS by default) into a BERT cross-encoder: score pairs, train, "
    "evaluate.",
    no_args_is_help=True,
)

TeacherOpt = Annotated[
    str,
    typer.Option(
        "--teacher",
        help=f"{teacher_list()}.",
    ),
]
TeacherModelOpt = Annotated[
    str | None, typer.Option("--model", "-m", help="Teacher model: Hugging Face id or folder.")
]
ScoresFileOpt = Annotated[
    Path | None,
    typer.Option("--scores-file", help="Teacher 'scores': qid Q0 docid rank score tag."),
]
BatchOpt = Annotated[
    int | None, typer.Option("--batch-size", min=1, help="Teacher passages per model batch.")
]
DeviceOpt = Annotated[str | None, typer.Option("--device", help="torch device; auto by default.")]
DepthOpt = Annotated[int, typer.Option("--depth", min=1, help="Candidates scored per query.")]
RunDepthOpt = Annotated[int | None, typer.Option("--depth", help=field_help(RunPlan, "depth"))]
QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", help="No progress bars.")]


def _config(flags: dict) -> TrainConfig:
    """The training flags of a command as a TrainConfig; flags left out (None) keep the
    config's defaults."""
    # `--batch-size` is the teacher's; the student's is `--train-batch-size`.
    field_of = {flag: field for field, flag in TrainConfig.flags.items()}
    picked = {field_of.get(k, k): v for k, v in flags.items() if k != "batch_size"}
    return TrainConfig().replace(
        **{k: v for k, v in picked.items() if k in TrainConfig.model_fields}
    )


def _training_flags(omit: tuple[str, ...] = ()) -> FlagGroup[dict[str, Any]]:
    """The student's training flags: the `Flag()` fields of `TrainConfig` but `omit`, as given
    (None: left out); `_config` makes them a TrainConfig."""
    return config_flags(
        TrainConfig,
        omit=omit,
        renamed=TrainConfig.flags,
        aliases={"learning_rate": ["--learning-rate"]},
        ranged=["list_depth"],
    )


TRAIN_FLAGS = _training_flags()
"""`distill train`'s."""
RUN_TRAIN_FLAGS = _training_flags(
    omit=("teacher_fuse", "teacher_fusion", "list_depth", "temperature")
)
"""`distill run`'s: the same but for the teacher sets' and the lists' (`run` trains on the rows
it scores, each query's list whole)."""

teacher_flags = reranker_flags(role="teacher", kinds=[CIS.name], omit=["normalize"])
"""The CIS teacher's flags, the set distill has always offered (no --normalize). They go to
whichever teacher is chosen, and the reranker registry rejects another kind's by name
(`--template` with `--teacher dense`)."""


def _dev(name: str | None):
    from cisrank.data.datasets import load_named

    return None if name is None else load_named(name)


def _names(text: str) -> tuple[str, ...]:
    return tuple(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))


@distill_app.command("pool")
def pool_cmd(
    out: Annotated[Path, typer.Option("--out", "-o", help="Folder for pool.jsonl and topics.tsv.")],
    data_dir: Annotated[
        Path | None,
        typer.Option("--data-dir", help="Root of the datasets (default: $CISRANK_DATA_DIR)."),
    ] = None,
    pool_sets: Annotated[
        str,
        typer.Option(
            "--pool-sets",
            help="Comma-separated datasets whose candidates join the pool (beside the triples).",
        ),
    ] = ",".join(POOL_SETS),
    held_out: Annotated[
        str,
        typer.Option(
            "--held-out",
            help="Comma-separated datasets whose passages are left out by text (the test and dev "
            "sets). Other values than the defaults only rebuild the pool of an older teacher set.",
        ),
    ] = ",".join(EXCLUDED_SETS),
) -> None:
    """Write the student's training pool: every passage here that no test or dev set judges
    (DL22's pool and the MS MARCO training triples; DL19 and DL21 passages left out by content),
    the 994 training queries and their triples' positives, for `index build` and `distill
    generate --first-stage`."""
    from cisrank import env
    from cisrank.distill.trainset import build_pool
    from cisrank.errors import DataError

    root = data_dir or env.data_dir()
    if root is None:
        raise DataError("no data folder: pass --data-dir or set CISRANK_DATA_DIR")
    info = build_pool(out, root, _names(pool_sets), _names(held_out))
    sources = ", ".join(f"{k} {v}" for k, v in info.by_source.items())
    typer.echo(
        f"{out}: {info.passages} passages ({sources}), {info.queries} queries; "
        f"left out as test-set passages: {sum(info.excluded.values())}"
    )


@distill_app.command("generate")
@teacher_flags
@takes(engine=ENGINE_FLAGS, workers=WORKER_FLAGS)
def generate_cmd(
    out: Annotated[Path, typer.Option("--out", "-o", help="Folder for the Parquet shards.")],
    dataset: Annotated[
        str | None, typer.Option("--dataset", help="Named query set (trec-dl22, ...).")
    ] = None,
    data_dir: Annotated[
        Path | None, typer.Option("--data-dir", help="The dataset's folder.")
    ] = None,
    candidates: Annotated[
        Path | None, typer.Option("--candidates", help="Candidates JSON(.gz) with passage text.")
    ] = None,
    topics: Annotated[
        Path | None, typer.Option("--topics", help="With --candidates or --first-stage.")
    ] = None,
    first_stage: Annotated[
        list[Path] | None,
        typer.Option(
            "--first-stage",
            help="Index folder to retrieve each --topics query's top --depth from (repeat to "
            "fuse several by RRF).",
        ),
    ] = None,
    triples: Annotated[
        Path | None, typer.Option("--triples", help="MS MARCO query<TAB>pos<TAB>neg file.")
    ] = None,
    teacher: TeacherOpt = "cis",
    model: TeacherModelOpt = None,
    scores_file: ScoresFileOpt = None,
    batch_size: BatchOpt = None,
    device: DeviceOpt = None,
    depth: DepthOpt = 100,
    shard_pairs: Annotated[
        int, typer.Option("--shard-pairs", min=1, help="Pairs per shard (whole queries).")
    ] = 2048,
    overwrite: Annotated[bool, typer.Option("--overwrite")] = False,
    *,
    engine: Engine,
    workers: WorkerOptions,
    quiet: QuietOpt = False,
    **options: Any,
) -> None:
    """Score every (query, passage) pair with the teacher into Parquet shards (resumable)."""
    from cisrank.distill.generate import generate
    from cisrank.distill.sources import load_source

    ray = engine.ray
    source = load_source(
        dataset=dataset,
        data_dir=data_dir,
        candidates=candidates,
        topics=topics,
        triples=triples,
        first_stage=first_stage,
        depth=depth,
    )
    spec = TeacherSpec.of(
        teacher, model, scores_file, batch_size=batch_size, device=device, **options
    )
    t, pool = _teacher_on(spec, engine, workers, device)
    res = generate(
        source,
        t,
        out,
        shard_pairs=shard_pairs,
        overwrite=overwrite,
        progress=not quiet,
        engine=engine.name,
        ray=ray,
        workers=pool if ray is None else None,
    )
    m = res.manifest
    typer.echo(
        f"{out}: {m['queries']} queries, {m['pairs']} pairs in {m['shards']} shards "
        f"({res.shards_written} written, {res.shards_reused} reused); "
        f"teacher score mean {m['score_stats']['mean']:.4g} std {m['score_stats']['std']:.4g}"
    )


def _teacher_on(
    spec: TeacherSpec, engine: Engine, workers: WorkerOptions, device: str | None
) -> tuple[Any, WorkerOptions]:
    """The teacher as `generate` takes it, and the worker pool that scores: each Ray actor or
    worker builds its own teacher from the spec; alone, it is built now, on this process's
    threads. A teacher that reads its scores from a file has no model to spread: one worker."""
    from cisrank.jobs.pool import for_device, set_threads

    pool = for_device(workers, device)
    if teacher_kind(spec.name).reads_file:
        pool = WorkerOptions(workers=1, threads_per_worker=pool.threads_per_worker)
    if engine.ray is None and pool.count == 1:
        set_threads(pool.threads_per_worker)
    return (spec if engine.ray is not None or pool.count > 1 else spec.load()), pool


SYNTH_FLAGS = config_flags(SynthConfig)
"""`distill synth`'s generation and filter settings: the `Flag()` fields of `SynthConfig`."""


@distill_app.command("synth")
@takes(synth=SYNTH_FLAGS, workers=WORKER_FLAGS)
def synth_cmd(
    corpus: Annotated[
        Path,
        typer.Option(
            "--corpus", help="The passages (JSON lines {id, text}, the index build shape)."
        ),
    ],
    out: Annotated[
        Path, typer.Option("--out", "-o", help="Folder for the queries and candidates.")
    ],
    shots: Annotated[
        Path | None,
        typer.Option(
            "--shots",
            help="Real examples: query<TAB>passage, MS MARCO triples or JSON lines {query, "
            "passage} (default: the MS MARCO training triples of $CISRANK_DATA_DIR).",
        ),
    ] = None,
    first_stage: Annotated[
        list[Path] | None,
        typer.Option(
            "--first-stage",
            help="Index folder whose top --depth are a query's candidates (repeat to fuse by "
            "RRF; default: BM25 over the corpus, in memory).",
        ),
    ] = None,
    filter_teacher: Annotated[
        str | None,
        typer.Option("--filter-teacher", help=f"With --filter teacher: {teacher_list()}."),
    ] = None,
    filter_model: Annotated[
        str | None, typer.Option("--filter-model", help="The filter teacher's model.")
    ] = None,
    held_out: Annotated[
        str,
        typer.Option(
            "--held-out",
            help="Query sets (names under $CISRANK_DATA_DIR, or topics files) whose queries are "
            "never kept: a written query equal to one of theirs (case and spacing aside) is "
            "dropped as held-out. The project's recipe passes trec-dl19,trec-dl21.",
        ),
    ] = "",
    *,
    synth: dict[str, Any],
    workers: WorkerOptions,
    quiet: QuietOpt = False,
) -> None:
    """Write training queries from a corpus's own passages with a causal LM (few-shot), keep those
    whose passage the first stage (or a teacher) ranks first again, and save topics, candidates
    and qrels that `distill generate` and `distill train` read (resumable)."""
    from cisrank.distill.synth import synthesize
    from cisrank.distill.trainset import default_shots

    config = SynthConfig().replace(**synth)
    spec = None if filter_teacher is None else TeacherSpec.of(filter_teacher, filter_model)
    held = {name: _held_out_queries(name) for name in _names(held_out)}
    summary = synthesize(
        corpus,
        out,
        config,
        shots=shots or default_shots(),
        first_stage=first_stage or (),
        teacher=spec,
        held_out=held,
        workers=workers,
        progress=not quiet,
    )
    dropped = ", ".join(f"{k} {v}" for k, v in summary["dropped"].items()) or "none"
    typer.echo(
        f"{out}: {summary['kept']} of {summary['written']} queries kept "
        f"({summary['kept_passages']} of {summary['sampled_passages']} passages); dropped: {dropped}"
    )


def _held_out_queries(name: str) -> list[str]:
    """The queries of `--held-out`'s `name`: a topics file where one is, else a named set."""
    from cisrank.data.datasets import load_named, read_topics

    path = Path(name)
    if path.is_file():
        return list(read_topics(path).values())
    return list(load_named(name, require_qrels=False).topics.values())


@distill_app.command("pack")
def pack_cmd(
    component: Annotated[
        list[str],
        typer.Option(
            "--component",
            help="NAME=FOLDER: a teacher component (cis, dense, ...) as a distill generate "
            "output; repeat for each, all over the same pairs.",
        ),
    ],
    out: Annotated[Path, typer.Option("--out", "-o", help="The teacher set's Parquet file.")],
    pool: Annotated[
        Path | None,
        typer.Option("--pool", help="Texts: the training pool folder (distill pool) ..."),
    ] = None,
    dataset: Annotated[
        str | None, typer.Option("--dataset", help="... or the named dataset the pairs are from.")
    ] = None,
    note: Annotated[str, typer.Option("--note", help="Recorded in the provenance.")] = "",
    with_queries: Annotated[
        bool,
        typer.Option(
            "--with-queries",
            help="Carry each pair's query text (queries distill synth wrote, which no data "
            "folder holds); passages are still joined back by id.",
        ),
    ] = False,
) -> None:
    """Pack teacher components into one compact teacher set (ids, ranks, scores, provenance; no
    text) that the repository can carry and `distill train --teacher-set` reads."""
    from cisrank.distill.teacher_set import pack
    from cisrank.errors import DataError

    if (pool is None) == (dataset is None):
        raise DataError("say where the texts are: --pool FOLDER or --dataset NAME")
    parts = {}
    for spec in component:
        name, sep, folder = spec.partition("=")
        if not sep or not name or not folder:
            raise DataError(f"--component {spec!r}: expected NAME=FOLDER")
        parts[name] = folder
    texts: dict[str, str] = {"pool": str(pool)} if pool is not None else {"dataset": str(dataset)}
    ts = pack(parts, out, texts, note, with_queries=with_queries)
    size = out.stat().st_size
    typer.echo(
        f"{out}: {len(ts)} pairs of {ts.provenance['queries']} queries, components "
        f"{', '.join(ts.components)}, {size / 1e6:.2f} MB"
    )


@distill_app.command("ship")
def ship_cmd(
    student: Annotated[
        Path,
        typer.Option("--student", help="The float32 student folder (make student: out/student)."),
    ] = Path("out/student"),
    out: Annotated[
        Path | None,
        typer.Option(
            "--out",
            "-o",
            help="Where the shipped files go (default: the package's "
            "cisrank/models/shipped/cisrank-student).",
        ),
    ] = None,
    check: Annotated[
        bool,
        typer.Option(
            "--check",
            help="Write nothing: make the files in a temporary folder and compare their sha256 "
            "with --out's (exit 0 the same, 1 not).",
        ),
    ] = False,
) -> None:
    """Turn a trained student into the float16 files cisrank ships as `cisrank-student`
    (deterministic: the same student gives the same sha256), or check that the shipped files
    are that student's (`--check`)."""
    from cisrank.distill.ship import check_shipped, ship_student
    from cisrank.models.shipped import student_folder

    target = out if out is not None else student_folder()
    if check:
        diffs = check_shipped(student, target)
        if diffs:
            typer.echo(f"{target} is not made from {student}:", err=True)
            for line in diffs:
                typer.echo(f"  {line}", err=True)
            raise typer.Exit(1)
        typer.echo(f"{target}: every file has the same sha256 as the one made from {student}")
        return
    shipped = ship_student(student, target)
    typer.echo(
        f"shipped {student} -> {shipped.folder} ({shipped.bytes / 1e6:.1f} MB, "
        f"{WEIGHTS_NOTE}; model.safetensors sha256 {shipped.files['model.safetensors'][:16]}...)"
    )


WEIGHTS_NOTE = "float16 weights, widened to float32 on load"


@distill_app.command("train")
@takes(training=TRAIN_FLAGS)
def train_cmd(
    out: Annotated[Path, typer.Option("--out", "-o", help="Folder for the trained student.")],
    data: Annotated[
        list[Path] | None, typer.Option("--data", help="generate output folder (repeatable).")
    ] = None,
    teacher_set: Annotated[
        list[Path] | None,
        typer.Option(
            "--teacher-set",
            help="A packed teacher set (distill pack; repeatable); PATH@N trains on N of its "
            "queries, drawn by --seed (a larger N of the same seed holds a smaller one's).",
        ),
    ] = None,
    pool: Annotated[
        Path | None,
        typer.Option(
            "--pool",
            help="The training pool folder whose texts teacher sets name (default: the folder "
            "each set recorded).",
        ),
    ] = None,
    *,
    training: dict[str, Any],
    resume: Annotated[
        bool, typer.Option("--resume", help="Continue from the last checkpoint.")
    ] = False,
    keep_checkpoints: Annotated[
        bool,
        typer.Option(
            "--keep-checkpoints",
            help="Keep OUT/checkpoints (the best and the last) instead of deleting them at the "
            "end, e.g. to average or compare them.",
        ),
    ] = False,
    device: DeviceOpt = None,
) -> None:
    """Train a CrossEncoder on teacher rows or teacher sets (MSE, margin-MSE or listwise)."""
    from cisrank.distill.train import student_kind, train

    cfg = _config(training)
    record = train(
        data or [],
        out,
        cfg,
        _dev(cfg.dev_dataset),
        teacher_sets=teacher_set or [],
        pool=pool,
        resume=resume,
        keep_checkpoints=keep_checkpoints,
        device=device,
    )
    typer.echo(
        f"{out}: {record['examples']} examples, {record['train_seconds']:.0f} s; "
        f"best dev nDCG@10 {record['best_dev_metric']}; serve it with "
        f"`cisrank serve --reranker {student_kind(cfg)} --model {out}`"
    )


@distill_app.command("run")
@teacher_flags
@takes(training=RUN_TRAIN_FLAGS)
def run_cmd(
    out: Annotated[Path, typer.Option("--out", "-o", help="Folder for every stage's output.")],
    train_dataset: Annotated[
        list[str] | None,
        typer.Option("--train-dataset", help=field_help(RunPlan, "train_datasets")),
    ] = None,
    triples: Annotated[
        Path | None, typer.Option("--triples", help=field_help(RunPlan, "triples"))
    ] = None,
    eval_dataset: Annotated[
        str | None, typer.Option("--eval-dataset", help=field_help(RunPlan, "eval_dataset", ""))
    ] = None,
    teacher: TeacherOpt = "cis",
    model: TeacherModelOpt = None,
    batch_size: BatchOpt = None,
    depth: RunDepthOpt = None,
    *,
    training: dict[str, Any],
    device: DeviceOpt = None,
    quiet: QuietOpt = False,
    **options: Any,
) -> None:
    """Teacher scoring -> training -> evaluation (nDCG@10, Spearman to the teacher)."""
    from cisrank.distill.pipeline import distill_run
    from cisrank.distill.teachers import load_teacher

    plan = RunPlan().replace(
        train_datasets=train_dataset or None,
        triples=triples,
        eval_dataset=eval_dataset,
        depth=depth,
    )
    t = load_teacher(teacher, model, batch_size=batch_size, device=device, **options)
    cfg = _config(training)
    summary = distill_run(plan, t, cfg, out, device=device, progress=not quiet)
    typer.echo(json.dumps(summary, indent=2))
