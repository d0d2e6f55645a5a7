"""Lock-step decoding: several prompts decoded together, one shared generated suffix.

Entropy-based document-parallel ensembles (`cisrank.context.decoding`; Qiu et al. 2025) read the
next-token distributions of K + 1 prompts (one per passage, and one without) at every step and
append one chosen token to all of them. This module runs that on the torch backend:
`prefill_lockstep` runs the prompts once, `decode_from` continues from the prefill as often as
asked (several decodings of the same prompts pay for one prefill). Each step's memory is
R x V logits for R rows, never `[R, L, V]`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from cisrank.errors import CisrankError
from cisrank.runtimes.batching import LengthBatcher, pad_batch
from cisrank.runtimes.lm_torch import TorchBackend


@dataclass(frozen=True, slots=True)
class DecodeStep:
    """One step of lock-step decoding: float32 next-token `logits` of every row `[R, V]` and
    the last position's hidden states of the requested layers `{layer: [R, H]}`."""

    step: int
    logits: torch.Tensor
    hidden: dict[int, torch.Tensor]


@dataclass(frozen=True, slots=True)
class LockstepPrefill:
    """Prompts prefilled for lock-step decoding (`prefill_lockstep`).

    `kv`: per model layer, the rows' keys and values `[R, heads, W, head_dim]`, each row
    right-aligned behind masked left padding (`mask`, `[R, W]`); `lengths`: each row's tokens;
    `layers`: the layers whose hidden states `first` holds; `first`: step 0 (the last
    position's logits and hidden states)."""

    kv: list[tuple[torch.Tensor, torch.Tensor]]
    mask: torch.Tensor
    lengths: tuple[int, ...]
    layers: tuple[int, ...]
    first: DecodeStep


def check_fits(backend: TorchBackend, longest: int, max_new_tokens: int, limit: int | None) -> None:
    if limit is not None and longest + max_new_tokens > limit:
        raise CisrankError(
            f"a prompt of {longest} tokens plus {max_new_tokens} new tokens exceeds the "
            f"context of '{backend.model_name}' ({limit} tokens): pass fewer or shorter "
            "passages, or lower --max-new-tokens"
        )


def prefill_lockstep(
    backend: TorchBackend,
    batcher: LengthBatcher,
    pad_id: int,
    rows: Sequence[Sequence[int]],
    *,
    layers: Sequence[int] = (),
    max_new_tokens: int = 1,
    max_positions: int | None = None,
) -> LockstepPrefill:
    """Run the prompts of a lock-step decoding once; `decode_from` continues from the result.

    The rows are prefilled in the engine's length batches (near-equal lengths, explicit position
    ids, so each row computes what it would alone), not as one batch padded to the longest: the
    K + 1 prompts of document-parallel decoding differ in length by up to 5x, and on a CPU
    padding is pure loss. Their key/value tensors are then laid side by side, right-aligned,
    with the left padding masked out, as one left-padded batch would hold them. `layers`: the
    hidden states (at each row's last position) that steps may ask for; `max_new_tokens`: the
    most any decoding from it will add (checked against `max_positions` before any work).
    """
    rows = [[int(t) for t in r] for r in rows]
    if not rows or any(not r for r in rows):
        raise CisrankError("every decoded row needs at least one token (BOS)")
    wanted = tuple(sorted(set(int(x) for x in layers)))
    if any(not 0 <= x <= backend.num_layers for x in wanted):
        raise CisrankError(f"layers must be in 0..{backend.num_layers}, got {list(layers)}")
    lengths = [len(r) for r in rows]
    check_fits(backend, max(lengths), max_new_tokens, max_positions)
    batches = batcher.plan(lengths)
    with torch.inference_mode():
        if len(batches) == 1:  # one batch is already the layout decoding reads
            return _prefilled(backend, *_left_padded(backend, rows, pad_id), wanted, lengths)
        parts = [
            _prefill_part(backend, *_left_padded(backend, [rows[i] for i in b], pad_id), wanted)
            for b in batches
        ]
        if not all(p is not None for p in parts):
            # a cache that is not plain key/value tensors (sliding windows, recurrent state):
            # prefill every row in one left-padded batch, the layout it reads
            ids, mask, positions = _left_padded(backend, rows, pad_id)
            return _prefilled(backend, ids, mask, positions, wanted, lengths)
        return _merged_prefill(backend, batches, parts, wanted, lengths)


