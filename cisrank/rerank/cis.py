"""CIS reranker: rank passages by causal relevance, `CIS(Q->K) = log p(K|Q) - log p(K)`.

Implements this CIS contract on top of the one causal-LM engine (`cisrank.lm.engine`):

- D = the passage's tokens without special tokens, truncated to `max_doc_tokens` (the same D in
  both terms); P = the templated query's tokens; B = [BOS] (EOS where there is no BOS);
- log p(K|Q) scores D after [B, P]; log p(K) scores D after [B]; ids are joined, never strings;
- `log p(K)` comes from the prior store when one is given (misses are computed in batches and
  written back), else from an in-memory cache for the lifetime of the reranker.

`normalize="sum"` (the paper, default) returns summed log-probabilities; `"mean"` divides each of
`score`, `log_conditional` and `log_prior` by the passage's token count, so that long passages are
not favoured or penalised for their length alone.

Two estimators of the same quantity (`estimator`): by Bayes, log p(K|Q) - log p(K) =
log p(Q|K) - log p(Q), and log p(Q) is the same for every passage of a query, so the query's
likelihood after a passage-first template (`reverse`, no prior needed; a query-likelihood
reranker) ranks by the same CIS as the `forward` estimate. An LM with prompt templates is not a
consistent joint distribution, so the two differ in practice; `both` averages them. Templates:
`cisrank.lm.prompts`.

`prior=False` drops log p(K) from the forward estimate and ranks by log p(K|Q) alone: the
paper's ablation "w/o p(K)" (its Table 4, about 40% of EM/F1 lost), kept as a setting so that the
claim can be measured (`cisrank eval rag`); no prior is computed or stored then.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cisrank.errors import CisrankError
from cisrank.lm.backends import load_engine
from cisrank.lm.engine import CausalLMEngine
from cisrank.lm.prompts import (
    CHAT,
    FORWARD_TEMPLATES,
    ReverseTemplate,
    render_chat,
    resolve_forward,
    resolve_reverse,
)
from cisrank.rerank.base import BaseReranker, PassageWindow, fast_only
from cisrank.rerank.configs import CISRerankerConfig, reverse_only
from cisrank.rerank.prior_store import PriorStore, passage_key, store_fingerprint
from cisrank.rerank.prior_table import Priors, open_prior_store
from cisrank.runtimes.auto import resolve_lm_backend

TEMPLATES = FORWARD_TEMPLATES
_MEMORY_PRIORS_MAX = 200_000


class CISReranker(BaseReranker):
    """Causal Inference Score reranker over any Hugging Face causal LM.

    Example:
        r = CISReranker(model="/path/to/model", template="qa", prior_store="priors.sqlite")
        r.score("When was the author of Hamlet born?", passages)
    """

    name = "cis"

    def __init__(
        self,
        model: str | None = None,
        *,
        config: CISRerankerConfig | None = None,
        engine: CausalLMEngine | None = None,
        prior_store: Priors | PriorStore | str | Path | None = None,
        **options: Any,
    ) -> None:
        """`options` are `CISRerankerConfig` fields. Two resources may be handed in instead of
        built: `engine`, an already loaded LM (several rerankers then share one model), and
        `prior_store` as an open store object rather than the config's path (a job that fills
        the store keeps it open)."""
        store_obj = None if isinstance(prior_store, (str, Path)) else prior_store
        path = None if prior_store is None or store_obj is not None else str(prior_store)
        self.config = (config or CISRerankerConfig()).replace(
            model=model, prior_store=path, **options
        )
        if engine is None:
            # `auto` made concrete here, so that the config (what describes this reranker in
            # teacher sets, logs and /v1/models) names the runtime that really scores.
            backend, dtype = resolve_lm_backend(
                self.config.backend, self.config.device, self.config.dtype
            )
            self.config = self.config.replace(backend=backend, dtype=dtype)
        else:
            self.config = self.config.replace(backend=engine.backend.name)
        self.engine = engine or load_engine(
            self.config.model,
            backend=self.config.backend,
            device=self.config.device,
            dtype=self.config.dtype,
            batch_size=self.config.batch_size,
            batch_tokens=self.config.batch_tokens,
            max_padding=self.config.max_padding,
            padding_side=self.config.padding_side,
        )
        self.model_name = self.config.model if engine is None else engine.model_name
        # Capabilities: the LM and its tokenizer, and (below) the prior store. No pair-token
        # limit: a passage is cut to `max_doc_tokens`, the templated query is not cut.
        self.passage_major = reverse_only(self.config)
        self.causal_lm = self.engine
        self.fast_tokenizer = fast_only(self.engine.tokenizer)
        self.passage_window = PassageWindow(self.config.max_doc_tokens, self.fast_tokenizer)
        self.compute_type = self.engine.compute_type
        self.runtime = self.engine.backend.name
        if store_obj is not None:
            self.prior_store: Priors | None = store_obj
        elif self.config.prior_store:
            self.prior_store = open_prior_store(self.config.prior_store)
        else:
            self.prior_store = None
        self._memory_priors: dict[str, tuple[float, int]] = {}
        self._store_fp: str | None = None
        bos_text = self.engine.tokenizer.convert_ids_to_tokens(self.engine.bos_id)
        self.template = resolve_forward(self.config.template)
        if self.template == CHAT:
            self.template = render_chat(self.engine.tokenizer, False, bos_text)
        reverse = resolve_reverse(self.config.reverse_template)
        if reverse == CHAT:
            reverse = render_chat(self.engine.tokenizer, True, bos_text)
        self.reverse_template = ReverseTemplate.parse(reverse)

    # ------------------------------------------------------------------ pieces
    @property
    def normalize(self) -> str:
        return self.config.normalize

    @property
    def store_fingerprint(self) -> str:
        """Namespace of this reranker's priors: model, tokenizer, dtype and `max_doc_tokens`."""
        if self._store_fp is None:
            self._store_fp = store_fingerprint(
                self.engine.fingerprint(), self.config.max_doc_tokens
            )
        return self._store_fp

    def prefix_ids(self, query: str) -> list[int]:
        """[BOS] + tokens of the templated query, tokenized on its own."""
        return [self.engine.bos_id, *self.engine.encode(self.template.format(query=query))]

    def passage_ids(self, passages: Sequence[str]) -> list[list[int]]:
        """D for each passage: tokens without special tokens, truncated to `max_doc_tokens`."""
        if isinstance(passages, str):
            raise CisrankError("passages must be a list of strings, not one string")
        return self.engine.encode_batch(passages, self.config.max_doc_tokens)

    def _norm(self, values: Sequence[float], counts: Sequence[int]) -> list[float]:
        if self.config.normalize == "mean":
            return [v / max(n, 1) for v, n in zip(values, counts, strict=True)]
        return [float(v) for v in values]

    def _conditional_raw(self, query: str, docs: list[list[int]]) -> list[float]:
        return self.engine.score_continuations(self.prefix_ids(query), docs).logprobs

    def _prior_raw(self, docs: list[list[int]]) -> list[float]:
        """Summed log p(K) per passage: store (or memory) first, misses computed and written."""
        keys = [passage_key(d) for d in docs]
        if self.prior_store is not None:
            known = self.prior_store.get_many(self.store_fingerprint, keys)
        else:
            known = {k: self._memory_priors[k] for k in keys if k in self._memory_priors}
        missing: dict[str, list[int]] = {}
        for k, d in zip(keys, docs, strict=True):
            if k not in known:
                missing.setdefault(k, d)
        if missing:
            miss_keys = list(missing)
            res = self.engine.score_continuations(
                [self.engine.bos_id], [missing[k] for k in miss_keys]
            )
            fresh = {
                k: (lp, n) for k, lp, n in zip(miss_keys, res.logprobs, res.num_tokens, strict=True)
            }
            if self.prior_store is not None:
                self.prior_store.put_many(
                    self.store_fingerprint, [(k, lp, n) for k, (lp, n) in fresh.items()]
                )
            else:
                if len(self._memory_priors) + len(fresh) > _MEMORY_PRIORS_MAX:
                    self._memory_priors.clear()
                self._memory_priors.update(fresh)
            known.update(fresh)
        return [known[k][0] for k in keys]

    # ------------------------------------------------------------------ public API
    def summed_log_priors(self, docs: list[list[int]]) -> list[float]:
        """Summed log p(K) of already tokenized passages (see `passage_ids`), through the store:
        the offline prior job fills the store through exactly this path."""
        return self._prior_raw(docs)

    def log_conditional(self, query: str, passages: Sequence[str]) -> list[float]:
        """log p(K|Q) per passage, input order (divided by token count if normalize='mean')."""
        docs = self.passage_ids(passages)
        return self._norm(self._conditional_raw(query, docs), [len(d) for d in docs])

    def log_prior(self, passages: Sequence[str]) -> list[float]:
        """log p(K) per passage, input order, read from / written to the prior store."""
        docs = self.passage_ids(passages)
        return self._norm(self._prior_raw(docs), [len(d) for d in docs])

    def components(
        self, query: str, passages: Sequence[str]
    ) -> tuple[list[float], list[float], list[float]]:
        """(CIS, log p(K|Q), log p(K)) per passage from one pass: the distillation teacher keeps
        all three, so a student can later be trained on either term."""
        return self.components_batch([(query, passages)])[0]

    def components_batch(
        self, requests: Sequence[tuple[str, Sequence[str]]]
    ) -> list[tuple[list[float], list[float], list[float]]]:
        """`components` of each (query, passages) request. The passages of all requests are
        tokenized in one call and their priors looked up (and the misses computed, in shared
        batches) in one pass; log p(K|Q) runs per query, each with its own prefix cache."""
        out: list[tuple[list[float], list[float], list[float]]] = []
        for rows in self.parts_batch(requests, ("prior", "conditional")):
            counts = [int(p["doc_tokens"]) for p in rows]
            cond = [p["conditional"] for p in rows]
            prior = [p["prior"] for p in rows]
            cis = [c - q for c, q in zip(cond, prior, strict=True)]
            out.append(
                (self._norm(cis, counts), self._norm(cond, counts), self._norm(prior, counts))
            )
        return out

    def reverse_spans(
        self,
        requests: Sequence[tuple[str, Sequence[str]]],
        docs: Sequence[list[int]] | None = None,
    ) -> list[tuple[list[int], list[int]]]:
        """(context, target) ids of every pair, in request order: `[BOS, before, D, between]`
        and the query's ids, the rows `reverse_batch` scores (and `bench/cis_floor.py` counts);
        `docs`: the passages' D in that order where the caller has tokenized them already."""
        if docs is None:
            docs = self.passage_ids([p for _, ps in requests for p in ps])
        ids = iter(docs)
        encode, bos = self.engine.encode, self.engine.bos_id
        return [
            self.reverse_template.ids(encode, bos, next(ids), query)
            for query, ps in requests
            for _ in ps
        ]

    def reverse_batch(self, requests: Sequence[tuple[str, Sequence[str]]]) -> list[list[float]]:
        """log p(Q|K) per passage of each request under the passage-first template (mean per
        query token if normalize='mean'): the reverse estimate of CIS, up to log p(Q), which is
        the same for every passage of a query. Each passage is its own long context and the
        query one short target, so all pairs of all requests go to the engine at once, batched
        by length; the LM head runs at the query's positions only."""
        return [
            self._norm(
                [p["query_likelihood"] for p in rows], [int(p["query_tokens"]) for p in rows]
            )
            for rows in self.parts_batch(requests, ("query_likelihood",))
        ]

    def parts_batch(
        self, requests: Sequence[tuple[str, Sequence[str]]], sides: Sequence[str]
    ) -> list[list[dict[str, float]]]:
        """The summed log-probabilities `sides` (`CISRerankerConfig.sides`: `conditional`,
        `prior`, `query_likelihood`) of every pair, with `doc_tokens` (and `query_tokens` with
        `query_likelihood`): what `config.estimate` makes any estimate of, so that settings
        differing only in estimator, prior or normalization share one pass of the model (the
        forward: priors looked up or computed in shared batches, log p(K|Q) per query with
        its prefix cache; the reverse: all pairs at once, batched by length)."""
        unknown = set(sides) - {"conditional", "prior", "query_likelihood"}
        if unknown:
            raise CisrankError(f"unknown CIS sides {sorted(unknown)}")
        for _, passages in requests:
            if isinstance(passages, str):
                raise CisrankError("passages must be a list of strings, not one string")
        docs = self.passage_ids([p for _, passages in requests for p in passages])
        columns: dict[str, list[float]] = {"doc_tokens": [float(len(d)) for d in docs]}
        if "prior" in sides:
            columns["prior"] = self._prior_raw(docs) if docs else []
        if "conditional" in sides:
            start = 0
            columns["conditional"] = []
            for query, passages in requests:
                end = start + len(passages)
                if end > start:
                    columns["conditional"] += self._conditional_raw(query, docs[start:end])
                start = end
        if "query_likelihood" in sides:
            res = self.engine.score_spans(self.reverse_spans(requests, docs))
            columns["query_likelihood"] = [float(v) for v in res.logprobs]
            columns["query_tokens"] = [float(n) for n in res.num_tokens]
        rows = [
            dict(zip(columns, values, strict=True))
            for values in zip(*columns.values(), strict=True)
        ]
        out: list[list[dict[str, float]]] = []
        start = 0
        for _, passages in requests:
            out.append(rows[start : start + len(passages)])
            start += len(passages)
        return out

    def score_batch(self, requests: Sequence[tuple[str, Sequence[str]]]) -> list[list[float]]:
        """The configured estimate of CIS per passage of each request, input order: forward
        (log p(K|Q) - log p(K); log p(K|Q) alone with `prior` off, for which no prior is looked
        up or computed), reverse (log p(Q|K)) or both (their mean): `config.estimate` of the
        `parts_batch` its `sides` need."""
        parts = self.parts_batch(requests, self.config.sides())
        return [self.config.estimate(p) for p in parts]

    def __repr__(self) -> str:
        return (
            f"CISReranker(model={self.model_name!r}, estimator={self.config.estimator!r}, "
            f"template={self.config.template!r}, reverse_template={self.config.reverse_template!r}, "
            f"max_doc_tokens={self.config.max_doc_tokens}, normalize={self.config.normalize!r}, "
            f"prior={self.config.prior})"
        )
