"""`cisrank eval trec-dl19 | trec-dl21 | run`: a reranker over first-stage candidates, evaluated.

Prints first stage and reranked run side by side with significance tests, and writes the runs,
metrics and per-query figures to `--output`. `cisrank eval rag` measures rerankers by the answers
their passages give (`cisrank.eval.rag`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypedDict

import typer

from cisrank.cli.options import (
    WORKER_FLAGS,
    BatchOpt,
    DataDirOpt,
    DepthOpt,
    DeviceOpt,
    FirstStageOpt,
    FlagGroup,
    JsonOpt,
    MissingOpt,
    ModelOpt,
    OutputOpt,
    QuietOpt,
    RerankerOpt,
    takes,
)
from cisrank.cli.reranker_flags import reranker_flags
from cisrank.errors import CisrankError
from cisrank.fusion import RRF_K
from cisrank.jobs.pool import WorkerOptions
from cisrank.rerank.spec import RerankerSpec

if TYPE_CHECKING:
    from cisrank.data.runs import Run
    from cisrank.data.types import Dataset
    from cisrank.eval.rag.run import RagEvalConfig

eval_app = typer.Typer(
    help="Evaluate a reranker on TREC DL: first stage and reranked run side by side "
    "(nDCG@1/5/10, RR(rel=2)@10 (MRR@10), AP(rel=2), R(rel=2)@100 with ir_measures, trec_eval semantics); "
    "or on RAG answers (eval rag): whose passages answer the question.",
    no_args_is_help=True,
)


class _Files(TypedDict):
    """Explicit dataset files, passed on to `datasets.load_local` as keywords."""

    topics: Path | None
    qrels: Path | None
    candidates: Path | None


@dataclass(frozen=True)
class _Evaluation:
    """What every `eval` verb's flags ask of an evaluation, besides the dataset."""

    reranker: RerankerOpt = "none"
    model: ModelOpt = None
    depth: DepthOpt = 100
    batch_size: BatchOpt = None
    output: OutputOpt = None
    device: DeviceOpt = None
    quiet: QuietOpt = False
    as_json: JsonOpt = False
    first_stage: FirstStageOpt = None
    missing: MissingOpt = "refuse"


EVAL_FLAGS = FlagGroup(_Evaluation)


def _evaluate(
    name: str,
    data_dir: Path | None,
    run: _Evaluation,
    pool: WorkerOptions,
    options: dict[str, Any],
    files: _Files | None = None,
) -> None:
    from rich.console import Console

    from cisrank.data import datasets
    from cisrank.eval.coverage import check_missing, describe, judged_to_evaluate
    from cisrank.eval.pipeline import RERANKED, run_eval
    from cisrank.eval.report import metrics_table
    from cisrank.rerank.registry import RerankerSpec

    spec = RerankerSpec.of(
        run.reranker, run.model, batch_size=run.batch_size, device=run.device, **options
    )
    check_missing(run.missing)
    if files is not None:
        dataset = datasets.load_local(name, **files)
    else:
        dataset = datasets.load_named(name, data_dir)
    if run.first_stage:
        from cisrank.indexes.first_stage import with_first_stage

        dataset = with_first_stage(dataset, run.first_stage, run.depth)
    _, coverage = judged_to_evaluate(dataset, run.missing)  # refused before any model loads
    # workers only once they pay for their start on the whole evaluation's pairs
    expected = sum(
        len(dataset.topics[qid]) + len(h.text)
        for qid in dataset.qids
        for h in dataset.candidates[qid][: run.depth]
    )
    model_obj = spec.build(pool, expected_chars=expected)
    output = run.output or Path("out") / f"eval-{name}-{run.reranker}"
    try:
        result = run_eval(
            dataset,
            model_obj,
            depth=run.depth,
            output=output,
            progress=not run.quiet,
            missing=run.missing,
        )
    finally:
        model_obj.close()
    if run.as_json:
        typer.echo(json.dumps(result.to_json(), indent=2))
        return
    console = Console()
    candidates = sum(len(h) for h in dataset.candidates.values())
    title = f"{name}: {len(dataset.qids)} queries, {candidates} candidates"
    if note := describe(coverage):
        title += f" ({note})"
    console.print(metrics_table(result.metrics, title=title))
    if result.significance:
        s = result.significance
        timing = result.info.get("timing", {})
        console.print(
            f"{RERANKED} vs first-stage on {s['measure']}: delta {s['mean_delta']:+.4f} "
            f"({s['wins']} up, {s['losses']} down, {s['ties']} tied), paired t-test p={s['p_ttest']:.3g}, "
            f"randomization p={s['p_randomization']:.3g}; "
            f"{timing.get('passages_per_s', 0):.1f} passages/s"
        )
    console.print(f"outputs in {output}/ (run.trec, metrics.json, per_query.tsv, plot)")


