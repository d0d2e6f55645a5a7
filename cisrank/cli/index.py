"""`cisrank index build KIND --corpus FILE --out DIR [...]`, `cisrank index info DIR` and
`cisrank index verify DIR`.

Each `build` command only turns its flags into the kind's `params` and calls
`cisrank.indexes.build.build_index`, which validates them through the kind's `IndexConfig` and owns
the interrupt-safe protocol. Kinds, their one-line help and every parameter default come from
`cisrank.indexes.kinds` and the config classes; a flag left out is None, which means "the config's
default", so a default is written once. A new kind is its record there plus a command here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer

from cisrank.cli.config_flags import config_flags
from cisrank.cli.defaults import config_flag
from cisrank.cli.options import (
    CHUNK_FLAGS,
    ENGINE_FLAGS,
    WORKER_FLAGS,
    ChunkChanges,
    Engine,
    FlagGroup,
    takes,
)
from cisrank.indexes.kinds import KINDS
from cisrank.indexes.prior import DEFAULT_BATCH_SIZE, DEFAULT_SHARD_SIZE, PriorIndexConfig
from cisrank.jobs.pool import WorkerOptions
from cisrank.retrieval.bm25 import BM25IndexConfig
from cisrank.retrieval.dense import DenseIndexConfig
from cisrank.retrieval.lucene import LuceneIndexConfig

index_app = typer.Typer(
    help=f"Offline index build jobs ({', '.join(KINDS)}) and their manifests.",
    no_args_is_help=True,
)
build_app = typer.Typer(
    help="Build an index from a corpus (jsonl, tsv or TREC DL candidates json). The folder gets "
    "manifest.json last; an interrupted build is resumed or restarted by rerunning it.",
    no_args_is_help=True,
)
index_app.add_typer(build_app, name="build")

CorpusOpt = Annotated[
    Path,
    typer.Option(
        "--corpus",
        help="Corpus file: .jsonl ({id, text, title?}), .tsv (id<TAB>text) or a TREC DL "
        "candidates .json (its distinct passages); .gz allowed.",
    ),
]
OutOpt = Annotated[Path, typer.Option("--out", help="Index folder to create.")]
FormatOpt = Annotated[
    str | None,
    typer.Option("--format", help="jsonl, tsv or candidates (default: from the file name)."),
]
OnErrorOpt = Annotated[
    str,
    typer.Option(
        "--on-error",
        help="raise: stop at the first bad line, naming it; skip: skip bad lines and count "
        "them in the manifest.",
    ),
]
OverwriteOpt = Annotated[
    bool, typer.Option("--overwrite", help="Rebuild over a complete index in --out.")
]
QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar.")]
DeviceOpt = Annotated[str | None, typer.Option("--device", help="cpu, cuda, ... (default: auto).")]


@dataclass(frozen=True)
class _Build:
    """How every `index build` verb reads its corpus and writes its folder."""

    fmt: FormatOpt = None
    on_error: OnErrorOpt = "raise"
    overwrite: OverwriteOpt = False
    quiet: QuietOpt = False


BUILD_FLAGS = FlagGroup(_Build)


def _run(
    kind: str,
    corpus: Path,
    out: Path,
    params: dict[str, Any],
    build: _Build,
    options: dict[str, Any] | None = None,
) -> None:
    from cisrank.errors import CisrankError
    from cisrank.indexes.build import build_index

    if build.on_error not in ("raise", "skip"):
        raise CisrankError(f"--on-error must be raise or skip, not '{build.on_error}'")
    manifest = build_index(
        kind,
        corpus,
        out,
        params,
        fmt=build.fmt,  # type: ignore[arg-type]
        on_error=build.on_error,  # type: ignore[arg-type]
        overwrite=build.overwrite,
        progress=not build.quiet,
        options=options,
    )
    c = manifest.corpus
    skipped = sum(c["skipped"].values())
    typer.echo(
        f"built {kind} index of {c['passages']} passages in {out} "
        f"({manifest.build['seconds']:.1f}s"
        + (f", {skipped} bad lines skipped" if skipped else "")
        + (", resumed" if manifest.build.get("resumed") else "")
        + ")"
    )


def _command(kind: str):
    return build_app.command(kind, help=KINDS[kind].summary)


_BM25_TEXTS = {"k1": "BM25 k1.", "b": "BM25 b."}


def _params_command(kind: str, flags: FlagGroup[dict[str, Any]]) -> None:
    """`index build KIND` for a kind that needs only its parameters (`flags`, a config's fields)
    besides the corpus, the folder and the build flags."""

    @_command(kind)
    @takes(params=flags, build=BUILD_FLAGS)
    def command(corpus: CorpusOpt, out: OutOpt, *, params: dict[str, Any], build: _Build) -> None:
        _run(kind, corpus, out, params, build)


_params_command(
    "bm25",
    config_flags(BM25IndexConfig, ["k1", "b", "stopwords", "stemmer"], texts=_BM25_TEXTS),
)
_params_command(
    "lucene", config_flags(LuceneIndexConfig, ["k1", "b", "threads"], texts=_BM25_TEXTS)
)

DENSE_FLAGS = config_flags(
    DenseIndexConfig,
    [
        "model",
        "index_type",
        "batch_size",
        "shard_size",
        "normalize",
        "max_seq_length",
        "query_prefix",
        "passage_prefix",
        "hnsw_m",
        "ivf_nlist",
        "ivf_nprobe",
        "backend",
        "dtype",
    ],
    aliases={"model": ["-m"]},
)


@_command("dense")
@takes(params=DENSE_FLAGS, engine=ENGINE_FLAGS, build=BUILD_FLAGS)
def build_dense(
    corpus: CorpusOpt,
    out: OutOpt,
    params: dict[str, Any],
    device: DeviceOpt = None,
    *,
    engine: Engine,
    build: _Build,
) -> None:
    options = {"device": device, "engine": engine.name, "ray": engine.ray}
    _run("dense", corpus, out, params, build, options)


@_command("prior")
@takes(engine=ENGINE_FLAGS, workers=WORKER_FLAGS, chunking=CHUNK_FLAGS, build=BUILD_FLAGS)
def build_prior(
    corpus: CorpusOpt,
    out: OutOpt,
    model: Annotated[str, config_flag(PriorIndexConfig, "model", "--model", "-m")],
    max_doc_tokens: Annotated[
        int | None, config_flag(PriorIndexConfig, "max_doc_tokens", "--max-doc-tokens")
    ] = None,
    batch_size: Annotated[
        int | None,
        typer.Option(
            "--batch-size",
            help="Passages looked up, scored and stored together "
            f"(default {DEFAULT_BATCH_SIZE}); not part of the index, so a rerun with another "
            "value still resumes.",
        ),
    ] = None,
    dtype: Annotated[str | None, config_flag(PriorIndexConfig, "dtype", "--dtype")] = None,
    backend: Annotated[str | None, config_flag(PriorIndexConfig, "backend", "--backend")] = None,
    device: DeviceOpt = None,
    *,
    engine: Engine,
    shard_size: Annotated[
        int | None,
        typer.Option(
            "--shard-size",
            min=1,
            help=f"--engine ray: passages per shard, the unit an actor scores and a rerun "
            f"keeps (default {DEFAULT_SHARD_SIZE}).",
        ),
    ] = None,
    workers: WorkerOptions,
    chunking: ChunkChanges,
    build: _Build,
) -> None:
    """CIS priors: log p(K) of every window of every passage, cut as the reranker's chunking
    cuts it (the --chunk-* flags and --max-chunks-per-doc: give the same to serve or rerank).
    --engine local fills OUT/priors.sqlite (a prior store); --engine ray writes the Parquet
    prior table OUT/priors.parquet. Either file, or the folder, is what --prior-store takes."""
    if shard_size is not None and engine.ray is None:
        from cisrank.errors import CisrankError

        raise CisrankError("--shard-size needs --engine ray")
    from cisrank.rerank.chunking import Chunking

    params: dict[str, Any] = {
        "model": model,
        "max_doc_tokens": max_doc_tokens,
        "dtype": dtype,
        "backend": backend,
        "chunking": chunking.over(Chunking()),
    }
    from cisrank.jobs.pool import for_device, set_threads

    pool = for_device(workers, device)
    set_threads(pool.threads_per_worker)
    options = {
        "device": device,
        "batch_size": batch_size,
        "engine": engine.name,
        "ray": engine.ray,
        "shard_size": shard_size,
        "workers": pool if engine.ray is None else None,
    }
    _run("prior", corpus, out, params, build, options)


@index_app.command("info")
def info(
    path: Annotated[Path, typer.Argument(help="Index folder.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print manifest.json as is.")] = False,
) -> None:
    """Print an index's manifest: kind, parameters, corpus, model, libraries, build."""
    from cisrank.data.manifest import read_manifest

    m = read_manifest(path)
    if as_json:
        typer.echo(json.dumps(m.to_json(), indent=2, ensure_ascii=False))
        return
    c = m.corpus
    lines = [
        f"index     {path}",
        f"kind      {m.kind}",
        f"params    {json.dumps(m.params, sort_keys=True)}",
        f"corpus    {c['path']} ({c['format']}, {c['passages']} passages, "
        f"{c['size_bytes']} bytes, sha256 {c['sha256'][:16]}...)",
    ]
    if sum(c.get("skipped", {}).values()):
        lines.append(f"skipped   {json.dumps(c['skipped'])}")
    if m.model:
        lines.append(
            f"model     {m.model.get('name')} (fingerprint {str(m.model.get('fingerprint'))[:16]}..."
            + (f", dim {m.model['dimension']}" if m.model.get("dimension") is not None else "")
            + (f", {m.model['dtype']}" if m.model.get("dtype") else "")
            + ")"
        )
    if m.kind == "prior" and m.build.get("engine") == "ray":
        b = m.build
        lines.append(
            f"priors    {b.get('priors_stored')} in a Parquet prior table, by Ray "
            f"({b.get('actors')} actors, {b.get('shards')} shards of {b.get('shard_size')}, "
            f"{b.get('shards_reused')} reused), store fingerprint "
            f"{str((m.model or {}).get('store_fingerprint'))[:16]}..."
        )
    elif m.kind == "prior":
        b = m.build
        lines.append(
            f"priors    {b.get('priors_stored')} stored ({b.get('priors_computed')} computed, "
            f"{b.get('priors_reused')} reused), store fingerprint "
            f"{str((m.model or {}).get('store_fingerprint'))[:16]}..."
        )
    libs = ", ".join(f"{k} {v}" for k, v in m.libraries.items() if v)
    lines += [
        f"libraries {libs}",
        f"built     {m.build.get('finished_at')} in {m.build.get('seconds')}s"
        + (" (resumed)" if m.build.get("resumed") else ""),
        f"files     {', '.join(m.files)}",
    ]
    typer.echo("\n".join(lines))


@index_app.command("verify")
def verify(
    paths: Annotated[list[Path], typer.Argument(help="Index folder(s).")],
) -> None:
    """Check every file of an index against the sizes and checksums its manifest recorded.

    Prints one line per file (OK or DAMAGED, with the damaged byte range). Exit code 0: intact;
    1: built before checksums were recorded, so only whether it opens could be checked; 2: a
    file is damaged or missing (restore it or rebuild the index). Reads every byte: about
    1.3 GB/s per core, on up to 8 cores.
    """
    from cisrank.indexes.integrity import verify_index

    code = 0
    for path in paths:
        report = verify_index(path)
        m = report.manifest
        typer.echo(f"{path}: {m.kind} index, {len(report.checks)} files")
        for c in report.checks:
            label = {"ok": "OK", "unverified": "UNCHECKED"}.get(c.status, c.status.upper())
            typer.echo(f"  {label:<9} {c.name}" + (f": {c.detail}" if c.detail else ""))
        if report.damaged:
            typer.echo(
                f"{path}: DAMAGED ({len(report.damaged)} of {len(report.checks)} files): "
                "restore them or rebuild the index",
                err=True,
            )
            code = 2
        elif not report.recorded:
            typer.echo(
                f"{path}: no checksums recorded (built by an older cisrank): only whether its "
                "files load was checked, not their bytes; rebuild it to record them",
                err=True,
            )
            code = max(code, 1)
        else:
            typer.echo(f"{path}: intact")
    if code:
        raise typer.Exit(code)
