"""The `cisrank` command. A stable contract: flags are documented, errors are one line and exit 2.

Verbs: `eval` (TREC DL evaluation of a reranker over first-stage candidates), `rerank` (rank
passages for one query), `version`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from cisrank.errors import CisrankError

app = typer.Typer(
    name="cisrank",
    help="Retrieval and reranking by causal relevance (CIS) for retrieval-augmented generation.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
eval_app = typer.Typer(
    help="Evaluate a reranker on TREC DL: first stage and reranked run side by side "
    "(nDCG@1/5/10, AP(rel=2), R(rel=2)@100 with ir_measures, trec_eval semantics).",
    no_args_is_help=True,
)
app.add_typer(eval_app, name="eval")

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
        "--template", help="CIS query template: plain, qa, or a custom string holding {query}."
    ),
]
PriorStoreOpt = Annotated[
    Path | None,
    typer.Option("--prior-store", help="CIS: SQLite file of stored log p(K) (created if absent)."),
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


def _reranker_options(
    template: str | None,
    prior_store: Path | None,
    max_doc_tokens: int | None,
    normalize: str | None,
    quantize: str | None = None,
) -> dict:
    """Reranker-specific flags (CIS, cross-encoder) as `load_reranker` keyword options; None
    values are dropped there, and a flag the chosen reranker does not take is an error there."""
    return {
        "template": template,
        "prior_store": str(prior_store) if prior_store is not None else None,
        "max_doc_tokens": max_doc_tokens,
        "normalize": normalize,
        "quantize": quantize,
    }


def _evaluate(
    name: str,
    data_dir: Path | None,
    reranker: str,
    model: str | None,
    depth: int,
    batch_size: int | None,
    output: Path | None,
    device: str | None,
    quiet: bool,
    as_json: bool,
    *,
    files: dict[str, Path | None] | None = None,
    reranker_options: dict | None = None,
    first_stage: list[Path] | None = None,
) -> None:
    from rich.console import Console

    from cisrank.eval import datasets
    from cisrank.eval.pipeline import RERANKED, run_eval
    from cisrank.eval.report import metrics_table
    from cisrank.rerank.registry import check_name, load_reranker

    check_name(reranker)
    if files is not None:
        dataset = datasets.load_local(name, **files)
    else:
        dataset = datasets.load_named(name, data_dir)
    if first_stage:
        from cisrank.retrieval.first_stage import with_first_stage

        dataset = with_first_stage(dataset, first_stage, depth)
    model_obj = load_reranker(
        reranker, model, batch_size=batch_size, device=device, **(reranker_options or {})
    )
    output = output or Path("out") / f"eval-{name}-{reranker}"
    result = run_eval(dataset, model_obj, depth=depth, output=output, progress=not quiet)
    if as_json:
        typer.echo(json.dumps(result.to_json(), indent=2))
        return
    console = Console()
    title = f"{name}: {len(dataset.qids)} queries, {sum(len(h) for h in dataset.candidates.values())} candidates"
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
    def command(
        data_dir: DataDirOpt = None,
        reranker: RerankerOpt = "none",
        model: ModelOpt = None,
        depth: DepthOpt = 100,
        batch_size: BatchOpt = None,
        output: OutputOpt = None,
        device: DeviceOpt = None,
        quiet: QuietOpt = False,
        as_json: JsonOpt = False,
        template: TemplateOpt = None,
        prior_store: PriorStoreOpt = None,
        max_doc_tokens: MaxDocTokensOpt = None,
        normalize: NormalizeOpt = None,
        first_stage: FirstStageOpt = None,
        quantize: QuantizeOpt = None,
    ) -> None:
        _evaluate(
            name,
            data_dir,
            reranker,
            model,
            depth,
            batch_size,
            output,
            device,
            quiet,
            as_json,
            reranker_options=_reranker_options(
                template, prior_store, max_doc_tokens, normalize, quantize
            ),
            first_stage=first_stage,
        )

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
def eval_run(
    data_dir: DataDirOpt = None,
    topics: Annotated[Path | None, typer.Option(help="topics file: qid<TAB>query")] = None,
    qrels: Annotated[Path | None, typer.Option(help="qrels file: qid Q0 docid grade")] = None,
    candidates: Annotated[
        Path | None,
        typer.Option(help="candidates JSON(.gz) with passage text, as in ../shared/data"),
    ] = None,
    name: Annotated[str | None, typer.Option(help="Dataset name in reports.")] = None,
    reranker: RerankerOpt = "none",
    model: ModelOpt = None,
    depth: DepthOpt = 100,
    batch_size: BatchOpt = None,
    output: OutputOpt = None,
    device: DeviceOpt = None,
    quiet: QuietOpt = False,
    as_json: JsonOpt = False,
    template: TemplateOpt = None,
    prior_store: PriorStoreOpt = None,
    max_doc_tokens: MaxDocTokensOpt = None,
    normalize: NormalizeOpt = None,
    first_stage: FirstStageOpt = None,
    quantize: QuantizeOpt = None,
) -> None:
    """Evaluate on any folder in the TREC DL layout, or on explicit topics/qrels/candidates files."""
    options = _reranker_options(template, prior_store, max_doc_tokens, normalize, quantize)
    if data_dir is None and candidates is None:
        raise CisrankError(
            "give --data-dir DIR, or --candidates FILE with --qrels FILE [--topics FILE]"
        )
    files = None
    if data_dir is None:
        files = {"topics": topics, "qrels": qrels, "candidates": candidates}
    label = name or (Path(data_dir).name if data_dir is not None else Path(candidates).parent.name)
    _evaluate(
        label,
        data_dir,
        reranker,
        model,
        depth,
        batch_size,
        output,
        device,
        quiet,
        as_json,
        files=files,
        reranker_options=options,
        first_stage=first_stage,
    )


def _read_passages(path: Path) -> tuple[list[str], list[str]]:
    """jsonl with `text` (and optional `id`), or one passage per line."""
    if not path.is_file():
        raise CisrankError(f"passages file '{path}' does not exist")
    texts, ids = [], []
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        if line.lstrip().startswith("{"):
            try:
                obj = json.loads(line)
                text = obj["text"]
            except (json.JSONDecodeError, KeyError, TypeError):
                raise CisrankError(
                    f"{path}:{lineno}: expected a JSON object with a 'text' field"
                ) from None
            if not isinstance(text, str) or not text.strip():
                raise CisrankError(f"{path}:{lineno}: 'text' must be a non-empty string")
            texts.append(text)
            ids.append(str(obj.get("id", len(ids))))
        else:
            texts.append(line)
            ids.append(str(len(ids)))
    if not texts:
        raise CisrankError(f"passages file '{path}' holds no passages")
    return texts, ids


@app.command("rerank")
def rerank(
    query: Annotated[str, typer.Option("--query", help="The query.")],
    passages: Annotated[
        Path,
        typer.Option(
            "--passages", help="jsonl with 'text' and optional 'id', or one passage per line."
        ),
    ],
    reranker: RerankerOpt = "dense",
    model: ModelOpt = None,
    top_n: Annotated[
        int | None, typer.Option("--top-n", min=1, help="Show only the best N.")
    ] = None,
    batch_size: BatchOpt = None,
    device: DeviceOpt = None,
    as_json: JsonOpt = False,
    template: TemplateOpt = None,
    prior_store: PriorStoreOpt = None,
    max_doc_tokens: MaxDocTokensOpt = None,
    normalize: NormalizeOpt = None,
    quantize: QuantizeOpt = None,
) -> None:
    """Rank passages for one query, most relevant first."""
    from cisrank.rerank.registry import NO_RERANKER, check_name, load_reranker

    if check_name(reranker) == NO_RERANKER:
        raise CisrankError("`rerank` needs a reranker: --reranker dense, ...")
    if not query.strip():
        raise CisrankError("--query is empty")
    texts, ids = _read_passages(passages)
    model_obj = load_reranker(
        reranker,
        model,
        batch_size=batch_size,
        device=device,
        **_reranker_options(template, prior_store, max_doc_tokens, normalize, quantize),
    )
    ranked = model_obj.rerank(query, texts, top_n=top_n)
    if as_json:
        rows = [
            {"rank": r, "index": p.index, "id": ids[p.index], "score": p.score, "text": p.text}
            for r, p in enumerate(ranked, 1)
        ]
        typer.echo(
            json.dumps(
                {
                    "query": query,
                    "reranker": reranker,
                    "model": model_obj.model_name,
                    "results": rows,
                },
                indent=2,
            )
        )
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{reranker} ({model_obj.model_name}): {query}")
    for col, justify in (
        ("rank", "right"),
        ("id", "left"),
        ("score", "right"),
        ("passage", "left"),
    ):
        table.add_column(col, justify=justify)
    for r, p in enumerate(ranked, 1):
        text = p.text if len(p.text) <= 100 else p.text[:97] + "..."
        table.add_row(str(r), ids[p.index], f"{p.score:.4f}", text)
    Console().print(table)


from cisrank.api.cli import serve as _serve  # noqa: E402  (REST API: `cisrank serve`)

app.command("serve")(_serve)

from cisrank.indexes.cli import index_app as _index_app  # noqa: E402  (`cisrank index ...`)
from cisrank.retrieval.cli import search as _search  # noqa: E402  (`cisrank search`)

app.add_typer(_index_app, name="index")
app.command("search")(_search)

from cisrank.distill.cli import distill_app as _distill_app  # noqa: E402  (`cisrank distill ...`)

app.add_typer(_distill_app, name="distill")


@app.command("version")
def version() -> None:
    """Print the versions of cisrank and its main dependencies."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as v

    for pkg in ("cisrank", "torch", "transformers", "sentence-transformers", "ir_measures"):
        try:
            typer.echo(f"{pkg} {v(pkg)}")
        except PackageNotFoundError:
            typer.echo(f"{pkg} not installed")


def main() -> None:
    from cisrank.log import setup_logging

    setup_logging()
    try:
        app()
    except CisrankError as exc:
        typer.echo(f"error: {exc}", err=True)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        typer.echo("interrupted", err=True)
        sys.exit(130)


if __name__ == "__main__":
    main()