def _dataset_command(name: str, doc: str):
    @reranker_flags()
    @takes(run=EVAL_FLAGS, pool=WORKER_FLAGS)
    def command(
        data_dir: DataDirOpt = None, *, run: _Evaluation, pool: WorkerOptions, **options: Any
    ) -> None:
        _evaluate(name, data_dir, run, pool, options)

    command.__doc__ = doc
    eval_app.command(name)(command)


_dataset_command(
    "trec-dl19",
    "TREC DL 2019 passage (43 judged queries): rerank the BM25 top-100 and evaluate.",
)
_dataset_command(
    "trec-dl21",
    "TREC DL 2021 passage, MS MARCO v2 (53 judged queries): rerank the BM25 top-100 and evaluate.",
)


@eval_app.command("run")
@reranker_flags()
@takes(run=EVAL_FLAGS, pool=WORKER_FLAGS)
def eval_run(
    data_dir: DataDirOpt = None,
    topics: Annotated[Path | None, typer.Option(help="topics file: qid<TAB>query")] = None,
    qrels: Annotated[Path | None, typer.Option(help="qrels file: qid Q0 docid grade")] = None,
    candidates: Annotated[
        Path | None,
        typer.Option(
            help="candidates JSON(.gz) with passage text: [{query, hits: [{qid, docid, rank, "
            "score, content}]}], as candidates-bm25-top100.json of the TREC DL layout"
        ),
    ] = None,
    name: Annotated[str | None, typer.Option(help="Dataset name in reports.")] = None,
    *,
    run: _Evaluation,
    pool: WorkerOptions,
    **options: Any,
) -> None:
    """Evaluate on any folder in the TREC DL layout, or on explicit topics/qrels/candidates files."""
    if data_dir is None and candidates is None:
        raise CisrankError(
            "give --data-dir DIR, or --candidates FILE with --qrels FILE [--topics FILE]"
        )
    files: _Files | None = None
    if data_dir is None:
        files = _Files(topics=topics, qrels=qrels, candidates=candidates)
    if data_dir is not None:
        label = name or Path(data_dir).name
    else:
        assert candidates is not None  # checked above
        label = name or candidates.parent.name
    _evaluate(label, data_dir, run, pool, options, files)


