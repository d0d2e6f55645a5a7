"""`open_index(path)`: read an index folder's manifest and open the engine that built it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from cisrank.errors import CisrankError
from cisrank.indexes.manifest import Manifest, read_manifest
from cisrank.retrieval.base import Retriever

Opener = Callable[..., Retriever]


def _open_bm25(path: Path, manifest: Manifest, **options) -> Retriever:
    from cisrank.retrieval.bm25 import BM25Retriever

    return BM25Retriever(path, manifest, **options)


def _open_lucene(path: Path, manifest: Manifest, **options) -> Retriever:
    from cisrank.retrieval.lucene import LuceneRetriever

    return LuceneRetriever(path, manifest, **options)


def _open_dense(path: Path, manifest: Manifest, **options) -> Retriever:
    from cisrank.retrieval.dense import DenseRetriever

    return DenseRetriever(path, manifest, **options)


OPENERS: dict[str, Opener] = {"bm25": _open_bm25, "lucene": _open_lucene, "dense": _open_dense}


def open_index(path: str | Path, **options) -> Retriever:
    """The retriever for a complete index folder; `options` go to the engine (e.g. device)."""
    path = Path(path).expanduser()
    manifest = read_manifest(path)
    opener = OPENERS.get(manifest.kind)
    if opener is None:
        raise CisrankError(
            f"'{path}' is a {manifest.kind} index, which is not a retriever "
            f"(retrievers: {', '.join(OPENERS)})"
        )
    return opener(path, manifest, **options)
