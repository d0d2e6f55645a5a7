"""Cross-encoder reranker: one transformer reads query and passage together and emits one logit.

Loads any sentence-transformers `CrossEncoder` folder with a single-logit sequence-classification
head (`num_labels=1`), such as the students written by our distillation training, and returns the
RAW logit: identity activation, no sigmoid, because the student regresses CIS / teacher scores.

The model runs on a runtime of the table (`cisrank.runtimes.table`, task `sequence-classification`):
torch (exact float32, bf16 with a float32 head, or torch's dynamic int8: `encoder_torch`) or ONNX
Runtime (`encoder_onnx`), `auto` choosing for the host (`cisrank.runtimes.auto`). Whatever the
runtime, the pairs are read and batched here, the same way:

- `score_batch` tokenizes every distinct (query, passage) pair of all requests in one call, so
  concurrent requests share model batches and a pair asked for twice is scored once;
- batches are cut from the pairs sorted by token length and padded by hand to their longest
  member (`cisrank.runtimes.batching`, shared with the CIS engine); CPU batches follow the
  runtime (`CPU_BATCH_SIZE`), GPU batches are large;
- the runtime returns each row's first logit (`EncoderBackend.logits`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from cisrank.errors import CisrankError
from cisrank.rerank.base import BaseReranker, PassageWindow, fast_only
from cisrank.rerank.configs import (
    CPU_BATCH_SIZE,
    GPU_BATCH_SIZE,
    CrossEncoderRerankerConfig,
    StudentRerankerConfig,
)
from cisrank.runtimes.auto import resolve_encoder_backend
from cisrank.runtimes.batching import LengthBatcher, dedupe, scatter
from cisrank.runtimes.encoder import EncoderBackend, Pads, model_input_names
from cisrank.runtimes.table import SEQUENCE_CLASSIFICATION, runtime


class CrossEncoderReranker(BaseReranker):
    """Scores (query, passage) pairs with a CrossEncoder's raw logit.

    Example:
        r = CrossEncoderReranker(model="out/student", quantize="int8")
        r = CrossEncoderReranker(model="out/student", backend="onnx", dtype="int8")
        r.score("When was the author of Hamlet born?", passages)
    """

    name = "cross-encoder"

    def __init__(
        self,
        model: str | None = None,
        *,
        config: CrossEncoderRerankerConfig | None = None,
        **options: Any,
    ) -> None:
        """`options` are `CrossEncoderRerankerConfig` fields."""
        self.config = (config or CrossEncoderRerankerConfig()).replace(model=model, **options)
        if not self.config.model:
            raise CisrankError(
                "the cross-encoder reranker needs a model: pass --model with a CrossEncoder "
                "folder (the one distillation training writes) or leave it unset for the "
                "student shipped with cisrank (cisrank-student)"
            )
        self.model_name = self.config.model
        c = self.config
        self.backend, dtype = resolve_encoder_backend(c.backend, c.device, c.dtype, c.quantize)
        self.config = c = c.replace(backend=self.backend, dtype=dtype)
        load = runtime(self.backend, SEQUENCE_CLASSIFICATION).load()
        self.runner: EncoderBackend = load(
            self.model_name,
            c.dtype,
            device=c.device,
            threads=torch.get_num_threads(),  # ONNX Runtime's: torch's (--threads-per-worker)
            max_length=c.max_length,
            options={"quantize": c.quantize},
        )
        self.device = self.runner.device
        self.dtype = self.runner.dtype
        self.compute_type = self.runner.compute_type
        self.runtime = self.runner.name
        self.tokenizer = self.runner.tokenizer
        self.max_length = c.max_length or self.runner.max_length
        positions = self.runner.max_positions
        if c.max_length and positions and c.max_length > positions:
            raise CisrankError(
                f"max_length {c.max_length} is over the {positions} positions of '{c.model}'"
            )
        on_gpu = self.device.type == "cuda"
        # dynamic int8 (torch's quantize="int8", ONNX Runtime's int8) scores one pair a batch
        cpu_batch = CPU_BATCH_SIZE["int8" if self.compute_type == "int8" else self.backend]
        self.batch_size = c.batch_size or (GPU_BATCH_SIZE if on_gpu else cpu_batch)
        self._input_names = model_input_names(self.tokenizer)
        self._pads = Pads(self.tokenizer)
        # Capabilities: the tokenizer the pairs are read with, and their truncation length.
        self.fast_tokenizer = fast_only(self.tokenizer)
        self.pair_token_limit = self.max_length
        if self.max_length:
            specials = self.tokenizer.num_special_tokens_to_add(pair=True)
            self.passage_window = PassageWindow(
                max(1, self.max_length - specials), self.fast_tokenizer, less_query=True
            )

    # ------------------------------------------------------------------ pieces
    def tokenize(self, pairs: Sequence[tuple[str, str]]) -> dict[str, list[list[int]]]:
        """Token ids (and token types) of each pair, unpadded, truncated longest-first."""
        enc = self.tokenizer(
            [q for q, _ in pairs],
            [p for _, p in pairs],
            truncation="longest_first",
            max_length=self.max_length,
            padding=False,
            return_attention_mask=False,
        )
        return {name: enc[name] for name in self._input_names if name in enc}

    def _score_unique(self, pairs: list[tuple[str, str]]) -> list[float]:
        enc = self.tokenize(pairs)
        lengths = [len(ids) for ids in enc["input_ids"]]
        batcher = LengthBatcher(batch_size=self.batch_size)
        runner = self.runner

        def run(rows: list[int]) -> list[float]:
            return runner.logits(self._pads.collate(enc, rows)).tolist()

        return batcher.run(lengths, run, 0.0, self.runner.lanes)

    def score_pairs(self, pairs: Sequence[tuple[str, str]]) -> list[float]:
        """Raw logit of each (query, passage) pair, input order; duplicates scored once."""
        if not pairs:
            return []
        unique, slots = dedupe(pairs)
        return scatter(self._score_unique(unique), slots)

    # ------------------------------------------------------------------ public API
    def score_batch(self, requests: Sequence[tuple[str, Sequence[str]]]) -> list[list[float]]:
        """All pairs of all requests in shared, length-sorted batches; results per request."""
        for _, passages in requests:
            if isinstance(passages, str):
                raise CisrankError("passages must be a list of strings, not one string")
        flat = [(q, p) for q, passages in requests for p in passages]
        scores = self.score_pairs(flat)
        out, start = [], 0
        for _, passages in requests:
            out.append(scores[start : start + len(passages)])
            start += len(passages)
        return out

    def __repr__(self) -> str:
        cls = type(self).__name__
        if self.backend != "torch":
            return (
                f"{cls}(model={self.model_name!r}, backend={self.backend!r}, "
                f"dtype={self.compute_type!r})"
            )
        return (
            f"{cls}(model={self.model_name!r}, device={str(self.device)!r}, "
            f"dtype={str(self.dtype).removeprefix('torch.')!r}, quantize={self.config.quantize!r})"
        )


class StudentReranker(CrossEncoderReranker):
    """The student that ships with cisrank (`cisrank-student`, `cisrank.models.shipped`): a
    MiniLM-L6 cross-encoder distilled from CIS and all-mpnet-base-v2 (`make student`), served
    as `--reranker student`. The same scores as `--reranker cross-encoder --model
    cisrank-student`, option for option; only its name and its config's label differ.

    Example:
        load_reranker("student").rank("who wrote hamlet", documents, top_n=3)
    """

    name = "student"

    def __init__(
        self,
        model: str | None = None,
        *,
        config: CrossEncoderRerankerConfig | None = None,
        **options: Any,
    ) -> None:
        super().__init__(model, config=config or StudentRerankerConfig(), **options)
