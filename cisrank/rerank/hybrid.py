"""Hybrid reranking: CIS fused with the dense bi-encoder and the first-stage order.

Why: the CIS paper ("Grounding Large Language Model with Causal Knowledge Retrieval", Sec. 7)
names hybrid metrics as its future work, and the parts fail differently. A causal LM's likelihood
ratio knows whether a passage *answers* the question but is noisy across passages of different
length and style; a bi-encoder's cosine measures topical similarity; the first stage (BM25) holds
exact term matches. Fusing per query lets each correct the others where they err. The fusion itself (per-query normalized interpolation or RRF) lives in
`cisrank.fusion`, shared with `bench/hybrid_select.py`, which chooses the weights on DL21 runs.

The first stage enters by its order only: a reranker receives passages, not first-stage scores,
so component `first-stage` scores passage i of n as n - i (the input order, which is the BM25
order in `cisrank eval` and whatever order a `/v1/rerank` client sends).

Both the normalization and the positions are the whole request's: a hybrid is a
`CombiningReranker`. Its parts are its components' parts, a passage's alone; the fusion is its
`combine`, once per whole request. Scoring a request in slices (the API's batcher) or dealing its
passages to worker processes fused each piece on its own before: min-max over one passage is 0,
so a served hybrid answered other scores and another order than `load_reranker("hybrid").rank`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from cisrank.errors import CisrankError
from cisrank.fusion import fuse, parse_weights
from cisrank.rerank.base import CombiningReranker, IdentityReranker, Part, Request, Reranker
from cisrank.rerank.configs import HybridRerankerConfig

FIRST_STAGE = "first-stage"


def _joined(values: Mapping[str, str | None]) -> str | None:
    """One capability of the components (a compute type, a runtime): the value where they
    share one, else each named by kind ("cis:bfloat16+dense:float32"); None where none has it."""
    given = {k: v for k, v in values.items() if v}
    if len(set(given.values())) == 1:
        return next(iter(given.values()))
    return "+".join(f"{k}:{v}" for k, v in given.items()) or None


class Parts(Protocol):
    """What the hybrid needs to build the rerankers it fuses: the registry, handed in by
    `load_reranker("hybrid", ...)`. Handed in, not imported, because the registry imports this
    module."""

    def fields(self, kind: str) -> frozenset[str]:
        """The options reranker `kind` takes; an `UnknownRerankerError` if there is no such kind."""
        ...

    def load(self, kind: str, model: str | None, options: Mapping[str, Any]) -> Reranker: ...


class HybridReranker(CombiningReranker):
    """Scores each request with every component, then fuses per request (= per query).

    Example:
        load_reranker("hybrid", "smollm2-135m-instruct", fuse="cis:0.6,dense:0.4",
                      estimator="reverse")
    """

    name = "hybrid"

    def __init__(
        self,
        model: str | None = None,
        *,
        config: HybridRerankerConfig | None = None,
        components: Mapping[str, Reranker] | None = None,
        parts: Parts | None = None,
        **options: Any,
    ) -> None:
        """`options` are `HybridRerankerConfig` fields and the options of the fused kinds, each
        routed to the kinds whose configs declare it. The fused rerankers are `components` where
        given (by kind), else built by `parts` with `model` going to the first that takes one."""
        own = {k: options.pop(k) for k in list(options) if k in HybridRerankerConfig.model_fields}
        self.config = (config or HybridRerankerConfig()).replace(**own)
        self.weights = parse_weights(self.config.fuse)
        kinds = [k for k in self.weights if k != FIRST_STAGE]
        given = dict(components or {})
        fields: dict[str, frozenset[str]] = {}
        for kind in kinds:
            if kind == self.name:
                raise CisrankError("--fuse: a hybrid reranker cannot contain itself")
            if parts is not None:
                fields[kind] = parts.fields(kind)
        if parts is None:
            missing = [k for k in kinds if k not in given]
            if missing or options:
                what = f"no reranker for {', '.join(missing)}" if missing else "options given"
                raise CisrankError(
                    f"hybrid: {what}, and nothing to build the fused rerankers with: pass "
                    "components=, or build it with load_reranker('hybrid', ...)"
                )
        stray = sorted(set(options) - frozenset().union(*fields.values()))
        if stray:
            raise CisrankError(
                f"option(s) {', '.join(stray)} belong to none of the fused rerankers "
                f"({', '.join(kinds) or 'first-stage only'})"
            )
        self.components: dict[str, Reranker] = {}
        model_left = model
        for kind in self.weights:
            if kind in given:
                self.components[kind] = given[kind]
            elif kind == FIRST_STAGE:
                self.components[kind] = IdentityReranker()
            else:
                assert parts is not None  # checked above: without parts, nothing is missing
                own_model = self.config.models.get(kind)
                if own_model is None and model_left is not None:
                    own_model, model_left = model_left, None
                routed = {k: v for k, v in options.items() if k in fields[kind]}
                self.components[kind] = parts.load(kind, own_model, routed)
        if model_left is not None:
            raise CisrankError(
                f"--model {model_left}: no fused component takes a model ({self.config.fuse})"
            )
        self.model_name = "+".join(
            f"{kind}({r.model_name})" if r.model_name else kind
            for kind, r in self.components.items()
        )
        # Capabilities: none of its own. Its components read with several tokenizers and limits,
        # and a fused score is not one LM's: the `BaseReranker` defaults (None) stand. Its
        # compute type is its components', named by kind where they differ.
        self.compute_type = _joined({k: r.compute_type for k, r in self.components.items()})
        self.runtime = _joined({k: r.runtime for k, r in self.components.items()})
        # Its window: its most constrained component's (tokens in that one's tokenizer), so
        # that no component reads less of a window than it is sent.
        windows = [r.passage_window for r in self.components.values() if r.passage_window]
        self.passage_window = min(windows, key=lambda w: w.tokens) if windows else None
        # The passage cache of its bi-encoder, where one has one (at most one kind fuses once).
        caches = [r.passage_cache for r in self.components.values() if r.passage_cache is not None]
        self.passage_cache = caches[0] if caches else None

    def score_parts(self, requests: Sequence[Request]) -> list[list[Part]]:
        """Every component scores all requests in one call (keeping its own cross-request
        batching); a passage's part is the tuple of its components' parts, in `weights` order."""
        requests = [(q, list(p)) for q, p in requests]
        per_kind = [r.score_parts(requests) for r in self.components.values()]
        return [
            list(zip(*(parts[i] for parts in per_kind), strict=True)) for i in range(len(requests))
        ]

    def combine(self, query: str, passages: Sequence[str], parts: Sequence[Part]) -> list[float]:
        """Fusion per request (= per query): each component's scores of the whole list, then
        normalized and weighted over that list, so a passage's fused score depends only on its
        query's candidates, never on how they were sliced or on the other requests."""
        if not passages:
            return []
        components = [
            r.combine(query, passages, [p[k] for p in parts])
            for k, r in enumerate(self.components.values())
        ]
        return fuse(
            components,
            list(self.weights.values()),
            self.config.fusion,
            self.config.fusion_normalize,
            self.config.rrf_k,
        )
