"""RAG context assembly: arrange, pad and gauge a query's top passages with the causal LM, and
answer over them.

Built on the one causal-LM engine of `cisrank.lm` (no second forward loop): templates as data
(`templates`), the likelihood-scored arrangements and the question-likelihood gauge (`assemble`),
noise padding (`noise`), entropy-based decoding (`decoding`) and the order -> reorder -> generate
path of `cisrank generate` and `/v1/generate` (`generation`); modes and settings in `config`.

The methods are those of four papers, cited in the modules by title and equation:

- Liu et al. 2025, "Pointwise Mutual Information as a Performance Gauge for Retrieval-Augmented
  Generation" (arXiv 2411.07773): the PMI gauge, the rotation and curvature arrangements;
- Liu et al. 2025, "Likelihood as a Performance Gauge for Retrieval-Augmented Generation": the
  question likelihood, likelihood-based selection, ConvexScore;
- Cuconasu et al. 2024, "The Power of Noise: Redefining Retrieval for RAG Systems" (SIGIR 2024):
  noise padding;
- Qiu et al. 2025, "Entropy-Based Decoding for Retrieval-Augmented Large Language Models" (NAACL
  2025): the document-parallel decodings.

The modes and configs (`Arrangement`, `Decoding`, `AssemblerConfig`, ...) import no model code;
everything else loads on first use (it pulls in torch), so the CLI and the API schemas can read
the settings at start.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from cisrank.context.config import (
    ArrangeConfig,
    Arrangement,
    AssemblerConfig,
    DecoderConfig,
    Decoding,
    GenerationAssemblerConfig,
)

if TYPE_CHECKING:
    from cisrank.context.assemble import (
        AssembledContext,
        Candidate,
        ContextAssembler,
        Gauge,
        Ordering,
        Prompt,
        curvature_scores,
        edges_order,
        rotations,
        search_orders,
        shuffles,
    )
    from cisrank.context.decoding import EnsembleDecoder, Generation
    from cisrank.context.generation import Answer, answer_each, answer_question
    from cisrank.context.noise import (
        pad_with_noise,
        random_word_passages,
        sample_noise,
        sample_store_noise,
    )
    from cisrank.context.passages import read_passages
    from cisrank.context.templates import TEMPLATES, ContextTemplate, resolve_template

_LAZY = {
    "cisrank.context.assemble": (
        "AssembledContext",
        "Candidate",
        "ContextAssembler",
        "Gauge",
        "Ordering",
        "Prompt",
        "curvature_scores",
        "edges_order",
        "rotations",
        "search_orders",
        "shuffles",
    ),
    "cisrank.context.decoding": ("EnsembleDecoder", "Generation"),
    "cisrank.context.generation": ("Answer", "answer_each", "answer_question"),
    "cisrank.context.noise": (
        "pad_with_noise",
        "random_word_passages",
        "sample_noise",
        "sample_store_noise",
    ),
    "cisrank.context.passages": ("read_passages",),
    "cisrank.context.templates": ("TEMPLATES", "ContextTemplate", "resolve_template"),
}
_HOME = {name: module for module, names in _LAZY.items() for name in names}

__all__ = [
    "TEMPLATES",
    "Answer",
    "ArrangeConfig",
    "Arrangement",
    "AssembledContext",
    "AssemblerConfig",
    "Candidate",
    "ContextAssembler",
    "ContextTemplate",
    "DecoderConfig",
    "Decoding",
    "EnsembleDecoder",
    "Gauge",
    "Generation",
    "GenerationAssemblerConfig",
    "Ordering",
    "Prompt",
    "answer_each",
    "answer_question",
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


def __getattr__(name: str) -> Any:
    # The model side pulls in torch: import it only when one of its names is asked for.
    module = _HOME.get(name)
    if module is None:
        raise AttributeError(f"module 'cisrank.context' has no attribute {name!r}")
    return getattr(import_module(module), name)
