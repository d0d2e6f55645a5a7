"""ListNet's loss (Cao et al., ICML 2007) over padded lists, apart from any student: the
cross-encoder's length-sorted loss (`listwise.py`) and the bi-encoder's (`bi.py`) both take it, and
neither student's module needs the other's."""

from __future__ import annotations

import torch
from torch import Tensor


def listnet_loss(scores: Tensor, labels: Tensor, mask: Tensor) -> Tensor:
    """Mean over queries of -sum_i softmax(labels)_i log softmax(scores)_i, over the positions
    where `mask` is true (lists of unequal length are padded to one width)."""
    neg = torch.finfo(scores.dtype).min
    target = labels.masked_fill(~mask, float("-inf")).softmax(dim=1)
    log_p = scores.masked_fill(~mask, neg).log_softmax(dim=1)
    return -(target * log_p.masked_fill(~mask, 0.0)).sum(dim=1).mean()