@eval_app.command("fuse")
def eval_fuse(
    dataset: Annotated[
        str, typer.Argument(help="trec-dl19, trec-dl21, or a folder in the TREC DL layout.")
    ],
    run: Annotated[
        list[str],
        typer.Option(
            "--run",
            help="NAME=RUN.trec of a reranked run over the dataset's candidates (repeat); the "
            "first stage is there as 'first-stage'.",
        ),
    ],
    fuse: Annotated[
        str, typer.Option("--fuse", help="Runs and weights to fuse, e.g. 'cis:0.6,dense:0.4'.")
    ],
    fusion: Annotated[str, typer.Option("--fusion", help="linear or rrf.")] = "linear",
    normalize: Annotated[
        str, typer.Option("--fusion-normalize", help="linear: minmax or zscore per query.")
    ] = "minmax",
    rrf_k: Annotated[float, typer.Option("--rrf-k", min=0.0, help="RRF's k.")] = RRF_K,
    depth: DepthOpt = 100,
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="Folder for run.trec and metrics.json.")
    ] = None,
    data_dir: DataDirOpt = None,
    as_json: JsonOpt = False,
    missing: MissingOpt = "refuse",
) -> None:
    """Fuse saved runs exactly as `--reranker hybrid --fuse ... --fusion ...` would, in seconds,
    and print the first stage, every run and the fusion side by side."""
    from rich.console import Console

    from cisrank.data import datasets
    from cisrank.eval import metrics as M
    from cisrank.eval.coverage import check_missing, describe, judged_to_evaluate
    from cisrank.eval.report import metrics_table, write_metrics_json

    check_missing(missing)
    folder = Path(dataset)
    if data_dir is None and folder.is_dir():
        ds = datasets.load_named(folder.name, folder)
    else:
        ds = datasets.load_named(dataset, data_dir)
    qrels, coverage = judged_to_evaluate(ds, missing)
    runs = _saved_runs(ds, run)
    fused = _fuse_saved(runs, fuse, fusion, normalize, rrf_k, depth)
    runs["hybrid"] = fused
    figures = {name: M.evaluate(r, qrels) for name, r in runs.items()}
    report: dict[str, Any] = {"dataset": ds.name, "fuse": fuse, "fusion": fusion, "runs": figures}
    if "missing" in coverage:
        report["judged_not_run"] = {
            k: coverage[k] for k in ("missing", "no_topic", "no_candidates")
        }
    if output is not None:
        output.mkdir(parents=True, exist_ok=True)
        fused.write_trec(output / "run.trec", tag="cisrank-hybrid")
        write_metrics_json(output / "metrics.json", report)
    if as_json:
        typer.echo(json.dumps(report, indent=2))
        return
    note = describe(coverage)
    title = f"{ds.name}: {fuse} ({fusion})" + (f"; {note}" if note else "")
    Console().print(metrics_table(figures, title=title))


def _saved_runs(dataset: Dataset, specs: list[str]) -> dict[str, Run]:
    """`--run NAME=RUN.trec` (repeated) read, after the dataset's own first stage."""
    from cisrank.data.runs import Run
    from cisrank.eval.pipeline import FIRST_STAGE, first_stage_run

    runs = {FIRST_STAGE: first_stage_run(dataset)}
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep or not name or not path:
            raise CisrankError(f"--run {spec!r}: give NAME=RUN.trec")
        if name in runs:
            raise CisrankError(f"--run {name}: given twice (or it is the first stage's name)")
        runs[name] = Run.read_trec(path, name=name)
    return runs


def _fuse_saved(
    runs: dict[str, Run], fuse: str, fusion: str, normalize: str, rrf_k: float, depth: int
) -> Run:
    """The runs `--fuse` names, fused as the hybrid reranker fuses its components (the first
    stage in its input order, as the hybrid sees the candidates)."""
    from cisrank.eval.pipeline import FIRST_STAGE
    from cisrank.fusion import fuse_runs, input_order, parse_weights

    try:
        weights = parse_weights(fuse)
    except ValueError as exc:
        raise CisrankError(f"--fuse: {exc}") from None
    unknown = [n for n in weights if n not in runs]
    if unknown:
        raise CisrankError(f"--fuse names {', '.join(unknown)}: not among {', '.join(runs)}")
    try:
        parts = [input_order(runs[n]) if n == FIRST_STAGE else runs[n] for n in weights]
        return fuse_runs(parts, list(weights.values()), fusion, normalize, rrf_k, depth)
    except ValueError as exc:
        raise CisrankError(str(exc)) from None


