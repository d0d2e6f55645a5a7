"""The torch runtime of causal LMs: any Hugging Face causal LM, exact, on CPU (float32) or GPU
(bf16/fp16); the table's default and the only runtime that decodes.

How it keeps scores exact and cheap (the contract in `cisrank.lm.engine`):

- position ids and the 2D attention mask are built explicitly for either padding side, so a row
  scores the same whichever batch it lands in;
- a shared prefix runs once (`prefix_state`) and its key/value cache is expanded along the batch
  for every batch of continuations, so its tokens are never recomputed;
- the LM head runs only on the hidden states that predict scored tokens, gathered from the base
  model's output, in chunks of `head_chunk_rows` rows, with a float32 log-softmax: full
  `[batch, length, vocab]` logits are never built;
- models whose cache cannot be reused fall back to full forwards of `[prefix, continuation]`.

It also holds what lock-step decoding (`cisrank.lm.decoding`) needs: the base model, the LM head
(`head_logits`) and early-exit logits of any layer (`layer_logits`).
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch

from cisrank.errors import CisrankError
from cisrank.runtimes.batching import pad_batch

log = logging.getLogger(__name__)

PADDING_SIDES = ("right", "left")
_FINAL_NORMS = ("norm", "ln_f", "final_layer_norm", "final_layernorm")


@contextmanager
def one_thread() -> Iterator[None]:
    """Torch's intra-op threads at 1 for the calling thread, then as they were: how a reduced-
    precision CPU forward is made independent of the process's thread count. The count is the
    calling thread's own (OpenMP's per-thread setting, checked in tests/lm), so a server's other
    model threads keep theirs."""
    threads = torch.get_num_threads()
    if threads != 1:
        torch.set_num_threads(1)
    try:
        yield
    finally:
        if threads != 1:
            torch.set_num_threads(threads)


def _text_config(config: Any) -> Any:
    """The language model's own config (a multimodal config nests it)."""
    inner = config.get_text_config() if hasattr(config, "get_text_config") else None
    return inner or config