def _left_padded(
    backend: TorchBackend, rows: Sequence[Sequence[int]], pad_id: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    device = backend.torch_device
    np_ids, np_mask, offsets = pad_batch(rows, pad_id, left=True)
    ids = torch.from_numpy(np_ids).to(device)
    mask = torch.from_numpy(np_mask).to(device)
    off = torch.tensor(offsets, device=device).unsqueeze(1)
    positions = (torch.arange(ids.shape[1], device=device).unsqueeze(0) - off).clamp_min(0)
    return ids, mask, positions


def _forward(
    backend: TorchBackend,
    ids: torch.Tensor,
    mask: torch.Tensor,
    positions: torch.Tensor,
    cache: Any,
    wanted: Sequence[int],
) -> tuple[Any, torch.Tensor, dict[int, torch.Tensor]]:
    """One forward of the base model over `ids` after `cache` (a prefill: an empty one; a
    decoding step: the rows' cache so far): the cache after it, the last position's hidden
    state and that of each `wanted` layer."""
    out = backend.base(
        input_ids=ids,
        attention_mask=mask,
        position_ids=positions,
        **backend.cache_arg(cache),
        use_cache=True,
        output_hidden_states=bool(wanted),
    )
    hidden = {x: out.hidden_states[x][:, -1] for x in wanted}
    return backend.out_cache(out), out.last_hidden_state[:, -1], hidden


def _prefilled(
    backend: TorchBackend,
    ids: torch.Tensor,
    mask: torch.Tensor,
    positions: torch.Tensor,
    wanted: tuple[int, ...],
    lengths: list[int],
) -> LockstepPrefill:
    cache, last, hidden = _forward(backend, ids, mask, positions, backend.new_cache(), wanted)
    kv = [(layer.keys, layer.values) for layer in cache.layers]
    first = DecodeStep(0, backend.head_logits(last), hidden)
    return LockstepPrefill(kv, mask, tuple(lengths), wanted, first)


_Part = tuple[list[tuple[torch.Tensor, torch.Tensor]], torch.Tensor, dict[int, torch.Tensor]]


def _prefill_part(
    backend: TorchBackend,
    ids: torch.Tensor,
    mask: torch.Tensor,
    positions: torch.Tensor,
    wanted: tuple[int, ...],
) -> _Part | None:
    from transformers.cache_utils import DynamicLayer

    cache, last, hidden = _forward(backend, ids, mask, positions, backend.new_cache(), wanted)
    if any(type(layer) is not DynamicLayer for layer in cache.layers):
        return None
    return [(layer.keys, layer.values) for layer in cache.layers], last, hidden


def _merged_prefill(
    backend: TorchBackend,
    batches: list[list[int]],
    parts: Sequence[_Part | None],
    wanted: tuple[int, ...],
    lengths: list[int],
) -> LockstepPrefill:
    """One left-padded layout from per-batch prefills: row r's keys and values end at the
    right edge, its padding (masked) before them, as `_left_padded` would place its tokens."""
    done = [p for p in parts if p is not None]
    device = backend.torch_device
    n, width = len(lengths), max(lengths)
    mask = torch.zeros((n, width), dtype=torch.long, device=device)
    kv: list[tuple[torch.Tensor, torch.Tensor]] = []
    layers0 = done[0][0]
    for li in range(len(layers0)):
        k0, v0 = layers0[li]
        keys = k0.new_zeros((n, k0.shape[1], width, k0.shape[3]))
        values = v0.new_zeros((n, v0.shape[1], width, v0.shape[3]))
        for batch, (part_kv, _, _) in zip(batches, done, strict=True):
            k, v = part_kv[li]
            for b, r in enumerate(batch):
                keys[r, :, width - lengths[r] :] = k[b, :, k.shape[2] - lengths[r] :]
                values[r, :, width - lengths[r] :] = v[b, :, v.shape[2] - lengths[r] :]
        kv.append((keys, values))
    last = torch.empty((n, done[0][1].shape[-1]), dtype=done[0][1].dtype, device=device)
    hidden = {x: torch.empty_like(last) for x in wanted}
    for batch, (_, part_last, part_hidden) in zip(batches, done, strict=True):
        idx = torch.tensor(batch, device=device)
        last[idx] = part_last
        for x in wanted:
            hidden[x][idx] = part_hidden[x]
        for r in batch:
            mask[r, width - lengths[r] :] = 1
    first = DecodeStep(0, backend.head_logits(last), hidden)
    return LockstepPrefill(kv, mask, tuple(lengths), wanted, first)


def decode_from(
    backend: TorchBackend,
    state: LockstepPrefill,
    choose: Callable[[DecodeStep], int],
    max_new_tokens: int,
    *,
    layers: Sequence[int] = (),
    stop_ids: Sequence[int] = (),
    max_positions: int | None = None,
) -> list[int]:
    """Greedy-style decoding from a prefill, leaving it unchanged for the next call.

    Row r reads its prompt + generated. At each step `choose` gets the float32 next-token
    logits of every row (`[R, V]`) and, for each of `layers` (among the prefill's), the rows'
    hidden states at the last position (`{layer: [R, H]}`, raw: see
    `TorchBackend.layer_logits`) and returns the token appended to all rows. Stops after
    `max_new_tokens` or a token in `stop_ids` (which is kept). The step-0 logits are the
    prefill's; each chosen token is then fed to every row through a key/value cache that starts
    from the prefill's tensors (a cache appends by concatenation, so they are never written).
    """
    check_fits(backend, max(state.lengths), max_new_tokens, max_positions)
    wanted = sorted(set(int(x) for x in layers))
    if any(x not in state.layers for x in wanted):
        raise CisrankError(f"layers {wanted} were not all prefilled ({list(state.layers)})")
    device = backend.torch_device
    n = len(state.lengths)
    out_tokens: list[int] = []
    stops = {int(t) for t in stop_ids}
    mask = state.mask
    positions = torch.tensor(state.lengths, device=device).unsqueeze(1)
    cache = backend.new_cache(state.kv)
    current = DecodeStep(0, state.first.logits, {x: state.first.hidden[x] for x in wanted})
    with torch.inference_mode():
        for step in range(max_new_tokens):
            token = int(choose(current))
            out_tokens.append(token)
            if token in stops or step + 1 == max_new_tokens:
                break
            ids = torch.full((n, 1), token, dtype=torch.long, device=device)
            mask = torch.cat([mask, torch.ones_like(ids)], dim=1)
            cache, last, hidden = _forward(backend, ids, mask, positions, cache, wanted)
            positions = positions + 1
            current = DecodeStep(step + 1, backend.head_logits(last), hidden)
    return out_tokens


def decode_rows(
    backend: TorchBackend,
    state: LockstepPrefill,
    choose: Callable[[int, torch.Tensor], int],
    max_new_tokens: int,
    *,
    stop_ids: Sequence[int] = (),
    max_positions: int | None = None,
) -> list[list[int]]:
    """Independent decodings of the prefilled rows, one model step for all of them: row r
    continues its own prompt with its own tokens, `choose(r, logits)` picks each from the
    row's float32 next-token logits `[V]`. A row ends after `max_new_tokens` or a token of
    `stop_ids` (kept); a row that has ended is fed its last token again, and what follows is
    dropped, until every row has ended.

    Why: a small model's decoding step on a CPU costs its layers' overhead, not its
    arithmetic (SmolLM2-135M: about 0.1 s a step at one row, float32 or bf16 alike), so rows
    decoded together cost about what one costs. Each row reads its own prompt behind masked
    padding with its own positions, as `prefill_lockstep` lays them out: what it computes is
    what it computes alone, up to the rounding of a wider batch (tests/lm/test_decode_rows.py)."""
    check_fits(backend, max(state.lengths), max_new_tokens, max_positions)
    device = backend.torch_device
    n = len(state.lengths)
    stops = {int(t) for t in stop_ids}
    out: list[list[int]] = [[] for _ in range(n)]
    live = [True] * n
    mask = state.mask
    positions = torch.tensor(state.lengths, device=device).unsqueeze(1)
    cache = backend.new_cache(state.kv)
    logits = state.first.logits
    with torch.inference_mode():
        for step in range(max_new_tokens):
            fed = []
            for r in range(n):
                if live[r]:
                    token = int(choose(r, logits[r]))
                    out[r].append(token)
                    live[r] = token not in stops and step + 1 < max_new_tokens
                fed.append(out[r][-1])
            if not any(live):
                break
            ids = torch.tensor(fed, dtype=torch.long, device=device).unsqueeze(1)
            mask = torch.cat([mask, torch.ones_like(ids)], dim=1)
            cache, last, _ = _forward(backend, ids, mask, positions, cache, ())
            positions = positions + 1
            logits = backend.head_logits(last)
    return out