def _rag_flag(field: str, *names: str, **option: Any) -> Any:
    from cisrank.cli.defaults import config_flag
    from cisrank.eval.rag.run import RagEvalConfig

    return config_flag(RagEvalConfig, field, *names, **option)


class _RagSample:
    """`eval rag`'s flags that pick the questions and their candidates (`RagEvalConfig` fields;
    None keeps the config's default)."""

    first: Annotated[int | None, _rag_flag("first", "--first", min=0)] = None
    limit: Annotated[int | None, _rag_flag("limit", "--limit", min=1)] = None
    candidates: Annotated[int | None, _rag_flag("candidates", "--candidates", min=1)] = None
    distractors: Annotated[str | None, _rag_flag("distractors", "--distractors")] = None
    skip_short: Annotated[bool | None, _rag_flag("skip_short", "--skip-short/--no-skip-short")] = (
        None
    )


RAG_SAMPLE_FLAGS: FlagGroup[dict[str, Any]] = FlagGroup(_RagSample, dict)


class _RagRerankers:
    """`eval rag`'s flags that name the rerankers measured."""

    rerankers: Annotated[
        list[Path] | None,
        typer.Option(
            "--rerankers",
            help="JSON or YAML {name: {kind, model, options}}, the schema of a server config's "
            "'rerankers' (a server config itself is read too; repeat for several files); "
            "first-stage (the candidates' own order) is always measured.",
        ),
    ] = None
    reranker: Annotated[
        list[str] | None,
        typer.Option(
            "--reranker",
            "-r",
            help="A reranker kind with its defaults, named by its kind (repeat).",
        ),
    ] = None
    only: Annotated[
        str | None,
        typer.Option(
            "--only", help="Measure only these rerankers of --rerankers (comma-separated)."
        ),
    ] = None


def _rag_rerankers(
    rerankers: list[Path] | None, reranker: list[str] | None, only: str | None
) -> dict[str, RerankerSpec]:
    """The rerankers measured besides first-stage, by name: those of the --rerankers files
    (--only's, where given), then each --reranker kind with its defaults."""
    from cisrank.rerank.spec import parse_specs, read_specs

    # first-stage is always measured: naming it in --only asks for nothing more
    wanted = None if only is None else [n.strip() for n in only.split(",") if n.strip()]
    wanted = None if wanted is None else [n for n in wanted if n != "first-stage"]
    if wanted is not None and not rerankers:
        raise CisrankError("--only selects rerankers of --rerankers FILE: give the file")
    specs = read_specs(rerankers, wanted) if rerankers else {}
    for kind in reranker or []:
        if kind in specs:
            raise CisrankError(f"--reranker {kind}: the name is taken by --rerankers")
        specs.update(parse_specs({kind: RerankerSpec(kind=kind).model_dump()}, "--reranker"))
    return specs


RAG_RERANKER_FLAGS = FlagGroup(_RagRerankers, _rag_rerankers)


class _RagAnswers:
    """`eval rag`'s flags of the answers' generation (`RagEvalConfig` fields; None keeps the
    config's default)."""

    top_k: Annotated[
        str | None,
        _rag_flag(
            "top_k",
            "--top-k",
            text="k values, e.g. 1,3,5: how many of a reranker's best passages go to the generator.",
        ),
    ] = None
    generator: Annotated[str | None, _rag_flag("generator", "--generator")] = None
    arrange: Annotated[str | None, _rag_flag("arrange", "--arrange")] = None
    template: Annotated[str | None, _rag_flag("template", "--template")] = None
    chat: Annotated[bool | None, _rag_flag("chat", "--chat/--no-chat")] = None
    max_new_tokens: Annotated[
        int | None, _rag_flag("max_new_tokens", "--max-new-tokens", min=1)
    ] = None
    baselines: Annotated[bool | None, _rag_flag("baselines", "--baselines/--no-baselines")] = None
    seed: Annotated[int | None, _rag_flag("seed", "--seed")] = None
    device: DeviceOpt = None
    dtype: Annotated[str | None, _rag_flag("dtype", "--dtype")] = None


