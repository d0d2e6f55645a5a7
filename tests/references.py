"""Brute-force references the fast paths are checked against, shared by the tests that need them."""

from __future__ import annotations

import torch


def brute_tokens(ref, prefix: list[int], cont: list[int]) -> list[float]:
    """Per-token log p(cont | prefix): one full forward, plain log_softmax, float64."""
    if not cont:
        return []
    with torch.no_grad():
        logits = ref(torch.tensor([prefix + cont])).logits[0].double()
    lp = torch.log_softmax(logits, dim=-1)
    return [float(lp[len(prefix) + i - 1, t]) for i, t in enumerate(cont)]
