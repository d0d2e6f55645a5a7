"""Embedded BM25 with bm25s: eager sparse scores, numba top-k, Lucene-like analysis.

bm25s precomputes every (term, document) score into a sparse matrix, so a query is a sum of a few
rows and a top-k: far faster than rank-bm25's per-query loop over documents. Its `lucene` method
is Lucene's BM25 (idf `log(1 + (N - df + 0.5)/(df + 0.5))`, tf `tf / (tf + k1 (1 - b + b dl/avgdl))`),
and with the analysis of `cisrank.retrieval.analysis` it ranks like pyserini. Defaults k1=0.9,
b=0.4 are pyserini's MS MARCO defaults.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import ClassVar

import numpy as np
from pydantic import Field
from tqdm.auto import tqdm

from cisrank.data.corpus import CorpusReader
from cisrank.data.manifest import BuildOutput, Manifest, library_versions
from cisrank.data.types import SearchHit
from cisrank.errors import CisrankError, DamagedFileError, require
from cisrank.retrieval.analysis import Analyzer, AnalyzerConfig
from cisrank.retrieval.base import IndexConfig
from cisrank.retrieval.docstore import DOCSTORE_FILE, DocStore, write_docstore

BM25_DIR = "bm25s"


class BM25Weights(IndexConfig):
    """BM25's k1 and b, shared by both BM25 engines (pyserini's MS MARCO defaults)."""

    k1: float = Field(default=0.9, ge=0.0, description="Term-frequency saturation.")
    b: float = Field(default=0.4, ge=0.0, le=1.0, description="Length normalization.")


class BM25IndexConfig(BM25Weights):
    """BM25 weights and the analysis chain: both are baked into the precomputed scores."""

    label: ClassVar[str] = "bm25"

    lowercase: bool = True
    stopwords: str = Field(
        default="lucene", description="lucene (Lucene's English stop set) or none."
    )
    stemmer: str = Field(
        default="porter", description="porter (Lucene's), english (Snowball) or none."
    )

    def analyzer(self) -> Analyzer:
        return Analyzer(AnalyzerConfig(self.lowercase, self.stopwords, self.stemmer))


def _bm25s():
    bm25s = require("bm25s", "dense", "the embedded BM25 index (bm25s)")
    # Its import sets its logger to DEBUG, which logs every build step: quiet it after that.
    logging.getLogger("bm25s").setLevel(logging.WARNING)
    return bm25s


NUMBA_MIN_DOCS = 20_000


def _backend(num_docs: int | None = None, requested: str = "auto") -> str:
    """numba when installed, except for small indexes: its JIT costs seconds once per process,
    more than numpy's scoring of a few thousand documents costs over a whole query set."""
    if requested != "auto":
        return requested
    try:
        import numba  # noqa: F401
    except ImportError:
        return "numpy"
    return "numpy" if num_docs is not None and num_docs < NUMBA_MIN_DOCS else "numba"


def build_bm25(
    reader: CorpusReader, out: Path, config: BM25IndexConfig, *, resume: bool, progress: bool
) -> BuildOutput:
    """Analyze, index with bm25s, save; write the document store. Cheap enough to never resume."""
    corpus = reader.load()
    model, vocab = _index(corpus.texts, config, progress)
    model.save(str(out / BM25_DIR), show_progress=False)
    write_docstore(out / DOCSTORE_FILE, zip(corpus.docids, corpus.texts, strict=True))
    return BuildOutput(
        files=[BM25_DIR, DOCSTORE_FILE],
        params=config.model_dump(),
        libraries=library_versions("bm25s", "PyStemmer", "numba", "numpy"),
        extra={"vocabulary": len(vocab)},
    )


def _index(texts: Sequence[str], config: BM25IndexConfig, progress: bool):
    """Analyze `texts` and index them with bm25s (Lucene's BM25): (model, vocabulary)."""
    bm25s = _bm25s()
    analyzer = config.analyzer()
    vocab: dict[str, int] = {}
    ids: list[list[int]] = []
    for text in tqdm(texts, desc="bm25 analyze", unit="passage", disable=not progress):
        ids.append([vocab.setdefault(t, len(vocab)) for t in analyzer.analyze(text)])
    model = bm25s.BM25(k1=config.k1, b=config.b, method="lucene", backend="numpy")
    model.index((ids, vocab), show_progress=False)  # its own bars: "bm25 analyze" is the one
    return model, vocab


def top_k(scores: np.ndarray, indices: np.ndarray, k: int) -> list[tuple[int, float]]:
    """Matching documents only (score > 0), best first, ties by lower document number (Lucene's)."""
    pairs = [(int(i), float(s)) for i, s in zip(indices, scores, strict=True) if s > 0]
    pairs.sort(key=lambda p: (-p[1], p[0]))
    return pairs[:k]


