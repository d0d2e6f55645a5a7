"""The causal-LM log-likelihood engine: the one hot path for every score built on log p(text).

CIS (log p(K|Q) - log p(K), forward and reverse), the prior job, the RAG context gauge and the
PMI and curvature orderings all reduce to one question: what is the summed log-probability of
each target span after its context? This engine answers it, fast and exactly, for two shapes:

- `score_continuations`: one shared prefix (BOS + templated query) and many continuations; the
  prefix runs once per call and its state is reused for every batch of continuations;
- `score_spans`: every (context, target) pair its own row (K rotated prompts; a passage followed
  by a query); a context that several targets share runs once too.

What it guarantees, whatever the backend (`cisrank.runtimes.lm`):

- identical inputs are scored once, then sorted by length and cut into batches under a token
  budget with a padding bound (`cisrank.runtimes.batching`), and results come back in input
  order, so a score does not depend on batch size, batch order, padding side or the other inputs
  (within float rounding: about 1e-5 per token in float32);
- in bf16 or float16 on a CPU that rounding is not small: on DL21 a pair's reverse-CIS score
  moved by up to 0.73 nats with its batch company and 0.18 with the thread count
  (`bench/bf16_invariance.py`), where the ranking tolerates 0.053 (the 5th percentile of the
  gaps between top-10 neighbours), since the CPU's reduced-precision kernels block and split a
  matmul by its shape and threads. There the engine runs fixed shapes (`fixed_shapes`): one row
  a model call, no context shared between rows, one torch thread, so a pair's score is a function
  of the pair alone, bit for bit, whatever the request and the process around it;
- a prompt longer than the model's context is a one-line error before any work;
- `fingerprint()` names everything that changes a log-probability (model, weights sample, compute
  type, runtime other than torch, tokenizer, BOS): the key of every stored prior.

Lock-step decoding of several prompts with one generated suffix (entropy-based ensembles) is in
`cisrank.lm.decoding`, reached through `prefill_lockstep` / `decode_from`.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from cisrank.errors import CisrankError
from cisrank.lm import decoding
from cisrank.lm.decoding import DecodeStep, LockstepPrefill
from cisrank.runtimes import lm_torch
from cisrank.runtimes.batching import LengthBatcher, dedupe, scatter
from cisrank.runtimes.lm import LMBackend
from cisrank.runtimes.lm_torch import TorchBackend


@dataclass(frozen=True, slots=True)
class ContinuationScores:
    """Summed log-probabilities (and optionally per-token ones) of continuations, in input order."""

    logprobs: list[float]
    num_tokens: list[int]
    token_logprobs: list[np.ndarray] | None = None


def _on_cpu(device: str) -> bool:
    return device.split(":")[0] == "cpu"


def _default_batch_tokens(device: str) -> int:
    # CPU matmuls saturate at a few thousand rows; bigger batches only add padding and memory.
    return 4096 if _on_cpu(device) else 32768


def _default_max_padding(device: str) -> float:
    # A CPU runs a single 80-token passage near its matmul peak already, so any padding is a
    # straight loss: keep batches to near-equal lengths. A GPU needs rows to fill its cores and
    # trades some padding for bigger batches.
    return 0.05 if _on_cpu(device) else 0.25


def _reduced_on_cpu(backend: LMBackend) -> bool:
    # Where the engine's batching would change a score by more than rounding noise: torch's
    # bf16/float16 CPU kernels (oneDNN, AMX) pick their blocking by the matmul's shape. The other
    # runtimes' reduced types (int8) are checked per runtime; GPUs are not covered by this rule.
    return (
        isinstance(backend, TorchBackend)
        and _on_cpu(backend.device)
        and backend.compute_type in ("bfloat16", "float16")
    )


class CausalLMEngine:
    """Summed log-probabilities of continuations given a shared prefix, for any HF causal LM.

    Args:
        model: a loaded `PreTrainedModel` with a causal LM head, a hub id / local folder /
            catalogue name, or an `LMBackend` built elsewhere (then `tokenizer` is required).
        tokenizer: the model's tokenizer (loaded with the model when `model` is a name).
        device, dtype: torch device and dtype; auto (CUDA + bf16 where present, CPU float32
            otherwise) when None.
        batch_tokens: padded tokens per batch (rows x longest continuation).
        batch_size: at most this many continuations per batch.
        max_padding: the most padding a row may carry, as a fraction of the batch's width; a
            shorter continuation starts a new batch (auto: 0.05 on CPU, 0.25 on GPU).
        head_chunk_rows: hidden states per LM-head call (torch); bounds the logits buffer to
            `head_chunk_rows x vocab` floats.
        padding_side: "right" or "left" (torch); scores do not depend on it.
        use_prefix_cache: reuse the prefix's key/value cache (auto: on, falling back to full
            forwards if the model rejects a cache).
        fixed_shapes: score one row a model call on one torch thread and share no context
            between rows, so that a score depends on its pair alone, bit for bit (auto: on for
            torch bf16/float16 on a CPU; on one thread 0.79x the pairs/s of batched bf16 and
            1.74x float32's, `bench/bf16_invariance.py`).
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any = None,
        *,
        device: str | Any | None = None,
        dtype: str | Any | None = None,
        batch_tokens: int | None = None,
        batch_size: int | None = None,
        max_padding: float | None = None,
        head_chunk_rows: int = 1024,
        padding_side: str = "right",
        use_prefix_cache: bool | None = None,
        fixed_shapes: bool | None = None,
    ) -> None:
        torch_options: dict[str, Any] = {
            "head_chunk_rows": head_chunk_rows,
            "padding_side": padding_side,
            "use_prefix_cache": use_prefix_cache,
        }
        backend: LMBackend
        if isinstance(model, (str, Path)):
            self.model_name = str(model)
            backend, tokenizer = lm_torch.load(
                self.model_name, dtype, device=device, options=torch_options
            )
        elif isinstance(model, LMBackend):
            if tokenizer is None:
                raise CisrankError("a backend needs its tokenizer: pass tokenizer=...")
            backend = model
            self.model_name = backend.model_name
        else:
            from cisrank.devices import resolve_device, resolve_dtype

            if tokenizer is None:
                raise CisrankError("a loaded model needs its tokenizer: pass tokenizer=...")
            first = next(model.parameters())
            dev = first.device if device is None else resolve_device(device)
            dt = first.dtype if dtype is None else resolve_dtype(dtype, dev)
            model = model.to(device=dev, dtype=dt).eval()
            self.model_name = getattr(model.config, "_name_or_path", "") or type(model).__name__
            backend = TorchBackend(model, name=self.model_name, **torch_options)
        self.backend = backend
        self.tokenizer = tokenizer
        self.fixed_shapes = _reduced_on_cpu(backend) if fixed_shapes is None else fixed_shapes
        """One row a call, no shared contexts, one thread: a score is its pair's alone, bit for bit."""
        self.batch_tokens = batch_tokens or _default_batch_tokens(backend.device)
        self.batch_size = batch_size
        self.max_padding = (
            _default_max_padding(backend.device) if max_padding is None else max_padding
        )
        if not 0.0 <= self.max_padding < 1.0:
            raise CisrankError(f"max_padding must be in [0, 1), got {self.max_padding}")
        bos = tokenizer.bos_token_id
        if bos is None:
            bos = tokenizer.eos_token_id
        if bos is None:
            raise CisrankError(
                f"tokenizer of '{self.model_name}' has neither a BOS nor an EOS token: "
                "CIS needs one to start every sequence"
            )
        self.bos_id = int(bos)
        pad = tokenizer.pad_token_id
        self.pad_id = self.bos_id if pad is None else int(pad)
        self.max_positions: int | None = backend.max_positions
        """The longest row the engine lets through (the model's context length by default)."""
        self._fingerprint: str | None = None

    # ------------------------------------------------------------------ what it runs on
    @property
    def device(self) -> str:
        return self.backend.device

    @property
    def compute_type(self) -> str:
        return self.backend.compute_type

    @property
    def num_layers(self) -> int:
        return self.backend.num_layers

    def torch_backend(self) -> TorchBackend:
        """The torch backend, for what only it does (decoding, early-exit logits)."""
        if not isinstance(self.backend, TorchBackend):
            raise CisrankError(
                f"the {self.backend.name} backend of '{self.model_name}' scores only: decoding "
                "needs the torch backend"
            )
        return self.backend

    # ------------------------------------------------------------------ tokenization
    def encode(self, text: str) -> list[int]:
        """Token ids of `text` without special tokens."""
        return list(self.tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"])

    def encode_batch(self, texts: Sequence[str], max_tokens: int | None = None) -> list[list[int]]:
        """Token ids of each text without special tokens, each truncated to `max_tokens`."""
        if not texts:
            return []
        ids = self.tokenizer(list(texts), add_special_tokens=False, verbose=False)["input_ids"]
        if max_tokens is not None:
            ids = [list(x[:max_tokens]) for x in ids]
        return [list(x) for x in ids]

    # ------------------------------------------------------------------ identity
    def fingerprint(self) -> str:
        """A hash of everything in the model and tokenizer that changes a log-probability.

        The backend's identity (config, compute type, a strided sample of every weight tensor),
        the runtime where it is not torch, the full tokenizer serialization and the BOS id.
        Cheap (no hashing of whole weight files), deterministic across processes.
        """
        if self._fingerprint is not None:
            return self._fingerprint
        h = hashlib.sha256()
        for part in self.backend.identity():
            h.update(part)
        if self.backend.name != TorchBackend.name:
            h.update(f"backend={self.backend.name}:{self.backend.compute_type}".encode())
        serialized = getattr(self.tokenizer, "backend_tokenizer", None)
        if serialized is not None:
            h.update(serialized.to_str().encode())
        else:
            h.update(repr(sorted(self.tokenizer.get_vocab().items())).encode())
        h.update(f"bos={self.bos_id}".encode())
        if self.fixed_shapes and self.compute_type != "float32":
            # Reduced precision scores differently unbatched: priors of each way are kept apart.
            h.update(b"fixed-shapes")
        self._fingerprint = h.hexdigest()
        return self._fingerprint

    # ------------------------------------------------------------------ scoring
    def _shape_pinned(self) -> AbstractContextManager[None]:
        """One torch thread for a fixed-shape call (its thread count changed bf16 scores too)."""
        return lm_torch.one_thread() if self.fixed_shapes else nullcontext()

    def batcher(self) -> LengthBatcher:
        """This engine's batching policy (read at each call: the attributes may be changed)."""
        if self.fixed_shapes:
            return LengthBatcher(batch_size=1)
        return LengthBatcher(self.batch_size, self.batch_tokens, self.max_padding)

    def score_continuations(
        self,
        prefix: Sequence[int],
        continuations: Sequence[Sequence[int]],
        *,
        return_tokens: bool = False,
    ) -> ContinuationScores:
        """Summed log p(continuation | prefix) for each continuation, in input order.

        `prefix` must be non-empty (it starts with BOS). Identical continuations are scored once;
        an empty continuation scores 0.0 with 0 tokens.
        """
        prefix = [int(t) for t in prefix]
        if not prefix:
            raise CisrankError("the prefix must hold at least one token (BOS)")
        conts = [tuple(int(t) for t in c) for c in continuations]
        unique, slots = dedupe(conts)
        longest = max((len(c) for c in unique), default=0)
        if self.max_positions is not None and len(prefix) + longest > self.max_positions:
            raise CisrankError(
                f"prefix ({len(prefix)} tokens) plus passage ({longest} tokens) exceed the "
                f"context of '{self.model_name}' ({self.max_positions} tokens): lower "
                "--max-doc-tokens or shorten the query/template"
            )
        with self._shape_pinned():
            scored = self._score_unique(prefix, unique)
        return _summed(scatter(scored, slots), conts, return_tokens)

    def score_spans(
        self,
        spans: Sequence[tuple[Sequence[int], Sequence[int]]],
        *,
        return_tokens: bool = False,
    ) -> ContinuationScores:
        """Summed log p(target | context) for each (context, target) pair, in input order.

        The other shape of the engine: every pair has its own context (K passages each followed
        by one question; K rotations of one context), so each row is fed whole: `[context,
        target]`, with the LM head applied at the target's positions only. Rows are deduplicated
        and batched by length like continuations, so a pair scores the same in any batch (within
        float rounding). Each context must be non-empty (it starts with BOS); an empty target
        scores 0.

        A context that several distinct targets share (one passage under many queries, as when
        a teacher scores a pool) is run once and its state reused for each target, as
        `score_continuations` does for a shared prefix: the same log-probabilities up to float
        rounding (about 1e-5 per token in float32), for a fraction of the tokens.
        """
        pairs = [(tuple(int(t) for t in c), tuple(int(t) for t in g)) for c, g in spans]
        if any(not c for c, _ in pairs):
            raise CisrankError("every context must hold at least one token (BOS)")
        unique, slots = dedupe(pairs)
        longest = max((len(c) + len(g) for c, g in unique), default=0)
        if self.max_positions is not None and longest > self.max_positions:
            raise CisrankError(
                f"a context plus its target ({longest} tokens) exceeds the context of "
                f"'{self.model_name}' ({self.max_positions} tokens): lower --max-doc-tokens"
            )
        empty = np.zeros(0, dtype=np.float32)
        shared: dict[tuple[int, ...], list[int]] = {}
        if self.backend.supports_prefix_cache and not self.fixed_shapes:
            for i, (c, g) in enumerate(unique):
                if g:
                    shared.setdefault(c, []).append(i)
        groups = {c: ix for c, ix in shared.items() if len(ix) > 1}
        grouped = {i for ix in groups.values() for i in ix}
        lengths = [
            len(c) + len(g) if g and i not in grouped else 0 for i, (c, g) in enumerate(unique)
        ]

        def score(batch: list[int]) -> list[np.ndarray]:
            chosen = [unique[i] for i in batch]
            lp = self.backend.score_rows(
                [c + g for c, g in chosen], [len(c) for c, _ in chosen], self.pad_id
            )
            return _split(lp, [len(g) for _, g in chosen])

        with self._shape_pinned():
            results = self.batcher().run(lengths, score, empty)
            for context, ix in groups.items():
                targets = [unique[i][1] for i in ix]
                for i, row in zip(ix, self._score_unique(list(context), targets), strict=True):
                    results[i] = row
        return _summed(scatter(results, slots), [g for _, g in pairs], return_tokens)

    def _score_unique(self, prefix: list[int], unique: list[tuple[int, ...]]) -> list[np.ndarray]:
        """Per-token log-probabilities of each distinct continuation of `prefix`."""
        empty = np.zeros(0, dtype=np.float32)
        if not any(unique):
            return [empty] * len(unique)
        cached = self.backend.prefix_state(prefix)
        # A batch's width is what the model reads: the prefix too when it is not cached.
        fed = () if cached is not None else tuple(prefix)
        lengths = [len(c) + len(fed) if c else 0 for c in unique]

        def score(batch: list[int]) -> list[np.ndarray]:
            seqs = [unique[i] for i in batch]
            lp = self.backend.score_rows(
                [fed + s for s in seqs], [len(fed)] * len(seqs), self.pad_id, cached
            )
            return _split(lp, [len(s) for s in seqs])

        return self.batcher().run(lengths, score, empty)

    # ------------------------------------------------------------------ lock-step decoding
    def layer_logits(self, hidden: Any, layer: int) -> Any:
        """Early-exit logits of layer `layer` (`TorchBackend.layer_logits`)."""
        return self.torch_backend().layer_logits(hidden, layer)

    def prefill_lockstep(
        self, rows: Sequence[Sequence[int]], *, layers: Sequence[int] = (), max_new_tokens: int = 1
    ) -> LockstepPrefill:
        """`cisrank.lm.decoding.prefill_lockstep` on this engine's model and batching."""
        return decoding.prefill_lockstep(
            self.torch_backend(),
            self.batcher(),
            self.pad_id,
            rows,
            layers=layers,
            max_new_tokens=max_new_tokens,
            max_positions=self.max_positions,
        )

    def decode_from(
        self,
        state: LockstepPrefill,
        choose: Callable[[DecodeStep], int],
        max_new_tokens: int,
        *,
        layers: Sequence[int] = (),
        stop_ids: Sequence[int] = (),
    ) -> list[int]:
        """`cisrank.lm.decoding.decode_from` on this engine's model."""
        return decoding.decode_from(
            self.torch_backend(),
            state,
            choose,
            max_new_tokens,
            layers=layers,
            stop_ids=stop_ids,
            max_positions=self.max_positions,
        )

    def decode_rows(
        self,
        state: LockstepPrefill,
        choose: Callable[[int, Any], int],
        max_new_tokens: int,
        *,
        stop_ids: Sequence[int] = (),
    ) -> list[list[int]]:
        """`cisrank.lm.decoding.decode_rows` on this engine's model: each prefilled row decoded
        on its own, all rows in one step."""
        return decoding.decode_rows(
            self.torch_backend(),
            state,
            choose,
            max_new_tokens,
            stop_ids=stop_ids,
            max_positions=self.max_positions,
        )

    def decode_lockstep(
        self,
        rows: Sequence[Sequence[int]],
        choose: Callable[[DecodeStep], int],
        max_new_tokens: int,
        *,
        layers: Sequence[int] = (),
        stop_ids: Sequence[int] = (),
    ) -> list[int]:
        """`prefill_lockstep` then `decode_from`: several prompts in lock-step, one shared
        generated suffix (see `cisrank.lm.decoding`)."""
        state = self.prefill_lockstep(rows, layers=layers, max_new_tokens=max_new_tokens)
        return self.decode_from(state, choose, max_new_tokens, layers=layers, stop_ids=stop_ids)


def _split(values: np.ndarray, sizes: Sequence[int]) -> list[np.ndarray]:
    bounds = np.cumsum([0, *sizes])
    return [values[a:b] for a, b in itertools.pairwise(bounds)]


def _summed(
    per_tok: list[np.ndarray], targets: Sequence[Sequence[int]], return_tokens: bool
) -> ContinuationScores:
    return ContinuationScores(
        logprobs=[float(row.sum(dtype=np.float64)) for row in per_tok],
        num_tokens=[len(t) for t in targets],
        token_logprobs=[row.copy() for row in per_tok] if return_tokens else None,
    )
