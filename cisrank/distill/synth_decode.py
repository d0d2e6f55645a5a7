"""The decoding step of `distill synth`: a shard's prompts prefilled and decoded side by side on
the causal-LM engine, each reply ending at its first line break.

Rows are decoded together (`CausalLMEngine.decode_rows`): a small model's decoding step on a CPU
costs about what one row costs, so a shard of 16 prompts decodes for about the price of a few.
Greedy by default; with a temperature, each query samples from a generator seeded by the run's
seed, its passage and its number, so its tokens do not depend on which shard or worker it was
decoded in (up to the rounding of the batch it was prefilled with).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from functools import lru_cache
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from cisrank.distill.config import SynthConfig
    from cisrank.distill.synth_prompt import SynthItem


@lru_cache(maxsize=8)
def _line_break_ids(tokenizer: Any) -> frozenset[int]:
    """Every token whose text holds a line break: a query is one line."""
    ids = set()
    for token, i in tokenizer.get_vocab().items():
        if "\n" in tokenizer.convert_tokens_to_string([token]):
            ids.add(int(i))
    return frozenset(ids)


def stop_ids(tokenizer: Any) -> list[int]:
    """Line breaks and the tokenizer's end tokens (EOS, and a chat model's turn end)."""
    stops = set(_line_break_ids(tokenizer))
    for t in (tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|im_end|>")):
        if isinstance(t, int) and t >= 0 and t != tokenizer.unk_token_id:
            stops.add(int(t))
    return sorted(stops)


def _generator(seed: int, docid: str, n: int) -> torch.Generator:
    digest = hashlib.sha256(f"sample\x1f{seed}\x1f{docid}\x1f{n}".encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "big") >> 1)


def sample(logits: torch.Tensor, temperature: float, top_p: float, gen: torch.Generator) -> int:
    """A token from `softmax(logits / temperature)` cut to its smallest prefix of mass >= top_p."""
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    if top_p < 1.0:
        sorted_p, order = torch.sort(probs, descending=True)
        keep = torch.cumsum(sorted_p, dim=-1) - sorted_p < top_p
        keep[0] = True
        probs = torch.zeros_like(probs).scatter(0, order[keep], sorted_p[keep])
    return int(torch.multinomial(probs, 1, generator=gen))


def generate_queries(
    engine: Any, items: Sequence[SynthItem], config: SynthConfig
) -> list[dict[str, Any]]:
    """Each item's reply: `{"docid", "n", "text"}` (the decoded text, before cleaning)."""
    if not items:
        return []
    tok = engine.tokenizer
    rows = [[engine.bos_id, *engine.encode(it.prompt)] for it in items]
    state = engine.prefill_lockstep(rows, max_new_tokens=config.max_new_tokens)
    gens = [_generator(config.seed, it.docid, it.n) for it in items]

    def choose(row: int, logits: torch.Tensor) -> int:
        if config.temperature == 0:
            return int(torch.argmax(logits))
        return sample(logits, config.temperature, config.top_p, gens[row])

    decoded = engine.decode_rows(state, choose, config.max_new_tokens, stop_ids=stop_ids(tok))
    return [
        {"docid": it.docid, "n": it.n, "text": tok.decode(ids, skip_special_tokens=True)}
        for it, ids in zip(items, decoded, strict=True)
    ]