class BM25Retriever:
    """Searches a bm25s index folder built by `build_bm25`."""

    name = "bm25"

    def __init__(
        self, path: str | Path, manifest: Manifest, threads: int = 1, backend: str = "auto"
    ) -> None:
        bm25s = _bm25s()
        self.threads = threads
        self.path = Path(path)
        self.config = BM25IndexConfig.from_params(manifest.params)
        self.analyzer = self.config.analyzer()
        self.backend = _backend(int(manifest.corpus.get("passages", 0)), backend)
        try:
            self.model = bm25s.BM25.load(
                str(self.path / BM25_DIR), mmap=False, load_corpus=False, backend=self.backend
            )
            self.num_docs = int(self.model.scores["num_docs"])
        except (CisrankError, MemoryError):
            raise
        except Exception as exc:  # any failure to parse files this package wrote is damage
            raise DamagedFileError(
                self.path / BM25_DIR, f"bm25s cannot load it: {type(exc).__name__}: {exc}"
            ) from None
        self.docs = DocStore(self.path / DOCSTORE_FILE)
        if len(self.docs) != self.num_docs:
            raise DamagedFileError(
                self.path / DOCSTORE_FILE,
                f"{len(self.docs)} passages, but the bm25s index has {self.num_docs}",
            )

    def query_ids(self, query: str) -> list[int]:
        return self.model.get_tokens_ids(self.analyzer.analyze(query))

    def search(self, query: str, k: int = 10) -> list[SearchHit]:
        return self.batch_search([query], k)[0]

    def batch_search(self, queries: Sequence[str], k: int = 10) -> list[list[SearchHit]]:
        if k < 1:
            raise CisrankError(f"k must be >= 1, got {k}")
        ids = [self.query_ids(q) for q in queries]
        live = [i for i, q in enumerate(ids) if q]
        ranked: list[list[tuple[int, float]]] = [[] for _ in queries]
        depth = min(k + 1, self.num_docs)
        while live:
            # One candidate more than asked: when it ties with the k-th, the cut is ambiguous
            # (top-k selection keeps an arbitrary subset of tied documents), so those queries
            # are retrieved deeper until the cut is clean; ties then go to the lower document
            # number, as in Lucene, whatever the backend.
            res = self.model.retrieve(
                [ids[i] for i in live],
                k=depth,
                show_progress=False,
                n_threads=self.threads if self.threads > 1 else 0,
            )
            unresolved = []
            for row, qi in enumerate(live):
                scores = res.scores[row]
                # the group tied with the k-th best may extend past what was retrieved
                cut_tied = depth < self.num_docs and len(scores) > k and scores[k - 1] == scores[-1]
                if cut_tied and scores[-1] > 0:
                    unresolved.append(qi)
                else:
                    ranked[qi] = top_k(scores, res.documents[row], k)
            live = unresolved
            depth = min(depth * 4, self.num_docs)
        return [self._hits(r) for r in ranked]

    def _hits(self, ranked: list[tuple[int, float]]) -> list[SearchHit]:
        if not ranked:
            return []
        rows = self.docs.get([i for i, _ in ranked])
        return [SearchHit(d, s, t) for (d, t), (_, s) in zip(rows, ranked, strict=True)]


class MemoryBM25:
    """BM25 over passages held in memory, with no index folder: the analysis, weights and tie
    rule of a built index (`build_bm25`, `BM25Retriever`), for experiments over a small corpus
    (the RAG benchmark's "related" distractors). Scores every passage per query (exact)."""

    name = "bm25"

    def __init__(
        self,
        texts: Sequence[str],
        docids: Sequence[str] | None = None,
        config: BM25IndexConfig | None = None,
    ) -> None:
        if not texts:
            raise CisrankError("an in-memory BM25 index needs at least one passage")
        self.config = config or BM25IndexConfig()
        self.analyzer = self.config.analyzer()
        self.texts = list(texts)
        self.docids = [str(d) for d in docids] if docids is not None else None
        if self.docids is not None and len(self.docids) != len(self.texts):
            raise CisrankError(f"{len(self.docids)} docids for {len(self.texts)} passages")
        self.model, _ = _index(self.texts, self.config, progress=False)

    def scores(self, query: str) -> np.ndarray:
        """The BM25 score of every passage for `query` (0 where nothing matches)."""
        ids = self.model.get_tokens_ids(self.analyzer.analyze(query))
        if not ids:
            return np.zeros(len(self.texts), dtype=np.float32)
        return np.asarray(self.model.get_scores_from_ids(ids))

    def search(self, query: str, k: int = 10) -> list[SearchHit]:
        if k < 1:
            raise CisrankError(f"k must be >= 1, got {k}")
        scores = self.scores(query)
        ranked = top_k(scores, np.arange(len(scores)), k)
        return [
            SearchHit(self.docids[i] if self.docids is not None else str(i), s, self.texts[i])
            for i, s in ranked
        ]

    def batch_search(self, queries: Sequence[str], k: int = 10) -> list[list[SearchHit]]:
        return [self.search(q, k) for q in queries]
