"""The offline prior job: log p(K) of every passage of a corpus, computed once into a prior store.

CIS = log p(K|Q) - log p(K), and log p(K) depends on the passage alone. Left to query time, it
doubles the forward passes of every first sighting of a passage; computed offline, once per corpus
and on whatever accelerator is at hand, it leaves only the conditional term on the hot path.

The job is the index kind `prior` (`cisrank index build prior`), run by the interrupt-safe driver of
`cisrank.indexes.build`. Its one file, `priors.sqlite`, is a `PriorStore` filled through the CIS
reranker's own prior path (`CISReranker.summed_log_priors`: look the batch up, score the misses from
[BOS], write them back), so the keys (hash of the truncated token ids) and the namespace
(`store_fingerprint`: model, tokenizer, compute dtype, `max_doc_tokens`) are by construction the
ones a `CISReranker` with the same model, dtype and `max_doc_tokens` looks up: the file is used
as is with `--prior-store`. The template and `normalize` do not enter: priors are stored as summed
log-probabilities and normalized when read.

Resume needs no bookkeeping of its own. Entries are content-addressed and each batch is committed
in one transaction, so a rerun after an interruption looks every batch up, finds what the
interrupted run committed and computes only the rest.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from itertools import islice
from pathlib import Path
from typing import ClassVar

from pydantic import Field, field_validator
from tqdm.auto import tqdm

from cisrank.data.corpus import CorpusReader
from cisrank.data.manifest import BuildOutput, library_versions
from cisrank.errors import CisrankError
from cisrank.retrieval.base import IndexConfig

log = logging.getLogger(__name__)

PRIOR_FILE = "priors.sqlite"
DEFAULT_BATCH_SIZE = 256


class PriorIndexConfig(IndexConfig):
    """Parameters that change the stored values; a change between an interrupted run and its
    rerun starts clean. How the job runs (device, batch sizes) is passed as options instead, so
    that a rerun with another batch size or device still resumes."""

    label: ClassVar[str] = "prior"
    unknown_hint: ClassVar[str] = (
        " (batch_size, batch_tokens and device are options of the build, not parameters)"
    )

    model: str | None = Field(
        default=None,
        validate_default=True,
        description="Causal LM of the CIS reranker: hub id or folder (required).",
    )
    max_doc_tokens: int = Field(
        default=512, ge=1, description="Passage tokens kept; must match the reranker's."
    )
    dtype: str | None = Field(
        default=None,
        description="float32, bfloat16, float16 (default: the device's, as the reranker picks "
        "it); part of the store's key, so it must match the reranker's.",
    )

    @field_validator("model", mode="before")
    @classmethod
    def _model_given(cls, model: object) -> str:
        # No default model is a safe guess: priors of the wrong model are silently useless.
        if model is None or not str(model).strip():
            raise CisrankError("the prior index needs a causal LM: pass --model (hub id or folder)")
        return str(model)


def _batched(items: Iterable[str], size: int) -> Iterator[list[str]]:
    it = iter(items)
    while batch := list(islice(it, size)):
        yield batch


def build_prior(
    reader: CorpusReader,
    out: Path,
    config: PriorIndexConfig,
    *,
    resume: bool,
    progress: bool,
    device: str | None = None,
    batch_size: int | None = None,
    batch_tokens: int | None = None,
) -> BuildOutput:
    """Stream the corpus in batches and store log p(K) of every passage not stored yet.

    A passage is its `contents` (title and text), the text retrievers return for reranking.
    `batch_size` passages are looked up, scored and committed together, so at most one batch of
    work is lost to an interruption; `batch_tokens` bounds the padded tokens per forward pass
    (the engine's default when None). `resume` needs no handling: whatever an interrupted run
    committed is found in the store by its key and not computed again.
    """
    from cisrank.rerank.causal_lm import CausalLMEngine
    from cisrank.rerank.cis import CISReranker
    from cisrank.rerank.prior_store import PriorStore

    batch_size = DEFAULT_BATCH_SIZE if batch_size is None else int(batch_size)
    if batch_size < 1:
        raise CisrankError(f"batch_size must be >= 1, got {batch_size}")
    # The model first: a bad --model fails before any file of the index is written.
    engine = CausalLMEngine(
        config.model, device=device, dtype=config.dtype, batch_tokens=batch_tokens
    )
    store = PriorStore(out / PRIOR_FILE)
    try:
        reranker = CISReranker(
            config.model,
            max_doc_tokens=config.max_doc_tokens,
            normalize="sum",
            prior_store=store,
            engine=engine,
        )
        fingerprint = reranker.store_fingerprint
        stored_before = store.count(fingerprint)
        if stored_before:
            log.info("%s: %d priors already stored, computing the rest", out, stored_before)
        passages = 0
        with tqdm(desc="prior", unit="passage", disable=not progress) as bar:
            for texts in _batched((p.contents for p in reader), batch_size):
                # the reranker's own path: store lookup, misses scored from [BOS], written back
                reranker.summed_log_priors(reranker.passage_ids(texts))
                passages += len(texts)
                bar.set_postfix(reused=store.hits, computed=store.misses, refresh=False)
                bar.update(len(texts))
        stored = store.count(fingerprint)
        reused = store.hits
    finally:
        store.close()  # the last connection checkpoints the WAL: priors.sqlite is self-contained
    computed = stored - stored_before
    log.info("%s: %d passages, %d priors computed, %d reused", out, passages, computed, reused)
    return BuildOutput(
        files=[PRIOR_FILE],
        mutable=[PRIOR_FILE],  # a CIS reranker with --prior-store adds the priors it computes
        params={**config.model_dump(), "batch_size": batch_size, "batch_tokens": engine.batch_tokens},
        libraries=library_versions("transformers", "torch", "tokenizers"),
        model={
            "name": config.model,
            "fingerprint": engine.fingerprint(),
            "store_fingerprint": fingerprint,
            "dtype": str(engine.dtype).removeprefix("torch."),
            "device": str(engine.device),
        },
        extra={
            "passages": passages,
            "priors_computed": computed,
            "priors_reused": reused,
            "priors_stored": stored,
        },
    )
