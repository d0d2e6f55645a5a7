"""Hybrid reranking: CIS fused with the dense bi-encoder and the first-stage order.

Why: the CIS paper (seed 002, Sec. 6) names hybrid metrics as its future work, and the parts fail
differently. A causal LM's likelihood ratio knows whether a passage *answers* the question but is
noisy across passages of different length and style; a bi-encoder's cosine measures topical
similarity; the first stage (BM25) holds exact term matches. Fusing per query lets each correct the
others where they err. The fusion itself (per-query normalized interpolation or RRF) lives in
`cisrank.data.fusion`, shared with `bench/hybrid_select.py`, which chooses the weights on DL21 runs.

The first stage enters by its order only: a reranker receives passages, not first-stage scores,
so component `first-stage` scores passage i of n as n - i (the input order, which is the BM25
order in `cisrank eval` and whatever order a `/v1/rerank` client sends).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator

from cisrank.config import ComponentConfig
from cisrank.data.fusion import RRF_K, fuse, parse_weights
from cisrank.errors import CisrankError
from cisrank.rerank.base import BaseReranker, IdentityReranker, Request, Reranker

FIRST_STAGE = "first-stage"


class HybridRerankerConfig(ComponentConfig):
    """Which scorers are fused, with which weights and method."""

    label: ClassVar[str] = "hybrid reranker"

    fuse: str = Field(
        default="cis:0.5,dense:0.5",
        description="Components and weights, 'KIND:W,...': reranker kinds (cis, dense, "
        "cross-encoder) and first-stage (the input order). --model goes to the first component "
        "that takes a model.",
    )
    fusion: Literal["linear", "rrf"] = Field(
        default="linear",
        description="linear: weighted sum of per-query normalized scores; rrf: sum of w/(k+rank).",
    )
    fusion_normalize: Literal["minmax", "zscore"] = Field(
        default="minmax", description="Per-query normalization of linear fusion."
    )
    rrf_k: float = Field(default=RRF_K, ge=0.0, description="RRF's k.")
    models: dict[str, str] = Field(
        default_factory=dict,
        description="Model per component kind, for components other than the one --model names.",
    )

    @field_validator("fuse")
    @classmethod
    def _check_fuse(cls, v: str) -> str:
        try:
            parse_weights(v)
        except ValueError as exc:
            raise ValueError(f"--fuse: {exc}") from None
        return v


def _route(kind: str, options: dict[str, Any]) -> dict[str, Any]:
    """The options a component's config declares, so `--estimator` reaches CIS and not dense."""
    from cisrank.rerank.registry import config_fields

    fields = config_fields(kind)
    return {k: v for k, v in options.items() if k in fields}


class HybridReranker(BaseReranker):
    """Scores each request with every component, then fuses per request (= per query).

    Example:
        HybridReranker(model="smollm2-135m-instruct", fuse="cis:0.6,dense:0.4", estimator="reverse")
    """

    name = "hybrid"

    def __init__(
        self,
        model: str | None = None,
        config: HybridRerankerConfig | None = None,
        components: dict[str, Reranker] | None = None,
        **options: Any,
    ) -> None:
        from cisrank.rerank.registry import check_name, config_fields, load_reranker

        own = {k: options.pop(k) for k in list(options) if k in HybridRerankerConfig.model_fields}
        self.config = (config or HybridRerankerConfig()).replace(**own)
        self.weights = parse_weights(self.config.fuse)
        kinds = [k for k in self.weights if k != FIRST_STAGE]
        for kind in kinds:
            if kind == self.name:
                raise CisrankError("--fuse: a hybrid reranker cannot contain itself")
            check_name(kind)
        claimed = set().union(*(config_fields(k) for k in kinds)) if kinds else set()
        stray = sorted(set(options) - claimed)
        if stray:
            raise CisrankError(
                f"option(s) {', '.join(stray)} belong to none of the fused rerankers "
                f"({', '.join(kinds) or 'first-stage only'})"
            )
        given = dict(components or {})
        self.components: dict[str, Reranker] = {}
        model_left = model
        for kind in self.weights:
            if kind in given:
                self.components[kind] = given[kind]
            elif kind == FIRST_STAGE:
                self.components[kind] = IdentityReranker()
            else:
                own_model = self.config.models.get(kind)
                if own_model is None and model_left is not None:
                    own_model, model_left = model_left, None
                self.components[kind] = load_reranker(kind, own_model, **_route(kind, options))
        if model_left is not None:
            raise CisrankError(
                f"--model {model_left}: no fused component takes a model ({self.config.fuse})"
            )
        self.model_name = "+".join(
            f"{kind}({r.model_name})" if r.model_name else kind
            for kind, r in self.components.items()
        )

    def score_batch(self, requests: Sequence[Request]) -> list[list[float]]:
        """Every component scores all requests in one call (keeping its own cross-request
        batching); fusion is per request, so a passage's fused score depends only on its query's
        candidates, never on the other requests."""
        requests = [(q, list(p)) for q, p in requests]
        per_kind = [r.score_batch(requests) for r in self.components.values()]
        weights = list(self.weights.values())
        return [
            fuse(
                [scores[i] for scores in per_kind],
                weights,
                self.config.fusion,
                self.config.fusion_normalize,
                self.config.rrf_k,
            )
            if passages
            else []
            for i, (_, passages) in enumerate(requests)
        ]