RAG_ANSWER_FLAGS: FlagGroup[dict[str, Any]] = FlagGroup(_RagAnswers, dict)


@eval_app.command("rag")
@takes(
    sample=RAG_SAMPLE_FLAGS, specs=RAG_RERANKER_FLAGS, answers=RAG_ANSWER_FLAGS, pool=WORKER_FLAGS
)
def eval_rag(
    questions: Annotated[Path, _rag_flag("questions", "--questions")],
    *,
    sample: dict[str, Any],
    specs: dict[str, RerankerSpec],
    answers: dict[str, Any],
    output: Annotated[
        Path | None,
        typer.Option(
            "--output",
            "-o",
            help="Folder for metrics.json, per_question.jsonl, rag.png and the stored rankings "
            "and answers (default out/eval-rag).",
        ),
    ] = None,
    cache: Annotated[
        Path | None,
        typer.Option(
            "--cache",
            help="Where rankings and answers are stored (default OUTPUT/cache): share one "
            "between runs over the same questions (K = 10 and K = 20, retrieval then answers).",
        ),
    ] = None,
    resume: Annotated[
        bool,
        typer.Option(
            "--resume",
            help="Go on with the run in --output: what it stored is reused, only new rerankers, "
            "k values and questions are computed.",
        ),
    ] = False,
    versus: Annotated[
        str,
        typer.Option("--versus", help="The reranker the printed paired tests compare with."),
    ] = "first-stage",
    quiet: QuietOpt = False,
    as_json: JsonOpt = False,
    pool: WorkerOptions,
) -> None:
    """Which reranker's passages answer the question: gold recall@k, MRR, and the generator's
    accuracy, EM and F1 from each reranker's top k, with paired McNemar tests, on questions
    with a gold passage (NQ-Open oracle shape)."""
    from cisrank.eval.rag.run import RagEvalConfig, run_rag_eval

    config = RagEvalConfig(questions=questions).replace(**sample, **answers)
    folder = output or Path("out") / "eval-rag"
    result = run_rag_eval(
        config, specs, folder, cache=cache, workers=pool, resume=resume, progress=not quiet
    )
    if as_json:
        typer.echo(json.dumps(result.metrics, indent=2))
        return
    _print_rag(result.metrics, config, versus, folder)


def _print_rag(metrics: dict[str, Any], config: RagEvalConfig, versus: str, folder: Path) -> None:
    """The figures of every reranker at every k, then the paired tests against `versus` (of
    the answers' accuracy where answers were generated, else of gold recall)."""
    from rich.console import Console

    from cisrank.eval.rag.report import figures_table, tests_table

    if versus not in metrics["rerankers"]:
        raise CisrankError(f"--versus {versus}: not measured ({', '.join(metrics['rerankers'])})")
    console = Console()
    title = (
        f"{config.questions.name}: {metrics['questions']} questions, {config.candidates} "
        f"candidates ({config.distractors})"
        + (f", answers by {config.generator}" if config.generator else "")
    )
    console.print(figures_table(metrics, title))
    skipped = metrics.get("skipped") or []
    if skipped:
        console.print(
            f"{len(skipped)} question(s) left out, short of candidates (metrics.json 'skipped'), "
            f"e.g. {skipped[0]['reason']}"
        )
    answered = "baselines" in metrics or any(
        "accuracy" in row[str(k)] for row in metrics["rerankers"].values() for k in config.top_k
    )
    if len(metrics["rerankers"]) > 1 or answered:
        console.print(tests_table(metrics, versus, "accuracy" if answered else "gold_recall"))
    console.print(f"outputs in {folder}/ (metrics.json, per_question.jsonl, rag.png)")
