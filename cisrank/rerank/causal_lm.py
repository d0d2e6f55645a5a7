"""The causal-LM log-likelihood engine: the one hot path for every score built on log p(text).

CIS (log p(K|Q) - log p(K)), and later question likelihood and PMI ordering, all reduce to one
question: given prefix token ids and a list of continuations, what is the summed log-probability of
each continuation? This module answers it, fast and exactly (the contract in `rerank.cis`):

- the shared prefix (BOS + templated query) runs once per call and its key/value cache is expanded
  along the batch dimension for every batch of continuations, so query tokens are never recomputed;
- continuations are deduplicated, sorted by length and cut into batches under a token budget, so
  padding waste stays small; results come back in input order (`cisrank.rerank.batching`, the
  helper the cross-encoder batches with too);
- position ids and the 2D attention mask are built explicitly for either padding side, so a passage
  scores the same whichever batch it lands in;
- the LM head runs only on the hidden states that predict continuation tokens, gathered from the base
  model's output, in chunks of `head_chunk_rows` rows, with a float32 log-softmax: full
  `[batch, length, vocab]` logits are never built;
- models whose cache cannot be reused fall back to full forwards of `[prefix, continuation]`.

Two more shapes serve RAG context assembly (`cisrank.context`): `score_spans` scores a target
after its own context (K rotated prompts, one question each), and `decode_lockstep` decodes several
prompts in lock-step with a key/value cache, one shared generated suffix (entropy-based decoding),
with `head_logits`/`layer_logits` as the one LM-head path.

On a 2-core CPU the cost is dominated by the transformer body and the vocabulary projection; both
scale with the number of continuation tokens, which is what this engine minimises.
"""

from __future__ import annotations

import hashlib
import inspect
import itertools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from cisrank.devices import resolve_device, resolve_dtype
from cisrank.errors import CisrankError, ModelNotFoundError
from cisrank.rerank.batching import LengthBatcher, dedupe, pad_batch, scatter

log = logging.getLogger(__name__)

PADDING_SIDES = ("right", "left")


@dataclass(frozen=True, slots=True)
class DecodeStep:
    """One step of `CausalLMEngine.decode_lockstep`: float32 next-token `logits` of every row
    `[R, V]` and the last position's hidden states of the requested layers `{layer: [R, H]}`."""

    step: int
    logits: torch.Tensor
    hidden: dict[int, torch.Tensor]


@dataclass(frozen=True, slots=True)
class LockstepPrefill:
    """Prompts prefilled for lock-step decoding (`CausalLMEngine.prefill_lockstep`).

    `kv`: per model layer, the rows' keys and values `[R, heads, W, head_dim]`, each row
    right-aligned behind masked left padding (`mask`, `[R, W]`); `lengths`: each row's tokens;
    `layers`: the layers whose hidden states `first` holds; `first`: step 0 (the last
    position's logits and hidden states)."""

    kv: list[tuple[torch.Tensor, torch.Tensor]]
    mask: torch.Tensor
    lengths: tuple[int, ...]
    layers: tuple[int, ...]
    first: DecodeStep


@dataclass(frozen=True, slots=True)
class ContinuationScores:
    """Summed log-probabilities (and optionally per-token ones) of continuations, in input order."""

    logprobs: list[float]
    num_tokens: list[int]
    token_logprobs: list[np.ndarray] | None = None


def _default_batch_tokens(device: torch.device) -> int:
    # CPU matmuls saturate at a few thousand rows; bigger batches only add padding and memory.
    return 4096 if device.type == "cpu" else 32768


def _default_max_padding(device: torch.device) -> float:
    # A CPU runs a single 80-token passage near its matmul peak already, so any padding is a
    # straight loss: keep batches to near-equal lengths. A GPU needs rows to fill its cores and
    # trades some padding for bigger batches.
    return 0.05 if device.type == "cpu" else 0.25


