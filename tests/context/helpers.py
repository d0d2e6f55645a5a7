"""Helpers of the context tests: passages, the question, and the brute-force reference."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from cisrank.data.types import Passage
from cisrank.lm.engine import CausalLMEngine
from cisrank.testing import SAMPLE_SENTENCES

QUESTION = "when was the author of hamlet born ?"
TITLES = ["Hamlet", "Shakespeare", "Denmark", "Paris", "Fleas", "Goldfish", "Bluetooth", "War"]


@dataclass
class Tiny:
    arch: str
    engine: CausalLMEngine
    ref: torch.nn.Module
    tokenizer: object

    def brute_mean(self, ids: list[int], span: tuple[int, int]) -> float:
        """Mean log p(ids[span] | ids before), one full float64 forward of the whole prompt."""
        with torch.no_grad():
            logits = self.ref(torch.tensor([ids])).logits[0].double()
        lp = torch.log_softmax(logits, dim=-1)
        a, b = span
        return float(sum(lp[i - 1, ids[i]] for i in range(a, b)) / (b - a))

    def prompt_ids(self, text: str) -> list[int]:
        """The rendered prompt tokenized whole (word-level: the same as piecewise)."""
        return [self.engine.bos_id, *self.tokenizer(text, add_special_tokens=False)["input_ids"]]


def passages(k: int) -> list[Passage]:
    return [Passage(f"p{i}", SAMPLE_SENTENCES[i], TITLES[i]) for i in range(k)]
