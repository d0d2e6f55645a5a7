"""Index kinds: one record per kind (how to build it, how to open it), and `open_index(path)`.

Building (`indexes.build`), opening (`open_index`), manifest checks and the CLI all read this
table, so adding a kind is one record here. Builders and openers are imported lazily: heavy extras
(pyserini, faiss, torch models) stay optional until a kind that needs them is used.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cisrank.data.manifest import Manifest, read_manifest
from cisrank.errors import CisrankError, DataError
from cisrank.retrieval.base import Retriever

Builder = Callable[..., Any]
"""`builder(corpus: CorpusReader, out: Path, params: dict, *, resume: bool, progress: bool,
**options) -> BuildOutput`: stream the corpus (`for passage in corpus`) or `corpus.load()` it
whole; either way it must read it to the end once, which leaves the validated statistics in
`corpus.stats`."""
Opener = Callable[..., Retriever]


@dataclass(frozen=True)
class IndexKind:
    """What cisrank knows about one kind of index folder."""

    name: str
    summary: str
    load_builder: Callable[[], Builder]
    load_opener: Callable[[], Opener] | None = None
    """None for folders that are not retrievers (the prior store)."""


def _bm25_builder() -> Builder:
    from cisrank.retrieval.bm25 import build_bm25

    return build_bm25


def _bm25_opener() -> Opener:
    from cisrank.retrieval.bm25 import BM25Retriever

    return BM25Retriever


def _lucene_builder() -> Builder:
    from cisrank.retrieval.lucene import build_lucene

    return build_lucene


def _lucene_opener() -> Opener:
    from cisrank.retrieval.lucene import LuceneRetriever

    return LuceneRetriever


def _dense_builder() -> Builder:
    from cisrank.retrieval.dense import build_dense

    return build_dense


def _dense_opener() -> Opener:
    from cisrank.retrieval.dense import DenseRetriever

    return DenseRetriever


def _prior_builder() -> Builder:
    from cisrank.indexes.prior import build_prior

    return build_prior


KINDS: dict[str, IndexKind] = {
    k.name: k
    for k in (
        IndexKind("bm25", "BM25 with bm25s (embedded)", _bm25_builder, _bm25_opener),
        IndexKind("lucene", "BM25 with Lucene through pyserini", _lucene_builder, _lucene_opener),
        IndexKind("dense", "bi-encoder embeddings in FAISS", _dense_builder, _dense_opener),
        IndexKind("prior", "CIS priors log p(K) of a corpus", _prior_builder),
    )
}


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
    """The retriever for a complete index folder; `options` go to the engine (e.g. device)."""
    path = Path(path).expanduser()
    manifest = read_index_manifest(path)
    kind = KINDS[manifest.kind]
    if kind.load_opener is None:
        retrievers = ", ".join(k.name for k in KINDS.values() if k.load_opener)
        raise CisrankError(
            f"'{path}' is a {manifest.kind} index, which is not a retriever "
            f"(retrievers: {retrievers})"
        )
    return kind.load_opener()(path, manifest, **options)
