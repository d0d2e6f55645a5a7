"""Entropy-based document-parallel decoding, greedy, on the engine's lock-step decoder: the
methods of "Entropy-Based Decoding for Retrieval-Augmented Large Language Models" (Qiu et al.,
NAACL 2025; §2 there).

The formulas are numbered as in the paper and written out from its prose and a public
implementation of the method (`ParallelDecoding.clehe_using_logits`). With x the question,
d_1..d_K the passages and y_<t the tokens so far:

- `naive` (Eq. 1): y_t from p(y_t | [d_1; ...; d_K; x; y_<t]), one prompt with every passage;
- document-parallel modes run K+1 rows in lock-step, row 0 the prompt without passages and row j
  the prompt with passage d_j alone, all sharing y_<t, and merge the K passage rows' next-token
  distributions as a product of experts (Eq. 2, §2.1):

      log p(y_t) = sum_j w_{j,t} log p(y_t | d_j, x, y_<t)   (then renormalized)

  `avg_ens`: w_j = 1/K; `replug`: w_j = softmax(s_j / T) of the reranker scores s_j, fixed over
  time; `leens` (Eq. 3): w_{j,t} = softmax_j(-H_{j,t} / tau), with H_{j,t} the entropy of row j's
  next-token distribution at step t, recomputed every step (tau -> inf gives `avg_ens`);
- `clehe` (Eq. 4-7, §2.2): contrast with the most uncertain early-exit distribution of the
  no-passage row, q^(l) = softmax(phi(h_t^(l))) over candidate layers L, l* = argmax_{l in L}
  H(q^(l)),

      log p(y_t) = (1 + beta) sum_j w_{j,t} log p(y_t | d_j, x, y_<t) - beta log q^(l*)(y_t)

  (renormalized; beta = 0 gives `leens`).

Every mode is greedy (argmax of the merged log-probabilities). Per generated token the passage
of lowest entropy, argmin_j H_{j,t}, is returned as its attribution (the reference code's
`token_document_idx`), with the weights. Defaults (`DecoderConfig`) as the paper: tau 0.25, beta
0.25, candidate layers the even layers of the model's last half.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, TypedDict, Unpack

import numpy as np
import torch

from cisrank.context.assemble import ContextAssembler
from cisrank.context.config import DecoderConfig, Decoding
from cisrank.data.types import Passage
from cisrank.errors import CisrankError
from cisrank.lm.decoding import DecodeStep, LockstepPrefill


class DecodingTimeout(CisrankError):
    """Decoding passed the deadline it was given."""


class DecodingCancelled(CisrankError):
    """Decoding was cancelled by its caller (a server's client hung up)."""


def default_layers(num_layers: int) -> list[int]:
    """The even layers of the last half (Entropy-Based Decoding, §2.2: "the last few layers";
    §4, Implementation Details: only even-numbered layers are searched)."""
    return [x for x in range((num_layers + 1) // 2, num_layers + 1) if x % 2 == 0]


def entropy(logprobs: torch.Tensor) -> torch.Tensor:
    """Entropy of each row's distribution, from its log-probabilities `[R, V]`."""
    return torch.special.entr(logprobs.exp()).sum(dim=-1)


@dataclass
class StepRecord:
    """What one step decided: the token, the merged log-probabilities (with `trace`), the
    passage weights w_{j,t}, the entropies H_{j,t}, the lowest-entropy passage and the layer l*."""

    token: int
    weights: list[float]
    entropies: list[float]
    passage: int | None
    layer: int | None = None
    merged: np.ndarray | None = None


@dataclass
class Generation:
    """A decoded answer: its text, tokens, and per-token records (attribution)."""

    decoding: Decoding
    text: str
    tokens: list[int]
    steps: list[StepRecord] = field(default_factory=list)

    def why_empty(self, tokenizer: Any, chat: bool) -> str | None:
        """Why the answer's text is empty (None where it is not): its first token ended it (the
        end-of-sequence token: an instruct model ends its turn at once when its prompt is not in
        its chat template, `chat` False), or every token it generated is a special token or
        white space, which the text leaves out (a random-weight model's `<unk>`s)."""
        if self.text:
            return None
        shown = ", ".join(repr(t) for t in tokenizer.convert_ids_to_tokens(self.tokens[:5]))
        if self.tokens[:1] == [tokenizer.eos_token_id]:
            hint = "" if chat else " (an instruct model answers in its chat template: --chat)"
            return f"the model ended it at once with its end-of-sequence token {shown}{hint}"
        more = ", ..." if len(self.tokens) > 5 else ""
        return (
            f"its {len(self.tokens)} token(s) ({shown}{more}) are special tokens or white space, "
            "which the answer leaves out"
        )

    def to_json(self, passages: Sequence[Passage] | None = None) -> dict[str, Any]:
        def pid(j: int | None) -> Any:
            return passages[j].docid if passages is not None and j is not None else j

        return {
            "decoding": self.decoding,
            "answer": self.text,
            "tokens": self.tokens,
            "attribution": [pid(s.passage) for s in self.steps],
            "weights": [s.weights for s in self.steps],
            "layers": [s.layer for s in self.steps],
        }


class DecodeOptions(TypedDict, total=False):
    """The options of one decoding, as `EnsembleDecoder.generate` passes them on to
    `generate_many` (whose defaults they keep where left out)."""

    max_new_tokens: int | None
    scores: Sequence[float] | None
    stop_at_eos: bool
    trace: bool
    deadline: float | None
    cancel: threading.Event | None


class EnsembleDecoder:
    """Greedy RAG decoding of one question over K passages by any `Decoding`.

    Args:
        assembler: renders the prompts (its template and chat setting) and holds the engine.
        config: the decoding, tau (LeEns / CLeHe entropy temperature), beta (CLeHe contrast
            strength), layers (CLeHe candidate layers, default `default_layers`), the RePlug
            temperature T of the weights softmax(s / T) and the answer's length (default
            `DecoderConfig`); `overrides` replace its fields where not None.
    """

    def __init__(
        self, assembler: ContextAssembler, config: DecoderConfig | None = None, **overrides: Any
    ) -> None:
        self.config = (config or DecoderConfig()).replace(**overrides)
        self.assembler = assembler
        self.engine = assembler.engine
        n = self.engine.num_layers
        layers = self.config.layers
        self.layers = list(default_layers(n) if layers is None else layers)
        if not self.layers or any(not 0 <= x <= n for x in self.layers):
            raise CisrankError(f"candidate layers must be in 0..{n}, got {self.layers}")

    def generate(
        self,
        question: str,
        passages: Sequence[Passage],
        decoding: Decoding | str | None = None,
        **options: Unpack[DecodeOptions],
    ) -> Generation:
        """Decode an answer (`decoding` and `max_new_tokens` default to this decoder's config);
        `scores` (reranker scores, one per passage) are needed by `replug`; `naive` with no
        passages answers closed-book (the template with no documents).
        With `trace`, every step's merged log-probabilities are kept (V floats a step). Past
        `deadline` (a `time.monotonic()` value), checked at every step, it stops with
        `DecodingTimeout` (a server's bound on one request's model time); once `cancel` is set,
        at its next step, with `DecodingCancelled` (a server's client hung up)."""
        mode = self.config.decoding if decoding is None else Decoding.parse(decoding)
        return self.generate_many(question, passages, [mode], **options)[mode]

    def generate_many(
        self,
        question: str,
        passages: Sequence[Passage],
        decodings: Sequence[Decoding | str],
        *,
        max_new_tokens: int | None = None,
        scores: Sequence[float] | None = None,
        stop_at_eos: bool = True,
        trace: bool = False,
        deadline: float | None = None,
        cancel: threading.Event | None = None,
    ) -> dict[Decoding, Generation]:
        """Several decodings of one question over the same passages, each as `generate` gives it.

        The document-parallel decodings read the same K + 1 prompts and differ only in how they
        merge the rows' next-token distributions, so they share one prefill of those prompts
        (`CausalLMEngine.prefill_lockstep`) and each decodes on from it: asking for all four
        costs one prefill, not four. On a CPU the prefill is most of a short answer's cost."""
        modes = list(dict.fromkeys(Decoding.parse(d) for d in decodings))
        if not modes:
            raise CisrankError("no decoding asked for: give at least one")
        max_new_tokens, stops = self._limits(max_new_tokens, stop_at_eos)
        passages = list(passages)
        ensembles = [d for d in modes if d.ensemble]
        if not passages and ensembles:  # naive with none: the closed-book answer
            raise CisrankError("no passages to decode with: give at least one")
        fixed: torch.Tensor | None = None
        if Decoding.REPLUG in ensembles:
            if scores is None or len(scores) != len(passages):
                raise CisrankError("replug needs one reranker score per passage")
            fixed = torch.softmax(
                torch.tensor([float(s) for s in scores], dtype=torch.float64)
                / self.config.replug_temperature,
                dim=0,
            ).float()
        asm = self.assembler
        out: dict[Decoding, Generation] = {}
        if Decoding.NAIVE in modes:
            state = self.engine.prefill_lockstep(
                [asm.render(question, passages).ids], max_new_tokens=max_new_tokens
            )
            out[Decoding.NAIVE] = self._decode(
                state, Decoding.NAIVE, None, max_new_tokens, stops, trace, deadline, cancel
            )
        if ensembles:
            single = asm.template.single()
            rows = [asm.render(question, []).ids]
            rows += [asm.render(question, [p], template=single).ids for p in passages]
            layers = self.layers if Decoding.CLEHE in ensembles else ()
            state = self.engine.prefill_lockstep(rows, layers=layers, max_new_tokens=max_new_tokens)
            for decoding in ensembles:
                out[decoding] = self._decode(
                    state, decoding, fixed, max_new_tokens, stops, trace, deadline, cancel
                )
        return {d: out[d] for d in modes}

    def _limits(self, max_new_tokens: int | None, stop_at_eos: bool) -> tuple[int, list[int]]:
        """The answer's length (the config's where None; checked) and its stop tokens."""
        if max_new_tokens is None:
            max_new_tokens = self.config.max_new_tokens
        if max_new_tokens < 1:
            raise CisrankError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        eos = self.engine.tokenizer.eos_token_id
        return max_new_tokens, [eos] if stop_at_eos and eos is not None else []

    def generate_each(
        self,
        prompts: Sequence[tuple[str, Sequence[Passage]]],
        *,
        max_new_tokens: int | None = None,
        stop_at_eos: bool = True,
    ) -> list[Generation]:
        """The naive (Eq. 1) answer of each (question, passages in prompt order) prompt, as
        `generate` gives it one at a time, the prompts decoded side by side
        (`CausalLMEngine.decode_rows`): a small model's step costs about what one row costs on
        a CPU, so `cisrank eval rag` answers a chunk of prompts for about the price of one."""
        max_new_tokens, stops = self._limits(max_new_tokens, stop_at_eos)
        if not prompts:
            return []
        rows = [self.assembler.render(q, list(ps)).ids for q, ps in prompts]
        state = self.engine.prefill_lockstep(rows, max_new_tokens=max_new_tokens)
        records: list[list[StepRecord]] = [[] for _ in rows]

        def choose(row: int, logits: torch.Tensor) -> int:
            step = DecodeStep(len(records[row]), logits[None], {})
            merged, rec = self.merge(Decoding.NAIVE, step)
            rec.token = int(torch.argmax(merged))
            records[row].append(rec)
            return rec.token

        decoded = self.engine.decode_rows(state, choose, max_new_tokens, stop_ids=stops)
        decode = self.engine.tokenizer.decode
        return [
            Generation(Decoding.NAIVE, decode(t, skip_special_tokens=True).strip(), t, r)
            for t, r in zip(decoded, records, strict=True)
        ]

    def _decode(
        self,
        state: LockstepPrefill,
        decoding: Decoding,
        fixed: torch.Tensor | None,
        max_new_tokens: int,
        stops: list[int],
        trace: bool,
        deadline: float | None,
        cancel: threading.Event | None = None,
    ) -> Generation:
        """One greedy decoding from a prefill (left unchanged for the next one)."""
        records: list[StepRecord] = []

        def choose(step: DecodeStep) -> int:
            if cancel is not None and cancel.is_set():
                raise DecodingCancelled(f"decoding cancelled after {step.step} tokens")
            if deadline is not None and time.monotonic() > deadline:
                raise DecodingTimeout(f"decoding stopped at its deadline after {step.step} tokens")
            merged, rec = self.merge(decoding, step, fixed)
            token = int(torch.argmax(merged))
            rec.token = token
            if trace:
                rec.merged = merged.cpu().numpy()
            records.append(rec)
            return token

        layers = self.layers if decoding is Decoding.CLEHE else ()
        tokens = self.engine.decode_from(
            state, choose, max_new_tokens, layers=layers, stop_ids=stops
        )
        text = self.engine.tokenizer.decode(tokens, skip_special_tokens=True)
        return Generation(decoding, text.strip(), tokens, records)

    def merge(
        self, decoding: Decoding | str, step: DecodeStep, fixed: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, StepRecord]:
        """The merged next-token log-probabilities `[V]` of one step (Entropy-Based Decoding,
        Eq. 1-7)."""
        decoding = Decoding.parse(decoding)
        logp = torch.log_softmax(step.logits.double(), dim=-1)
        if decoding is Decoding.NAIVE:
            return logp[0], StepRecord(-1, [1.0], entropy(logp[:1]).tolist(), None)
        docs = logp[1:]
        ent = entropy(docs)
        k = docs.shape[0]
        if decoding is Decoding.AVG_ENS:
            w = torch.full((k,), 1.0 / k, dtype=torch.float64)
        elif decoding is Decoding.REPLUG:
            assert fixed is not None
            w = fixed.double().to(docs.device)
        else:  # leens, clehe: w_{j,t} = softmax(-H_{j,t} / tau)
            w = torch.softmax(-ent / self.config.tau, dim=0)
        ens = (w.to(docs.device).unsqueeze(1) * docs).sum(dim=0)
        layer = None
        if decoding is Decoding.CLEHE:
            cand = {
                x: torch.log_softmax(
                    self.engine.layer_logits(step.hidden[x][:1], x).double(), dim=-1
                )[0]
                for x in self.layers
            }
            layer = max(self.layers, key=lambda x: (float(entropy(cand[x][None])[0]), -x))
            ens = (1 + self.config.beta) * ens - self.config.beta * cand[layer]
        merged = torch.log_softmax(ens, dim=-1)
        rec = StepRecord(
            -1,
            [float(x) for x in w],
            [float(x) for x in ent],
            int(torch.argmin(ent)),
            layer,
        )
        return merged, rec
