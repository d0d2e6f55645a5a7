"""RAG context assembly: arrange, pad and gauge a query's top passages with the causal LM.

Built on the one causal-LM engine of `cisrank.lm` (no second forward loop): templates as data
(`templates`), the likelihood-scored arrangements and the question-likelihood gauge (`assemble`,
seeds 000/001), and noise padding (`noise`, seed 003).
"""

from cisrank.context.assemble import (
    ARRANGEMENTS,
    Arrangement,
    AssembledContext,
    Candidate,
    ContextAssembler,
    Gauge,
    Prompt,
    curvature_scores,
    edges_order,
    rotations,
    search_orders,
    shuffles,
)
from cisrank.context.noise import (
    pad_with_noise,
    random_word_passages,
    sample_noise,
    sample_store_noise,
)
from cisrank.context.passages import read_passages
from cisrank.context.templates import TEMPLATES, ContextTemplate, resolve_template

__all__ = [
    "ARRANGEMENTS",
    "TEMPLATES",
    "Arrangement",
    "AssembledContext",
    "Candidate",
    "ContextAssembler",
    "ContextTemplate",
    "Gauge",
    "Prompt",
    "curvature_scores",
    "edges_order",
    "pad_with_noise",
    "random_word_passages",
    "read_passages",
    "resolve_template",
    "rotations",
    "sample_noise",
    "sample_store_noise",
    "search_orders",
    "shuffles",
]