def load_causal_lm(model: str, device: torch.device, dtype: torch.dtype):
    """Load a causal LM and its tokenizer by hub id or folder, with one-line actionable errors."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from cisrank.models.resolve import resolve_model

    gguf = Path(model).expanduser()
    if gguf.suffix.lower() == ".gguf" and gguf.is_file():
        # A GGUF checkpoint file: transformers de-quantizes it at every load (tens of seconds);
        # `cisrank models pull` converts catalogue models once instead.
        path, extra = str(gguf.parent), {"gguf_file": gguf.name}
    else:
        path, extra = resolve_model(model), {}
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, **extra)
        lm = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, **extra)
    except (OSError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelNotFoundError(
            f"cannot load causal LM '{model}' from {path}: {first}; pass --model with a folder "
            "that holds a causal language model (config.json, weights, tokenizer)"
        ) from exc
    lm.to(device)  # type: ignore[arg-type]  # transformers' wrapper of to() hides its signature
    lm.eval()
    return lm, tokenizer


class CausalLMEngine:
    """Summed log-probabilities of continuations given a shared prefix, for any HF causal LM.

    Args:
        model: a loaded `PreTrainedModel` with a causal LM head, or a hub id / local folder.
        tokenizer: the model's tokenizer (loaded with the model when `model` is a name).
        device, dtype: torch device and dtype; auto (CUDA + bf16 where present, CPU float32
            otherwise) when None.
        batch_tokens: padded tokens per batch (rows x longest continuation).
        batch_size: at most this many continuations per batch.
        max_padding: the most padding a row may carry, as a fraction of the batch's width; a
            shorter continuation starts a new batch (auto: 0.05 on CPU, 0.25 on GPU).
        head_chunk_rows: hidden states per LM-head call; bounds the logits buffer to
            `head_chunk_rows x vocab` floats.
        padding_side: "right" or "left"; scores do not depend on it.
        use_prefix_cache: reuse the prefix's key/value cache (auto: on, falling back to full
            forwards if the model rejects a cache).
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any = None,
        *,
        device: str | torch.device | None = None,
        dtype: str | torch.dtype | None = None,
        batch_tokens: int | None = None,
        batch_size: int | None = None,
        max_padding: float | None = None,
        head_chunk_rows: int = 1024,
        padding_side: str = "right",
        use_prefix_cache: bool | None = None,
    ) -> None:
        if padding_side not in PADDING_SIDES:
            raise CisrankError(f"padding_side must be 'right' or 'left', got {padding_side!r}")
        if head_chunk_rows < 1:
            raise CisrankError(f"head_chunk_rows must be >= 1, got {head_chunk_rows}")
        if isinstance(model, (str, Path)):
            dev = resolve_device(device)
            dt = resolve_dtype(dtype, dev)
            self.model_name = str(model)
            model, tokenizer = load_causal_lm(str(model), dev, dt)
        else:
            if tokenizer is None:
                raise CisrankError("a loaded model needs its tokenizer: pass tokenizer=...")
            dev = next(model.parameters()).device if device is None else resolve_device(device)
            dt = next(model.parameters()).dtype if dtype is None else resolve_dtype(dtype, dev)
            model = model.to(device=dev, dtype=dt).eval()
            self.model_name = getattr(model.config, "_name_or_path", "") or type(model).__name__
        self.model = model
        self.tokenizer = tokenizer
        self.device = dev
        self.dtype = dt
        self.base = model.base_model
        self.lm_head = model.get_output_embeddings()
        if self.lm_head is None or self.base is model:
            raise CisrankError(
                f"model '{self.model_name}' has no separate LM head: a causal LM is needed"
            )
        self.batch_tokens = batch_tokens or _default_batch_tokens(dev)
        self.batch_size = batch_size
        self.max_padding = _default_max_padding(dev) if max_padding is None else max_padding
        if not 0.0 <= self.max_padding < 1.0:
            raise CisrankError(f"max_padding must be in [0, 1), got {self.max_padding}")
        self.head_chunk_rows = head_chunk_rows
        self.padding_side = padding_side
        self.use_prefix_cache = True if use_prefix_cache is None else use_prefix_cache
        self._cache_checked = use_prefix_cache is not None
        bos = tokenizer.bos_token_id
        if bos is None:
            bos = tokenizer.eos_token_id
        if bos is None:
            raise CisrankError(
                f"tokenizer of '{self.model_name}' has neither a BOS nor an EOS token: "
                "CIS needs one to start every sequence"
            )
        self.bos_id = int(bos)
        cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else None
        cfg = cfg or model.config
        self.max_positions = next(
            (
                int(v)
                for k in ("max_position_embeddings", "n_positions", "n_ctx")
                if isinstance(v := getattr(cfg, k, None), int) and v > 0
            ),
            None,
        )
        self._softcap = getattr(cfg, "final_logit_softcapping", None)
        self._logit_scale = getattr(cfg, "logit_scale", None)
        self._fingerprint: str | None = None
        # transformers 5.2x renamed the forward's `past_key_values` to `cache` (the old name
        # warns, and goes in 5.40); older releases know only the old name.
        params = inspect.signature(self.base.forward).parameters
        self._cache_name = "cache" if "cache" in params else "past_key_values"

    def _cache_arg(self, cache: Any) -> dict[str, Any]:
        """The key/value cache as the installed transformers' forward takes it."""
        return {self._cache_name: cache}

    def _out_cache(self, out: Any) -> Any:
        return getattr(out, self._cache_name)

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

        Covers the config, the compute dtype, a strided sample of every parameter tensor (any
        fine-tune moves them) with its name and shape, the full tokenizer serialization and the
        BOS id. Cheap (no hashing of whole weight files), deterministic across processes.
        """
        if self._fingerprint is not None:
            return self._fingerprint
        h = hashlib.sha256()
        h.update(self.model.config.to_json_string(use_diff=False).encode())
        h.update(str(self.dtype).encode())
        with torch.inference_mode():
            for name, p in sorted(self.model.state_dict().items()):
                flat = p.detach().reshape(-1)
                step = max(1, flat.numel() // 4096)
                sample = flat[::step][:4096].to(device="cpu", dtype=torch.float32)
                h.update(f"{name}:{tuple(p.shape)}".encode())
                h.update(sample.numpy().tobytes())
        backend = getattr(self.tokenizer, "backend_tokenizer", None)
        if backend is not None:
            h.update(backend.to_str().encode())
        else:
            h.update(repr(sorted(self.tokenizer.get_vocab().items())).encode())
        h.update(f"bos={self.bos_id}".encode())
        self._fingerprint = h.hexdigest()
        return self._fingerprint

    # ------------------------------------------------------------------ scoring
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
        per_tok = scatter(self._score_unique(prefix, unique), slots)
        return ContinuationScores(
            logprobs=[float(row.sum(dtype=np.float64)) for row in per_tok],
            num_tokens=[len(c) for c in conts],
            token_logprobs=[row.copy() for row in per_tok] if return_tokens else None,
        )

    def score_spans(
        self,
        spans: Sequence[tuple[Sequence[int], Sequence[int]]],
        *,
        return_tokens: bool = False,
    ) -> ContinuationScores:
        """Summed log p(target | context) for each (context, target) pair, in input order.

        The other shape of the engine: every pair has its own context (K passages each followed
        by one question; K rotations of one context), so nothing is shared and each row is fed
        whole: `[context, target]`, with the LM head applied at the target's positions only. Rows
        are deduplicated and batched by length like continuations, so a pair scores the same in
        any batch. Each context must be non-empty (it starts with BOS); an empty target scores 0.
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
        lengths = [len(c) + len(g) if g else 0 for c, g in unique]

        def score(batch: list[int]) -> list[np.ndarray]:
            chosen = [unique[i] for i in batch]
            lp = self._forward([c + g for c, g in chosen], [len(c) for c, _ in chosen])
            bounds = np.cumsum([0, *(len(g) for _, g in chosen)])
            return [lp[a:b] for a, b in itertools.pairwise(bounds)]

        with torch.inference_mode():
            per_tok = scatter(self.batcher().run(lengths, score, empty), slots)
        return ContinuationScores(
            logprobs=[float(row.sum(dtype=np.float64)) for row in per_tok],
            num_tokens=[len(g) for _, g in pairs],
            token_logprobs=[row.copy() for row in per_tok] if return_tokens else None,
        )

    def batcher(self) -> LengthBatcher:
        """This engine's batching policy (read at each call: the attributes may be changed)."""
        return LengthBatcher(self.batch_size, self.batch_tokens, self.max_padding)

    def _score_unique(self, prefix: list[int], unique: list[tuple[int, ...]]) -> list[np.ndarray]:
        """Per-token log-probabilities of each distinct continuation."""
        empty = np.zeros(0, dtype=np.float32)
        if not any(unique):
            return [empty] * len(unique)
        with torch.inference_mode():
            cached = self._prefix_state(prefix) if self.use_prefix_cache else None
            # A batch's width is what the model reads: the prefix too when it is not cached.
            extra = 0 if cached is not None else len(prefix)
            lengths = [len(c) + extra if c else 0 for c in unique]

            fed = () if cached is not None else tuple(prefix)

            def score(batch: list[int]) -> list[np.ndarray]:
                seqs = [unique[i] for i in batch]
                lp = self._forward([fed + s for s in seqs], [len(fed)] * len(seqs), cached)
                bounds = np.cumsum([0, *(len(s) for s in seqs)])
                return [lp[a:b] for a, b in itertools.pairwise(bounds)]

            return self.batcher().run(lengths, score, empty)

    def _prefix_state(self, prefix: list[int]):
        """Run the prefix once: per-layer key/value tensors and the last hidden state."""
        ids = torch.tensor([prefix], device=self.device)
        mask = torch.ones_like(ids)
        try:
            from transformers import DynamicCache

            out = self.base(
                input_ids=ids,
                attention_mask=mask,
                **self._cache_arg(DynamicCache(config=self.model.config)),
                use_cache=True,
            )
            cache = self._out_cache(out)
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

    def _expanded_cache(self, layers, batch: int):
        from transformers import DynamicCache

        data = [(k.expand(batch, -1, -1, -1), v.expand(batch, -1, -1, -1)) for k, v in layers]
        return DynamicCache(ddp_cache_data=data, config=self.model.config)

    def _forward(self, rows: list[tuple[int, ...]], context: list[int], cached=None) -> np.ndarray:
        """Per-token log p of the scored span of every row, concatenated in row order.

        Row r feeds `rows[r]` and scores its tokens from index `context[r]` on (the ones before
        are context). With `cached` (from `_prefix_state`, a prefix shared by every row) the rows
        attend to the prefix's key/value cache, expanded along the batch, and a scored token at
        index 0 is predicted by the prefix's last hidden state. Positions count from the first
        token the model reads (the prefix's, when cached) and ignore padding, so a row scores the
        same on either padding side and in any batch."""
        start = 0
        if cached is not None:
            layers, last_hidden = cached
            start = int(layers[0][0].shape[-2])  # positions already held by the cache
        pad_id = self.tokenizer.pad_token_id
        pad_id = self.bos_id if pad_id is None else int(pad_id)
        np_ids, np_mask, offsets = pad_batch(rows, pad_id, left=self.padding_side == "left")
        ids, mask = torch.from_numpy(np_ids), torch.from_numpy(np_mask)
        bsz, width = ids.shape
        off = torch.tensor(offsets).unsqueeze(1)
        positions = (start + torch.arange(width).unsqueeze(0) - off).clamp_min(start)
        past = None
        if cached is not None:
            mask = torch.cat([torch.ones((bsz, start), dtype=torch.long), mask], dim=1)
            past = self._expanded_cache(layers, bsz)
        out = self.base(
            input_ids=ids.to(self.device),
            attention_mask=mask.to(self.device),
            position_ids=positions.to(self.device),
            **self._cache_arg(past),
            use_cache=past is not None,
        )
        hidden = out.last_hidden_state.reshape(bsz * width, -1)
        # Token j of row r is predicted by the hidden state just before it, at flat index
        # r * width + off_r + j - 1. With a cache, token 0 has no such state: the prefix's last
        # state predicts it, prepended as source row 0 (every other index shifts by 1).
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

    # ------------------------------------------------------------------ lock-step decoding
    @property
    def num_layers(self) -> int:
        cfg = self.model.config
        cfg = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
        return int(cfg.num_hidden_layers)

    def layer_logits(self, hidden: torch.Tensor, layer: int) -> torch.Tensor:
        """Early-exit logits of layer `layer` (0 = embeddings, `num_layers` = last): the model's
        final norm (already applied to the last layer's states) and the LM head, as DoLa does."""
        if layer < self.num_layers:
            norm = next(
                (
                    m
                    for name in ("norm", "ln_f", "final_layer_norm", "final_layernorm")
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

    def decode_lockstep(
        self,
        rows: Sequence[Sequence[int]],
        choose: Callable[[DecodeStep], int],
        max_new_tokens: int,
        *,
        layers: Sequence[int] = (),
        stop_ids: Sequence[int] = (),
    ) -> list[int]:
        """Greedy-style decoding of several prompts in lock-step, one shared generated suffix.

        Row r reads `rows[r] + generated`. At each step `choose` gets the float32 next-token
        logits of every row (`[R, V]`) and, for each of `layers`, the rows' hidden states at the
        last position (`{layer: [R, H]}`, raw: see `layer_logits`) and returns the token appended
        to all rows. Stops after `max_new_tokens` or a token in `stop_ids` (which is kept). Each
        step's memory is R x V logits; never `[R, L, V]`. `prefill_lockstep` + `decode_from`.
        """
        state = self.prefill_lockstep(rows, layers=layers, max_new_tokens=max_new_tokens)
        return self.decode_from(state, choose, max_new_tokens, layers=layers, stop_ids=stop_ids)

    def prefill_lockstep(
        self,
        rows: Sequence[Sequence[int]],
        *,
        layers: Sequence[int] = (),
        max_new_tokens: int = 1,
    ) -> LockstepPrefill:
        """Run the prompts of a lock-step decoding once; `decode_from` continues from the result
        as often as asked (several decodings of the same rows pay for one prefill).

        The rows are prefilled in the engine's length batches (near-equal lengths, explicit
        position ids, so each row computes what it would alone), not as one batch padded to the
        longest: the K + 1 prompts of document-parallel decoding differ in length by up to 5x,
        and on a CPU padding is pure loss. Their key/value tensors are then laid side by side,
        right-aligned, with the left padding masked out, as one left-padded batch would hold
        them. `layers`: the hidden states (at each row's last position) that steps may ask for;
        `max_new_tokens`: the most any decoding from it will add (checked against the model's
        context before any work is done).
        """
        rows = [[int(t) for t in r] for r in rows]
        if not rows or any(not r for r in rows):
            raise CisrankError("every decoded row needs at least one token (BOS)")
        wanted = tuple(sorted(set(int(x) for x in layers)))
        if any(not 0 <= x <= self.num_layers for x in wanted):
            raise CisrankError(f"layers must be in 0..{self.num_layers}, got {list(layers)}")
        lengths = [len(r) for r in rows]
        self._check_fits(max(lengths), max_new_tokens)
        batches = self.batcher().plan(lengths)
        with torch.inference_mode():
            if len(batches) == 1:  # one batch is already the layout decoding reads
                return self._prefilled(*self._left_padded(rows), wanted, lengths)
            parts = [
                self._prefill_part(*self._left_padded([rows[i] for i in batch]), wanted)
                for batch in batches
            ]
            if not all(p is not None for p in parts):
                # a cache that is not plain key/value tensors (sliding windows, recurrent
                # state): prefill every row in one left-padded batch, the layout it reads
                ids, mask, positions = self._left_padded(rows)
                return self._prefilled(ids, mask, positions, wanted, lengths)
            return self._merged_prefill(batches, parts, wanted, lengths)

    def _check_fits(self, longest: int, max_new_tokens: int) -> None:
        if self.max_positions is not None and longest + max_new_tokens > self.max_positions:
            raise CisrankError(
                f"a prompt of {longest} tokens plus {max_new_tokens} new tokens exceeds the "
                f"context of '{self.model_name}' ({self.max_positions} tokens): pass fewer or "
                "shorter passages, or lower --max-new-tokens"
            )

    def _left_padded(
        self, rows: Sequence[Sequence[int]]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        pad_id = self.tokenizer.pad_token_id
        pad_id = self.bos_id if pad_id is None else int(pad_id)
        np_ids, np_mask, offsets = pad_batch(rows, pad_id, left=True)
        ids = torch.from_numpy(np_ids).to(self.device)
        mask = torch.from_numpy(np_mask).to(self.device)
        off = torch.tensor(offsets, device=self.device).unsqueeze(1)
        positions = (torch.arange(ids.shape[1], device=self.device).unsqueeze(0) - off).clamp_min(0)
        return ids, mask, positions

    def _run_prefill(
        self,
        ids: torch.Tensor,
        mask: torch.Tensor,
        positions: torch.Tensor,
        wanted: tuple[int, ...],
    ):
        from transformers import DynamicCache

        out = self.base(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            **self._cache_arg(DynamicCache(config=self.model.config)),
            use_cache=True,
            output_hidden_states=bool(wanted),
        )
        hidden = {x: out.hidden_states[x][:, -1] for x in wanted}
        return self._out_cache(out), out.last_hidden_state[:, -1], hidden

    def _prefilled(
        self,
        ids: torch.Tensor,
        mask: torch.Tensor,
        positions: torch.Tensor,
        wanted: tuple[int, ...],
        lengths: list[int],
    ) -> LockstepPrefill:
        cache, last, hidden = self._run_prefill(ids, mask, positions, wanted)
        kv = [(layer.keys, layer.values) for layer in cache.layers]
        first = DecodeStep(0, self.head_logits(last), hidden)
        return LockstepPrefill(kv, mask, tuple(lengths), wanted, first)

    def _prefill_part(
        self,
        ids: torch.Tensor,
        mask: torch.Tensor,
        positions: torch.Tensor,
        wanted: tuple[int, ...],
    ):
        from transformers.cache_utils import DynamicLayer

        cache, last, hidden = self._run_prefill(ids, mask, positions, wanted)
        if any(type(layer) is not DynamicLayer for layer in cache.layers):
            return None
        return [(layer.keys, layer.values) for layer in cache.layers], last, hidden

    def _merged_prefill(self, batches, parts, wanted, lengths) -> LockstepPrefill:
        """One left-padded layout from per-batch prefills: row r's keys and values end at the
        right edge, its padding (masked) before them, as `_left_padded` would place its tokens."""
        n, width = len(lengths), max(lengths)
        mask = torch.zeros((n, width), dtype=torch.long, device=self.device)
        kv: list[tuple[torch.Tensor, torch.Tensor]] = []
        layers0 = parts[0][0]
        for li in range(len(layers0)):
            k0, v0 = layers0[li]
            keys = k0.new_zeros((n, k0.shape[1], width, k0.shape[3]))
            values = v0.new_zeros((n, v0.shape[1], width, v0.shape[3]))
            for batch, (part_kv, _, _) in zip(batches, parts, strict=True):
                k, v = part_kv[li]
                for b, r in enumerate(batch):
                    keys[r, :, width - lengths[r] :] = k[b, :, k.shape[2] - lengths[r] :]
                    values[r, :, width - lengths[r] :] = v[b, :, v.shape[2] - lengths[r] :]
            kv.append((keys, values))
        last = torch.empty((n, parts[0][1].shape[-1]), dtype=parts[0][1].dtype, device=self.device)
        hidden = {x: torch.empty_like(last) for x in wanted}
        for batch, (_, part_last, part_hidden) in zip(batches, parts, strict=True):
            idx = torch.tensor(batch, device=self.device)
            last[idx] = part_last
            for x in wanted:
                hidden[x][idx] = part_hidden[x]
            for r in batch:
                mask[r, width - lengths[r] :] = 1
        first = DecodeStep(0, self.head_logits(last), hidden)
        return LockstepPrefill(kv, mask, tuple(lengths), wanted, first)

    def decode_from(
        self,
        state: LockstepPrefill,
        choose: Callable[[DecodeStep], int],
        max_new_tokens: int,
        *,
        layers: Sequence[int] = (),
        stop_ids: Sequence[int] = (),
    ) -> list[int]:
        """Decode from a prefill (`prefill_lockstep`), leaving it unchanged for the next call:
        the step-0 logits are the prefill's, then each chosen token is fed to every row through
        a key/value cache that starts from the prefill's tensors (a cache appends by
        concatenation, so they are never written). `layers` must be among the prefill's."""
        self._check_fits(max(state.lengths), max_new_tokens)
        wanted = sorted(set(int(x) for x in layers))
        if any(x not in state.layers for x in wanted):
            raise CisrankError(f"layers {wanted} were not all prefilled ({list(state.layers)})")
        from transformers import DynamicCache

        n = len(state.lengths)
        out_tokens: list[int] = []
        stops = {int(t) for t in stop_ids}
        mask = state.mask
        positions = torch.tensor(state.lengths, device=self.device).unsqueeze(1)
        cache = DynamicCache(ddp_cache_data=state.kv, config=self.model.config)
        current = DecodeStep(0, state.first.logits, {x: state.first.hidden[x] for x in wanted})
        with torch.inference_mode():
            for step in range(max_new_tokens):
                token = int(choose(current))
                out_tokens.append(token)
                if token in stops or step + 1 == max_new_tokens:
                    break
                ids = torch.full((n, 1), token, dtype=torch.long, device=self.device)
                mask = torch.cat([mask, torch.ones_like(ids)], dim=1)
                out = self.base(
                    input_ids=ids,
                    attention_mask=mask,
                    position_ids=positions,
                    **self._cache_arg(cache),
                    use_cache=True,
                    output_hidden_states=bool(wanted),
                )
                cache = self._out_cache(out)
                positions = positions + 1
                last = out.last_hidden_state[:, -1]
                hidden = {x: out.hidden_states[x][:, -1] for x in wanted}
                current = DecodeStep(step + 1, self.head_logits(last), hidden)
        return out_tokens
