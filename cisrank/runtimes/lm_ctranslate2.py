"""The CTranslate2 runtime of causal LMs: a causal LM converted once to CTranslate2, scored in
float32 or int8.

Why it exists: CTranslate2's int8 kernels are the ecosystem's fast CPU path for transformer
inference (VNNI and AVX-512 hosts gain most; on an AVX2 host without VNNI its int8 only matches
the torch engine per core: measured in bench/RESULTS.md, `bench/lm_backends.py`). It is an
optional extra (`pip install 'cisrank[ctranslate2]'`), never a default unless measured to pay.

How it keeps the engine's contract: `Generator.score_batch` returns log p(token_i | tokens_<i)
for every token after the first, with each row's own length (no padding enters a row), so the
scored span of a row is the tail of its log-probabilities. It keeps no state between calls, so
the engine feeds whole rows (`supports_prefix_cache = False`) and scores stay independent of the
batch. It does not decode.

Conversion runs once per model folder (`TransformersConverter`, float32 weights; the compute type
is chosen when loading) into a cache folder keyed by the source folder's files, written to a temp
folder and renamed into place, with the source model's torch fingerprint recorded so that prior
stores know which model and runtime computed a prior, and the size and sha256 of every file,
checked before every load (`cisrank.runtimes.checked_cache`: a damaged conversion is made again).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from cisrank import env
from cisrank.errors import CisrankError, MissingExtraError
from cisrank.runtimes import checked_cache
from cisrank.runtimes.lm import (
    ConvertedBackend,
    Reference,
    converted_options,
    folder_key,
    local_source,
    need_reference,
)
from cisrank.runtimes.table import CAUSAL_LM, compute_types

log = logging.getLogger(__name__)

PROVENANCE = "cisrank-ct2.json"


def import_ctranslate2() -> Any:
    try:
        import ctranslate2
    except ImportError as exc:
        raise MissingExtraError("ctranslate2", "ctranslate2", "--backend ctranslate2") from exc
    return ctranslate2


def converted_folder(
    source: str | Path, reference: Callable[[Path], Reference], cache: str | Path | None = None
) -> Path:
    """The CTranslate2 conversion of the Hugging Face folder `source`, made once (float32
    weights, its torch `reference`'s fingerprint recorded) and kept under `cache` (default:
    `<user cache>/cisrank/ctranslate2`)."""
    ct2 = import_ctranslate2()
    source = Path(source)
    root = Path(cache) if cache is not None else env.user_cache_dir() / "cisrank" / "ctranslate2"
    final = root / f"{source.name}-{folder_key(source)}"

    def convert(out: Path) -> dict[str, Any]:
        fingerprint = reference(source).fingerprint()
        log.info("converting %s to CTranslate2 (once) into %s", source, final)
        # the converter makes `out` itself and refuses one that exists
        out.rmdir()
        ct2.converters.TransformersConverter(str(source)).convert(str(out), quantization=None)
        return {"source": str(source), "source_fingerprint": fingerprint}

    checked_cache.cached_conversion(
        final,
        PROVENANCE,
        convert,
        required=("model.bin", "config.json"),
        what="CTranslate2 conversion",
    )
    return final


class CTranslate2Backend(ConvertedBackend):
    """A converted model (`converted_folder`) as an `LMBackend`, scoring only."""

    name = "ctranslate2"
    compute_types = compute_types(name, CAUSAL_LM)
    owner = "CTranslate2's"

    def __init__(
        self,
        folder: str | Path,
        tokenizer: Any,
        *,
        compute_type: str = "float32",
        threads: int = 0,
        model_name: str = "",
    ) -> None:
        super().__init__(folder, compute_type, model_name)
        ct2 = import_ctranslate2()
        self.tokenizer = tokenizer
        self.generator = ct2.Generator(
            str(self.folder), device="cpu", compute_type=compute_type, intra_threads=threads
        )
        config = json.loads((self.folder / "config.json").read_text(encoding="utf-8"))
        record = checked_cache.read_record(self.folder, PROVENANCE)
        self._provenance = checked_cache.identity(record)
        source = record["source"]
        hf = json.loads((Path(source) / "config.json").read_text(encoding="utf-8"))
        self.max_positions: int | None = hf.get("max_position_embeddings")
        self.num_layers = int(hf.get("num_hidden_layers", config.get("num_layers", 0)))
        self._config = json.dumps(config, sort_keys=True).encode()

    def identity(self) -> list[bytes]:
        """The source model's torch fingerprint and the converted config (the engine adds the
        runtime and compute type)."""
        return [self._provenance, self._config]

    def score_rows(
        self, rows: Sequence[Sequence[int]], context: Sequence[int], pad_id: int, cached: Any = None
    ) -> np.ndarray:
        self._no_prefix(cached)
        tokens = [self.tokenizer.convert_ids_to_tokens(list(row)) for row in rows]
        results = self.generator.score_batch(tokens, max_input_length=0)
        out: list[float] = []
        for row, ctx, res in zip(rows, context, results, strict=True):
            if ctx < 1:
                raise CisrankError("a scored span must follow at least one token (BOS)")
            log_probs = res.log_probs  # log p(row[i] | row[:i]) for i = 1 .. len(row) - 1
            if len(log_probs) != len(row) - 1:
                raise RuntimeError(
                    f"ctranslate2 scored {len(log_probs)} tokens of a {len(row)}-token row"
                )
            out.extend(log_probs[ctx - 1 :])
        return np.asarray(out, dtype=np.float32)


def load(
    model: str,
    compute_type: str | None,
    *,
    device: str | None = None,
    threads: int | None = None,
    reference: Callable[[Path], Reference] | None = None,
    options: dict[str, Any] | None = None,
    cache: str | Path | None = None,
) -> tuple[CTranslate2Backend, Any]:
    """The table's loader (`cisrank.runtimes.table`): (backend, tokenizer) for a model name or
    folder, resolved as the torch runtime resolves it, converted once, loaded in
    `compute_type` (float32 when None) on `threads` (torch's when None)."""
    from transformers import AutoTokenizer

    compute, threads = converted_options("ctranslate2", device, compute_type, threads)
    make = need_reference(reference, "ctranslate2")
    source = local_source(model, "ctranslate2")
    folder = converted_folder(source, make, cache)
    tokenizer = AutoTokenizer.from_pretrained(str(source))
    backend = CTranslate2Backend(
        folder, tokenizer, compute_type=compute, threads=threads, model_name=model
    )
    return backend, tokenizer