class TorchBackend:
    """A loaded `PreTrainedModel` with a causal LM head, as an `LMBackend`.

    Args:
        model: the model, already on its device in its compute dtype.
        head_chunk_rows: hidden states per LM-head call; bounds the logits buffer to
            `head_chunk_rows x vocab` floats.
        padding_side: "right" or "left"; scores do not depend on it.
        use_prefix_cache: reuse a prefix's key/value cache (None: on, falling back to full
            forwards, once and for all, if the model rejects a cache).
        name: what error messages call the model.
    """

    name = "torch"

    def __init__(
        self,
        model: Any,
        *,
        head_chunk_rows: int = 1024,
        padding_side: str = "right",
        use_prefix_cache: bool | None = None,
        name: str = "",
    ) -> None:
        if padding_side not in PADDING_SIDES:
            raise CisrankError(f"padding_side must be 'right' or 'left', got {padding_side!r}")
        if head_chunk_rows < 1:
            raise CisrankError(f"head_chunk_rows must be >= 1, got {head_chunk_rows}")
        self.model = model
        self.model_name = name or type(model).__name__
        first = next(model.parameters())
        self.torch_device: torch.device = first.device
        self.dtype: torch.dtype = first.dtype
        self.device = str(self.torch_device)
        self.compute_type = str(self.dtype).removeprefix("torch.")
        self.base = model.base_model
        self.lm_head = model.get_output_embeddings()
        if self.lm_head is None or self.base is model:
            raise CisrankError(
                f"model '{self.model_name}' has no separate LM head: a causal LM is needed"
            )
        self.head_chunk_rows = head_chunk_rows
        self.padding_side = padding_side
        self.use_prefix_cache = True if use_prefix_cache is None else use_prefix_cache
        self._cache_checked = use_prefix_cache is not None
        cfg = _text_config(model.config)
        self.max_positions: int | None = next(
            (
                int(v)
                for k in ("max_position_embeddings", "n_positions", "n_ctx")
                if isinstance(v := getattr(cfg, k, None), int) and v > 0
            ),
            None,
        )
        self.num_layers = int(cfg.num_hidden_layers)
        self._softcap = getattr(cfg, "final_logit_softcapping", None)
        self._logit_scale = getattr(cfg, "logit_scale", None)
        # transformers 5.2x renamed the forward's `past_key_values` to `cache` (the old name
        # warns, and goes in 5.40); older releases know only the old name.
        params = inspect.signature(self.base.forward).parameters
        self._cache_name = "cache" if "cache" in params else "past_key_values"

    @property
    def supports_prefix_cache(self) -> bool:
        return self.use_prefix_cache

    def cache_arg(self, cache: Any) -> dict[str, Any]:
        """The key/value cache as the installed transformers' forward takes it."""
        return {self._cache_name: cache}

    def out_cache(self, out: Any) -> Any:
        return getattr(out, self._cache_name)

    def new_cache(self, data: Any = None) -> Any:
        """A dynamic cache, empty or holding per-layer (keys, values)."""
        from transformers import DynamicCache

        if data is None:
            return DynamicCache(config=self.model.config)
        return DynamicCache(ddp_cache_data=data, config=self.model.config)

    # ------------------------------------------------------------------ identity
    def identity(self) -> list[bytes]:
        """The config, the compute dtype and a strided sample of every parameter tensor (any
        fine-tune moves them) with its name and shape: cheap (no hashing of whole weight
        files), deterministic across processes."""
        parts = [
            self.model.config.to_json_string(use_diff=False).encode(),
            str(self.dtype).encode(),
        ]
        with torch.inference_mode():
            for name, p in sorted(self.model.state_dict().items()):
                flat = p.detach().reshape(-1)
                step = max(1, flat.numel() // 4096)
                sample = flat[::step][:4096].to(device="cpu", dtype=torch.float32)
                parts.append(f"{name}:{tuple(p.shape)}".encode())
                parts.append(sample.numpy().tobytes())
        return parts

    # ------------------------------------------------------------------ scoring
    def prefix_state(self, prefix: Sequence[int]) -> Any | None:
        """Run the prefix once: per-layer key/value tensors and the last hidden state."""
        if not self.use_prefix_cache:
            return None
        ids = torch.tensor([list(prefix)], device=self.torch_device)
        mask = torch.ones_like(ids)
        try:
            with torch.inference_mode():
                out = self.base(
                    input_ids=ids,
                    attention_mask=mask,
                    **self.cache_arg(self.new_cache()),
                    use_cache=True,
                )
            cache = self.out_cache(out)
            layers = [(layer.keys, layer.values) for layer in cache.layers]
            if not layers or any(k is None or k.shape[-2] != len(prefix) for k, _ in layers):
                raise ValueError("cache does not hold the prefix")
        except (TypeError, ValueError, AttributeError, NotImplementedError) as exc:
            if self._cache_checked:
                raise
            log.warning(
                "model %s does not support prefix-cache reuse (%s): using full forwards",
                self.model_name,
                exc,
            )
            self.use_prefix_cache = False
            self._cache_checked = True
            return None
        self._cache_checked = True
        return layers, out.last_hidden_state[0, -1]

    def score_rows(
        self, rows: Sequence[Sequence[int]], context: Sequence[int], pad_id: int, cached: Any = None
    ) -> np.ndarray:
        """Per-token log p of the scored span of every row, concatenated in row order.

        With `cached` (from `prefix_state`, a prefix shared by every row) the rows attend to the
        prefix's key/value cache, expanded along the batch, and a scored token at index 0 is
        predicted by the prefix's last hidden state. Positions count from the first token the
        model reads (the prefix's, when cached) and ignore padding, so a row scores the same on
        either padding side and in any batch."""
        start = 0
        if cached is not None:
            layers, last_hidden = cached
            start = int(layers[0][0].shape[-2])  # positions already held by the cache
        np_ids, np_mask, offsets = pad_batch(rows, pad_id, left=self.padding_side == "left")
        ids, mask = torch.from_numpy(np_ids), torch.from_numpy(np_mask)
        bsz, width = ids.shape
        off = torch.tensor(offsets).unsqueeze(1)
        positions = (start + torch.arange(width).unsqueeze(0) - off).clamp_min(start)
        past = None
        if cached is not None:
            mask = torch.cat([torch.ones((bsz, start), dtype=torch.long), mask], dim=1)
            past = self.new_cache(
                [(k.expand(bsz, -1, -1, -1), v.expand(bsz, -1, -1, -1)) for k, v in layers]
            )
        with torch.inference_mode():
            out = self.base(
                input_ids=ids.to(self.torch_device),
                attention_mask=mask.to(self.torch_device),
                position_ids=positions.to(self.torch_device),
                **self.cache_arg(past),
                use_cache=past is not None,
            )
            hidden = out.last_hidden_state.reshape(bsz * width, -1)
            # Token j of row r is predicted by the hidden state just before it, at flat index
            # r * width + off_r + j - 1. With a cache, token 0 has no such state: the prefix's
            # last state predicts it, prepended as source row 0 (every other index shifts by 1).
            lead = 1 if cached is not None else 0
            src: list[int] = []
            tgt: list[int] = []
            for r, (row, ctx) in enumerate(zip(rows, context, strict=True)):
                first = lead + r * width + offsets[r] - 1  # source of the row's token 0
                for j in range(ctx, len(row)):
                    src.append(0 if j == 0 else first + j)
                tgt.extend(row[ctx:])
            source = hidden if cached is None else torch.cat([last_hidden.unsqueeze(0), hidden])
            return self._head_logprobs(source, src, tgt)

    def head_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Float32 next-token logits of hidden states `[rows, hidden]` (LM head, then the model's
        logit scale and final soft-capping where it has them)."""
        logits = self.lm_head(hidden).float()
        if self._logit_scale is not None:
            logits = logits * float(self._logit_scale)
        if self._softcap is not None:
            logits = torch.tanh(logits / self._softcap) * self._softcap
        return logits

    def _head_logprobs(self, source: torch.Tensor, src: list[int], tgt: list[int]) -> np.ndarray:
        """log softmax(lm_head(source[src]))[tgt], in chunks, float32 log-softmax."""
        src_t = torch.tensor(src, device=source.device)
        tgt_t = torch.tensor(tgt, device=source.device)
        out = torch.empty(len(src), dtype=torch.float32, device=source.device)
        step = self.head_chunk_rows
        for start in range(0, len(src), step):
            rows = source.index_select(0, src_t[start : start + step])
            logits = self.head_logits(rows)
            picked = logits.gather(1, tgt_t[start : start + step].unsqueeze(1)).squeeze(1)
            out[start : start + step] = picked - torch.logsumexp(logits, dim=-1)
            del logits
        return out.cpu().numpy()

    def layer_logits(self, hidden: torch.Tensor, layer: int) -> torch.Tensor:
        """Early-exit logits of layer `layer` (0 = embeddings, `num_layers` = last): the model's
        final norm (already applied to the last layer's states) and the LM head, as DoLa does."""
        if layer < self.num_layers:
            norm = next(
                (
                    m
                    for name in _FINAL_NORMS
                    if isinstance(m := getattr(self.base, name, None), torch.nn.Module)
                ),
                None,
            )
            if norm is None:
                raise CisrankError(
                    f"model '{self.model_name}': no final norm found for early-exit logits"
                )
            hidden = norm(hidden)
        return self.head_logits(hidden)


def load(
    model: str,
    compute_type: str | None,
    *,
    device: str | None = None,
    threads: int | None = None,
    reference: Any = None,
    options: dict[str, Any] | None = None,
) -> tuple[TorchBackend, Any]:
    """The table's loader (`cisrank.runtimes.table`): (backend, tokenizer) of `model` (a name,
    folder or GGUF file: `lm_loader`) on `device` (CUDA when present) in `compute_type` (None:
    bf16 on a GPU, float32 on a CPU); `options` are `TorchBackend`'s. torch runs the model as
    it is, so it needs no `reference`, and its threads are torch's own."""
    from cisrank.devices import resolve_device, resolve_dtype
    from cisrank.runtimes.lm_loader import load_causal_lm

    dev = resolve_device(device)
    lm, tokenizer = load_causal_lm(model, dev, resolve_dtype(compute_type, dev))
    return TorchBackend(lm, name=model, **(options or {})), tokenizer
