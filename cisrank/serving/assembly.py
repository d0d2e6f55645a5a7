"""Context and generation (`POST /v1/context`, `/v1/generate`): arrange a query's passages into
a RAG prompt with a served reranker's causal LM (and answer over them), apart from HTTP.
`ContextService` takes a `ContextQuery` or `GenerateQuery` and returns an `ArrangedContext` or
`GeneratedAnswer` (`cisrank.serving.types`; the wire shape is `cisrank.api.shapes.native`). It is
composed from the same shared parts as the ranking service (`cisrank.serving.engine.Serving`) and
does its model work through the same helper (`cisrank.serving.model_thread.ModelThread`).

What a request means is `cisrank.context.ContextAssembler.arrange` (the library; this module
adds nothing to its results): the same order, per-passage scores, scored candidates, gauge and
prompt as `cisrank context` gives for the same inputs. What the API adds are the rules of
`/v1/rerank`:

- validation and limits before any model work: the query, the documents (count and characters,
  `Limits`; an id of at most `limits.max_id_chars`), the template, its document format and its
  fields (each at most `limits.max_query_chars`; `question` and `documents` are reserved), the
  noise, each prompt's characters against the model's context (`MAX_CHARS_PER_TOKEN` per
  position), counted exactly from the template without rendering it (every reference of a field,
  the document format's repetitions of `{text}`, `{title}` and `{id}`, the separators), and the
  request's cost: the model's tokens of every prompt it will score (`prompt_tokens`: each distinct
  text counted once with the model's tokenizer off the model thread, then summed with every
  repetition), against `limits.max_request_cost`: 422 naming the field that makes most of the
  prompt, before anything is rendered (a `document_format` of `{text}` x 100 rendered 1.8M
  tokens before this check counted it);
- the model thread: the reranker's causal LM (its declared `causal_lm`) is not thread-safe and is
  busy with rerank batches, so every step that touches the tokenizer or the model runs in that
  reranker's one model thread (`ModelThread.run`), admitted like a rerank request
  (`ModelThread.admitted`: `max_queue`, `batching.max_inflight_cost`; 503 + Retry-After), never
  concurrently with its scoring;
- bounded slices: the search prompts (K rotations, or the shuffles) are scored in slices of at
  most `batching.max_batch_tokens` prompt tokens, one model-thread call each, so a rerank batch
  arriving meanwhile waits for one slice, not for the whole search (the assembler's memo then
  holds every search score, and `arrange` scores only the final prompt);
- `batching.request_timeout_s` bounds the whole request (503; the slices left are dropped);
- a client that hangs up (the route sets `cancel`) stops the request at its next model step, a
  generation at its next token (`ClientGone`, counted as 499);
- errors name the field: a prompt longer than the model's context is 422 on `documents`, a
  template with an unknown `{field}` on `template`, a noise pool too small on `noise.n`;
- `rerank` (`{"reranker": NAME, "top_k": k}`): the documents are first ranked by that served
  reranker, through its batcher as a rerank request is, and its best k go on (the pipeline
  `cisrank eval rag` measures). The cost check counts the ranking (its pairs, as a rerank
  request's cost) and the prompts of the k documents whose prompts are longest, so it holds
  whichever k the ranking picks; a generation may rank up to `limits.max_documents` and
  answer over at most `limits.max_generate_documents` (`rerank.top_k`). Each phase, the ranking
  and the assembly, is bounded by `batching.request_timeout_s`.
"""

from __future__ import annotations

import asyncio
import functools
import string
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from cisrank.data.types import BestChunk, Passage, top_order
from cisrank.errors import CisrankError, DataError
from cisrank.rerank.chunking import ChunkPlan, Span, pool
from cisrank.serving.config import Limits
from cisrank.serving.engine import Serving
from cisrank.serving.errors import BackendFailed, ClientGone, InvalidField, TimedOut
from cisrank.serving.model_thread import FieldFault
from cisrank.serving.token_count import CountCancelled, OverBudget, TokenCounter
from cisrank.serving.types import (
    BLANK,
    ArrangedContext,
    ContextQuery,
    Document,
    GeneratedAnswer,
    GenerateQuery,
    Passages,
    RerankPick,
    is_blank,
)

if TYPE_CHECKING:
    from cisrank.context import (
        Answer,
        AssembledContext,
        ContextAssembler,
        ContextTemplate,
        Prompt,
    )
    from cisrank.lm.engine import CausalLMEngine

MAX_CHARS_PER_TOKEN = 32
"""A prompt of more characters than this per position of the model's context is refused before it
is rendered or tokenized: it cannot fit (real text runs 3-5 characters a token; long runs of one
character, the densest text a BPE vocabulary packs, about 16)."""


def _document(doc: str | Document) -> Document:
    """A passage sent as its text alone, as a `Document` without title or id."""
    return Document(text=doc) if isinstance(doc, str) else doc


def _passages(
    docs: Passages,
    field: str,
    max_chars: int,
    max_id_chars: int,
    id_prefix: str = "",
) -> list[Passage]:
    """The request's passages; one without an id is known by `id_prefix` + its position."""
    out = []
    for i, sent in enumerate(docs):
        doc = _document(sent)
        text, title, doc_id, where = doc.text, doc.title, doc.id, f"{field}.{i}.text"
        if is_blank(text):
            raise InvalidField(where, BLANK)
        if len(text) + len(title) > max_chars:
            raise InvalidField(
                where,
                f"{len(text) + len(title)} characters (title and text), over the limit of "
                f"{max_chars}: split the document",
            )
        docid = str(doc_id) if doc_id is not None else f"{id_prefix}{i}"
        if len(docid) > max_id_chars:
            raise InvalidField(
                f"{field}.{i}.id", f"{len(docid)} characters, over the limit of {max_id_chars}"
            )
        out.append(Passage(docid, text, title))
    return out


RESERVED_FIELDS = ("documents", "question")
"""Template fields the request fills itself (`cisrank.context.templates.REQUIRED_FIELDS`)."""


def _fields(body: ContextQuery | GenerateQuery, max_chars: int) -> None:
    """The template's named fields: none reserved, each value at most `max_chars`."""
    for name, value in body.fields.items():
        if name in RESERVED_FIELDS:
            raise InvalidField(
                f"fields.{name}",
                f"'{name}' is reserved: {{{name}}} is filled with the request's "
                f"{'query' if name == 'question' else 'documents'}, not from fields",
            )
        if len(value) > max_chars:
            raise InvalidField(
                f"fields.{name[:100]}", f"{len(value)} characters, over the limit of {max_chars}"
            )


def _template(body: ContextQuery | GenerateQuery, max_chars: int) -> ContextTemplate:
    from cisrank.context import resolve_template

    if len(body.template) > max_chars:
        raise InvalidField("template", f"{len(body.template)} characters, over {max_chars}")
    _fields(body, max_chars)
    try:
        template = resolve_template(body.template, body.fields)
    except CisrankError as exc:
        raise InvalidField("template", str(exc)) from None
    if body.document_format is None:
        return template
    if len(body.document_format) > max_chars:
        raise InvalidField("document_format", f"over the limit of {max_chars} characters")
    try:
        return resolve_template(body.template, body.fields, body.document_format)
    except CisrankError as exc:
        raise InvalidField("document_format", str(exc)) from None


@functools.lru_cache(maxsize=256)
def _shape(fmt: str) -> tuple[tuple[str, ...], tuple[tuple[str, int], ...]]:
    """(literal pieces, (field name, references) ...) of a format string, as `str.format`
    renders it (`{{` is one character)."""
    literal: list[str] = []
    refs: Counter[str] = Counter()
    for text, name, _, _ in string.Formatter().parse(fmt):
        if text:
            literal.append(text)
        if name is not None:
            refs[name] += 1
    return tuple(literal), tuple(refs.items())


Measure = Callable[[str], int]
"""What a text costs: its characters (`len`) or its tokens."""


def _digits(n: int) -> int:
    """Characters of the numbers 1..n written out (the `{index}` of n passages)."""
    total, width, start = 0, 1, 1
    while start <= n:
        end = min(n, start * 10 - 1)
        total += (end - start + 1) * width
        start, width = start * 10, width + 1
    return total


@dataclass(frozen=True)
class PromptSize:
    """The size of one rendered prompt, by what put it there (`parts`: field to blame -> size),
    counted from the template without rendering it: in characters, or in tokens (each part
    counted alone: within a token or two per part of the rendered prompt's count)."""

    parts: dict[str, int]

    @property
    def chars(self) -> int:
        """The total (in characters, or tokens where measured so)."""
        return sum(self.parts.values())

    @property
    def culprit(self) -> str:
        """The request field that makes most of the prompt."""
        return max(self.parts, key=lambda k: self.parts[k])


def prompt_size(
    template: ContextTemplate,
    query: str,
    passages: Sequence[Passage],
    custom_format: bool,
    measure: Measure = len,
) -> PromptSize:
    """What `template.render(query, passages)` would write, in characters (or in what `measure`
    counts: tokens), without writing it: every reference of every field counted (a field named
    100 times counts 100 times), the document format's references to each passage's `{text}`,
    `{title}`, `{id}` and `{index}`, and the separators. The passages (each in the template's
    own document format) are `documents`; what a custom document format adds (its text,
    repetitions, ids) is `document_format`."""
    parts: Counter[str] = Counter()
    literal, refs = _shape(template.text)
    parts["template"] += sum(measure(piece) for piece in literal)
    for name, count in refs:
        if name == "question":
            parts["query"] += count * measure(query)
        elif name == "documents":
            sizes = _documents_size(template, passages, custom_format, measure)
            parts.update({k: count * v for k, v in sizes.items()})
        else:
            parts[f"fields.{name}"] += count * measure(template.fields.get(name, ""))
    return PromptSize(dict(parts))


def _documents_size(
    template: ContextTemplate, passages: Sequence[Passage], custom_format: bool, measure: Measure
) -> Counter[str]:
    """The size of the rendered passages, by field to blame (see `prompt_size`); `{index}` is
    counted in digits, at least its tokens."""
    out: Counter[str] = Counter()
    n = len(passages)
    if n == 0:
        return out
    literal, refs = _shape(template.document)
    fmt = "document_format" if custom_format else "documents"
    out[fmt] += n * sum(measure(piece) for piece in literal)
    out[fmt] += (n - 1) * measure(template.separator)
    for name, count in refs:  # only what the format names is measured
        if name in ("text", "title"):
            total = sum(measure(p.text if name == "text" else p.title) for p in passages)
            out["documents"] += total
            out[fmt] += (count - 1) * total
        elif name == "id":
            out[fmt] += count * sum(measure(p.docid) for p in passages)
        elif name == "index":
            out[fmt] += count * _digits(n)
    return out


def _check_prompt(size: PromptSize, engine: CausalLMEngine) -> None:
    """Refuse a prompt that cannot fit the model's context, before it is rendered or tokenized:
    more than `MAX_CHARS_PER_TOKEN` characters per position."""
    limit = engine.max_positions
    if limit is None or size.chars <= limit * MAX_CHARS_PER_TOKEN:
        return
    field = size.culprit
    raise InvalidField(
        field,
        f"a prompt of {size.chars} characters ({size.parts[field]} from {field}) cannot fit the "
        f"model's context ({limit} tokens, at most {MAX_CHARS_PER_TOKEN} characters a token): "
        "send fewer or shorter documents, or a shorter template",
    )


def context_shapes(
    body: ContextQuery,
    template: ContextTemplate,
    passages: Sequence[Passage],
    noise: Sequence[Passage],
    k: int | None = None,
) -> Callable[[Measure], list[PromptSize]]:
    """The prompts a context request scores, for `prompt_tokens`: the search prompts, the final
    prompt (with the noise), and with `pmi` the prompt without passages; over `k` of the
    passages where a ranking picks them (those whose prompts cost most: `costliest`)."""
    from cisrank.context import search_orders

    custom = body.document_format is not None
    n = len(passages) if k is None else k
    searched = len(search_orders(body.arrange, n, body.shuffles, body.seed))

    def shapes(measure: Measure) -> list[PromptSize]:
        chosen = (
            list(passages)
            if k is None
            else costliest(template, body.query, passages, k, custom, measure)
        )
        sizes = [prompt_size(template, body.query, chosen, custom, measure)] * searched
        sizes.append(prompt_size(template, body.query, [*noise, *chosen], custom, measure))
        if body.pmi:
            sizes.append(prompt_size(template, body.query, [], custom, measure))
        return sizes

    return shapes


def _generation_limits(body: GenerateQuery, limits: Limits) -> int:
    """A generation's own limits (new tokens, `rerank.top_k`), checked before its documents;
    the documents it may send: with `rerank` they are ranked (as many as a rerank request's)
    and only its top_k are generated over."""
    if body.max_new_tokens > limits.max_new_tokens:
        raise InvalidField(
            "max_new_tokens",
            f"{body.max_new_tokens} is over the limit of {limits.max_new_tokens}",
        )
    most = limits.max_generate_documents
    if body.rerank is not None and body.rerank.top_k > most:
        raise InvalidField("rerank.top_k", f"{body.rerank.top_k} is over the limit of {most}")
    return limits.max_documents if body.rerank is not None else most


def _check_decoding(body: GenerateQuery, documents: int, engine: CausalLMEngine) -> None:
    """The decoding's inputs against the documents and the model: replug's weights, one score
    per document, CLeHe's layers."""
    if body.decoding == "replug" and body.scores is None and body.rerank is None:
        raise InvalidField("scores", "replug needs one score per document")
    if body.scores is not None and len(body.scores) != documents:
        raise InvalidField(
            "scores",
            f"{len(body.scores)} scores for {documents} documents: give one score per document",
        )
    if body.layers is not None and len(body.layers) > engine.num_layers + 1:
        raise InvalidField("layers", f"at most {engine.num_layers + 1} layers")


def generate_shapes(
    body: GenerateQuery,
    template: ContextTemplate,
    passages: Sequence[Passage],
    k: int | None = None,
) -> tuple[int, Callable[[Measure], list[PromptSize]]]:
    """The rows a generation decodes and the prompts it scores, for `prompt_tokens`: naive, one
    row, its prompt once per searched order (K rotations, or K - 1 shuffles and the input, for a
    scored arrangement); document-parallel, a row per passage and one without any. Over `k` of
    the passages where a ranking picks them (those whose prompts cost most: `costliest`)."""
    from cisrank.context import Arrangement

    custom = body.document_format is not None
    query = body.query
    n = len(passages) if k is None else k

    def generated(measure: Measure) -> list[Passage]:
        if k is None:
            return list(passages)
        return costliest(template, query, passages, k, custom, measure)

    if body.decoding == "naive":
        searched = 1 + n if Arrangement(body.arrange).scored else 1

        def prompt(measure: Measure) -> list[PromptSize]:
            return [prompt_size(template, query, generated(measure), custom, measure)] * searched

        return 1, prompt
    single = template.single()

    def rows(measure: Measure) -> list[PromptSize]:
        sizes = [prompt_size(template, query, [], custom, measure)]
        return sizes + [
            prompt_size(single, query, [p], custom, measure) for p in generated(measure)
        ]

    return n + 1, rows


def _total(sizes: Sequence[PromptSize]) -> tuple[int, str]:
    """The size of all `sizes` together and the field that makes most of it."""
    parts: Counter[str] = Counter()
    for size in sizes:
        parts.update(size.parts)
    return sum(parts.values()), max(parts, key=lambda k: parts[k]) if parts else "documents"


class _Recorder:
    """A `Measure` of characters that remembers every text it measured."""

    def __init__(self) -> None:
        self.texts: dict[str, None] = {}

    def __call__(self, text: str) -> int:
        if text:
            self.texts[text] = None
        return len(text)


async def prompt_tokens(
    shapes: Callable[[Measure], list[PromptSize]],
    engine: CausalLMEngine,
    counter: TokenCounter,
    budget: int,
    timeout: float,
    cancel: threading.Event | None = None,
) -> tuple[list[PromptSize], int, str]:
    """The prompts `shapes` describes, in the model's tokens (`cisrank.serving.token_count`):
    (each prompt's size, their total, the field that makes most of it).

    First in characters, which refuses a prompt that cannot fit the context before anything is
    tokenized (`_check_prompt`); then every distinct text the prompts are made of (the query,
    each passage's text, title and id, the fields, the template's and the document format's
    literal text, the separator) is counted once, off the model thread, in slices, stopped as
    soon as the texts alone pass `budget` (each is in some prompt at least once): no more than
    one budget's worth of counting before a refusal. The prompts' tokens are then summed from
    those counts, every repetition of a text counted (a text counted alone is within a token or
    two of its share of a rendered prompt)."""
    recorder = _Recorder()
    in_chars = shapes(recorder)
    for size in {id(s): s for s in in_chars}.values():  # a repeated prompt is checked once
        _check_prompt(size, engine)
    texts = list(recorder.texts)
    try:
        async with asyncio.timeout(timeout):
            measured = await counter.measure(texts, budget=budget, cancel=cancel)
    except CountCancelled:
        raise ClientGone("the client closed the connection before the answer") from None
    except TimeoutError:
        raise TimedOut(
            f"not counted within {timeout:g} s: the server is overloaded, retry later"
        ) from None
    except OverBudget as exc:
        _, culprit = _total(in_chars)
        raise InvalidField(
            culprit,
            f"cost at least {exc.cost} {counter.unit} (the texts of the prompts this request "
            f"scores, each counted once; most of them from {culprit}) is over the limit of "
            f"{budget}: send fewer or shorter documents, or a cheaper arrangement",
        ) from None
    tokens = dict(zip(texts, measured.counts, strict=True))

    def measure(text: str) -> int:
        return tokens[text] if text else 0

    sizes = shapes(measure)
    cost, culprit = _total(sizes)
    return sizes, cost, culprit


def slices(prompts: Sequence[Prompt], max_tokens: int) -> list[list[Prompt]]:
    """Consecutive groups of prompts of at most `max_tokens` tokens in all (a longer prompt
    alone): one model-thread call each."""
    out: list[list[Prompt]] = []
    used = 0
    for prompt in prompts:
        if out and used + len(prompt.ids) <= max_tokens:
            out[-1].append(prompt)
            used += len(prompt.ids)
        else:
            out.append([prompt])
            used = len(prompt.ids)
    return out


def _search(body: ContextQuery | GenerateQuery) -> dict[str, Any]:
    """The request's search settings (only /v1/context takes `shuffles` and a `seed`)."""
    if isinstance(body, ContextQuery):
        return {"shuffles_n": body.shuffles, "seed": body.seed}
    return {"shuffles_n": None, "seed": 0}


def _prepare(
    engine: CausalLMEngine,
    template: ContextTemplate,
    body: ContextQuery | GenerateQuery,
    passages: list[Passage],
) -> tuple[ContextAssembler, list[Prompt]]:
    """In the model thread: the assembler (a fresh memo per request) and the search prompts."""
    from cisrank.context import ContextAssembler, search_orders

    try:
        asm = ContextAssembler(engine, template, chat=body.chat)
    except CisrankError as exc:
        raise FieldFault("chat", str(exc)) from None
    if not engine.encode(body.query):
        raise FieldFault("query", "the query has no tokens for this model")
    orders = search_orders(body.arrange, len(passages), **_search(body))
    return asm, asm.search_prompts(body.query, passages, orders)


def _arrange(
    asm: ContextAssembler, body: ContextQuery, passages: list[Passage], noise: list[Passage]
) -> AssembledContext:
    return asm.arrange(
        body.query, passages, body.arrange, noise=noise, pmi=body.pmi, **_search(body)
    )


def _generate(
    asm: ContextAssembler,
    body: GenerateQuery,
    passages: list[Passage],
    scores: list[float] | None,
    deadline: float,
    cancel: threading.Event | None,
) -> tuple[Answer, int]:
    """In the model thread: the answer (`answer_question`, as `cisrank generate`) and the
    longest row's prompt."""
    from cisrank.context import ArrangeConfig, Arrangement, EnsembleDecoder, answer_question

    try:
        decoder = EnsembleDecoder(
            asm,
            decoding=body.decoding,
            tau=body.tau,
            beta=body.beta,
            layers=body.layers,
            max_new_tokens=body.max_new_tokens,
        )
    except CisrankError as exc:
        raise FieldFault("layers", str(exc)) from None
    # the order alone (naive): the final prompt is prefilled by the generation, not gauged too
    answer = answer_question(
        decoder,
        body.query,
        passages,
        ArrangeConfig(arrange=Arrangement(body.arrange)),
        scores=scores,
        deadline=deadline,
        cancel=cancel,
    )
    if body.decoding == "naive":
        longest = len(asm.render(body.query, answer.passages).ids)
    else:
        single = asm.template.single()
        longest = max(
            len(asm.render(body.query, [p], template=single).ids) for p in answer.passages
        )
    return answer, longest


@dataclass(frozen=True)
class RerankPlan:
    """A request's `rerank`, before any work: the served reranker, the windows it scores of
    each document (`ChunkPlan`, over the document's title and text, as `/v1/rerank` plans
    them), the tokens of each (query, window) pair (counted as a rerank request's), and how
    many documents go on."""

    name: str
    windows: ChunkPlan
    tokens: list[int]
    k: int

    @property
    def cost(self) -> int:
        return sum(self.tokens)

    def window_passages(self, passages: Sequence[Passage]) -> list[Passage]:
        """Every window of every document as the passage the prompt would receive were it the
        document's best (`best_window`): what the prompt-size bound is taken over, since the
        ranking picks at most k of them. A window of a document counts once per window, so
        the bound can only over-count (two windows of one document), never under-count."""
        return [
            best_window(p, (a, b))[0]
            for p, spans in zip(passages, self.windows.spans, strict=True)
            for a, b in spans
        ]


def best_window(passage: Passage, span: Span) -> tuple[Passage, BestChunk | None]:
    """The passage a document's best window puts in the prompt, and that window's span in the
    document's text as sent (None: the document was read whole). The window spans the
    document's `contents` (its title, a newline, its text), so the title stays the title and
    the span is moved into the text; a window inside the title alone keeps the whole text."""
    if tuple(span) == (0, len(passage.contents)):
        return passage, None
    offset = len(passage.title) + 1 if passage.title else 0
    start, end = max(0, span[0] - offset), max(0, span[1] - offset)
    if start >= end:
        return passage, None
    part = Passage(passage.docid, passage.text[start:end], passage.title)
    return part, BestChunk(start, end, 0.0)


def costliest(
    template: ContextTemplate,
    query: str,
    passages: Sequence[Passage],
    k: int,
    custom: bool,
    measure: Measure = len,
) -> list[Passage]:
    """The `k` passages that make the longest prompts, in what `measure` counts (a prompt's
    size is its template's plus each passage's share, the same whichever others are with it),
    so that the cost of any `k` of `passages` is at most theirs: they bound a request's cost
    while the ranking that picks its `k` is unknown."""
    share = [prompt_size(template, query, [p], custom, measure).chars for p in passages]
    return [passages[i] for i in sorted(range(len(passages)), key=lambda i: -share[i])[:k]]


def _json_safe(score: float) -> float:
    """A score JSON can carry (the float range; NaN ranks last, as the lowest)."""
    big = 1.7976931348623157e308
    return -big if score != score else max(-big, min(big, float(score)))


class ContextService:
    """Answers context and generate requests over the shared `Serving` parts."""

    def __init__(self, serving: Serving) -> None:
        self.serving = serving

    def _reranker(self, requested: str | None) -> tuple[str, CausalLMEngine]:
        """The reranker whose LM assembles, and that LM: the one named, else the default if it
        has a causal LM, else the first served reranker that has one."""
        serving = self.serving
        lms = {
            name: reranker.causal_lm
            for name in serving.config.rerankers
            if (reranker := serving.rerankers.get(name)) is not None
            and reranker.causal_lm is not None
        }
        if requested is None:
            default = serving.config.default_reranker_name
            name = default if default in lms or not lms else next(iter(lms))
        else:
            name = serving.resolve_reranker(requested)
        serving.scorer(name)  # NotReady / LoadFailed before the kind check
        engine = lms.get(name)
        if engine is None:
            raise InvalidField(
                "model",
                f"reranker '{name}' has no causal language model: context assembly needs a cis "
                f"reranker (served here: {', '.join(lms) or 'none'})",
            )
        return name, engine

    def _common(
        self, body: ContextQuery | GenerateQuery, max_documents: int
    ) -> tuple[str, CausalLMEngine, list[Passage], ContextTemplate]:
        """The checks both routes make before any model work: (reranker, its LM, the passages,
        the template)."""
        serving = self.serving
        limits = serving.config.limits
        name, engine = self._reranker(body.model)
        serving.check_query(body.query)
        if len(body.documents) > max_documents:
            raise InvalidField(
                "documents", f"{len(body.documents)} documents, over the limit of {max_documents}"
            )
        passages = _passages(
            body.documents, "documents", limits.max_document_chars, limits.max_id_chars
        )
        return name, engine, passages, _template(body, limits.max_query_chars)

    async def _rerank_plan(
        self, body: ContextQuery | GenerateQuery, passages: list[Passage]
    ) -> RerankPlan | None:
        """The request's `rerank`, checked and costed before any work (None without one): its
        pairs counted with the ranking reranker's tokenizer (`Serving.pair_costs`)."""
        if body.rerank is None:
            return None
        serving = self.serving
        name = serving.resolve_reranker(body.rerank.reranker, "rerank.reranker")
        texts = [p.contents for p in passages]
        windows, tokens = await serving.window_costs(
            name, body.query, texts, "documents", serving.config.chunking
        )
        return RerankPlan(name, windows, tokens, min(body.rerank.top_k, len(passages)))

    async def _rerank(
        self, plan: RerankPlan, query: str, passages: list[Passage]
    ) -> tuple[RerankPick, list[Passage]]:
        """Rank every passage (title and text, as `cisrank eval rag` does) with the planned
        reranker, through its batcher like a rerank request, a long one by its best window
        (`cisrank.rerank.chunking.pool`, the server's pooling); its best `k`, best first, and
        the passages they put in the prompt: a long document's best window, not the whole page
        (the span in `best_chunks`)."""
        scorer = self.serving.model_thread(plan.name)
        texts = [p.contents for p in passages]
        windows = await scorer.score(query, plan.windows.texts(texts), "documents", plan.tokens)
        pooled = pool(plan.windows, windows, self.serving.config.chunking.pooling)
        raw = [score for score, _ in pooled]
        best = top_order(raw, plan.k)
        chosen, spans = [], []
        for i in best:
            chunk = pooled[i][1]
            part, span = best_window(passages[i], (chunk.start, chunk.end))
            chosen.append(part)
            spans.append(None if span is None else replace(span, score=_json_safe(chunk.score)))
        pick = RerankPick(
            reranker=plan.name,
            indexes=best,
            scores=[_json_safe(raw[i]) for i in best],
            best_chunks=spans,
            chunks=plan.windows.usage,
        )
        return pick, chosen

    async def _ranked(
        self, plan: RerankPlan | None, query: str, passages: list[Passage]
    ) -> tuple[RerankPick | None, list[Passage]]:
        """The documents that go on and what put them there: without `rerank`, every one whole."""
        if plan is None:
            return None, passages
        return await self._rerank(plan, query, passages)

    async def _noise(self, body: ContextQuery, passages: list[Passage]) -> list[Passage]:
        from cisrank.context import sample_noise, sample_store_noise

        spec = body.noise
        if spec is None or spec.n == 0:
            return []
        limits = self.serving.config.limits
        retrievers = self.serving.retrievers
        if spec.n > limits.max_documents:
            raise InvalidField("noise.n", f"{spec.n} is over the limit of {limits.max_documents}")
        if (spec.documents is None) == (spec.index is None):
            raise InvalidField(
                "noise", "give the pool to draw from: either 'documents' or 'index', not both"
            )
        try:
            if spec.documents is not None:
                if len(spec.documents) > limits.max_documents:
                    raise InvalidField(
                        "noise.documents",
                        f"{len(spec.documents)} documents, over the limit of "
                        f"{limits.max_documents}",
                    )
                pool = _passages(
                    spec.documents,
                    "noise.documents",
                    limits.max_document_chars,
                    limits.max_id_chars,
                    "noise-",
                )
                return sample_noise(pool, spec.n, spec.seed, exclude=passages)
            assert spec.index is not None
            retriever = retrievers.get(spec.index)
            if retriever is None:
                served = ", ".join(retrievers) or "none"
                raise InvalidField(
                    "noise.index",
                    f"'{spec.index[:100]}' is not served here: choose one of {served}",
                )
            store = retriever.docs
            if store is None:
                raise InvalidField(
                    "noise.index",
                    f"index '{spec.index}' has no document store to draw noise from",
                )
            return await asyncio.to_thread(sample_store_noise, store, spec.n, spec.seed, passages)
        except DataError as exc:
            raise BackendFailed(
                f"index '{spec.index}' failed to answer; details are in the server log"
            ) from exc
        except CisrankError as exc:
            raise InvalidField("noise.n", str(exc)) from None

    async def context(
        self, body: ContextQuery, cancel: threading.Event | None = None
    ) -> ArrangedContext:
        """Arrange, pad, render and gauge one request's passages (see the module docstring);
        once `cancel` is set (the client hung up), stop at the next model step."""
        config = self.serving.config
        limits = config.limits
        if body.shuffles is not None and body.shuffles > limits.max_documents:
            raise InvalidField(
                "shuffles", f"{body.shuffles} is over the limit {limits.max_documents}"
            )
        name, engine, passages, template = self._common(body, limits.max_documents)
        noise = await self._noise(body, passages)
        budget = limits.max_request_cost
        timeout = config.batching.request_timeout_s
        plan = await self._rerank_plan(body, passages)
        ranking = plan.cost if plan is not None else 0
        counter = self.serving.counter(name, lm=True)
        bound = plan.window_passages(passages) if plan else passages
        shapes = context_shapes(body, template, bound, noise, plan.k if plan else None)
        sizes, cost, culprit = await prompt_tokens(shapes, engine, counter, budget, timeout, cancel)
        if cost + ranking > budget:
            reranked = f", and {ranking} to rerank the documents" if plan is not None else ""
            raise InvalidField(
                "documents" if ranking > cost else culprit,
                f"cost {cost + ranking} {counter.unit} (of the {len(sizes)} prompts this "
                f"arrangement scores, most of them from {culprit}{reranked}) is over the limit "
                f"of {budget}: send fewer or shorter documents, or a cheaper arrangement",
            )
        choice, chosen = await self._ranked(plan, body.query, passages)
        index = choice.indexes if choice is not None else list(range(len(passages)))
        model = self.serving.model_thread(name, cancel)
        late = f"not assembled within {timeout:g} s: the server is overloaded, retry later"
        async with model.admitted(cost, late):
            asm, prompts = await model.run(_prepare, engine, template, body, chosen)
            for chunk in slices(prompts, model.slice_tokens()):
                tokens = sum(len(p.ids) for p in chunk)
                await model.run_slice(tokens, asm.question_logprobs, chunk)
            result = await model.run(_arrange, asm, body, chosen, noise)
        doc_ids = [_document(d).id for d in body.documents]
        ids: list[str | int | None] = [p.docid for p in noise]
        ids += [doc_ids[index[i]] for i in result.order]
        return ArrangedContext(
            reranker=name,
            arrange=result.method,
            template=template.name,
            order=[index[i] for i in result.order],
            ids=ids,
            scores=result.scores,
            candidates=result.candidates,
            noise=noise,
            gauge=result.gauge,
            prompt=result.prompt.text,
            rerank=choice,
            documents=len(chosen),
            prompts_scored=asm.scored_prompts,
            prompt_tokens=len(result.prompt.ids),
        )

    async def generate(
        self, body: GenerateQuery, cancel: threading.Event | None = None
    ) -> GeneratedAnswer:
        """Greedy RAG generation over the request's passages, bounded in passages
        (`limits.max_generate_documents`), new tokens (`limits.max_new_tokens`), cost and time
        (`batching.request_timeout_s`: the decoding loop itself stops at the deadline, in the
        model thread, so a timed-out request holds the model for at most one more step). Once
        `cancel` is set (the client hung up), the decoding loop stops at its next token."""
        from cisrank.context.decoding import DecodingTimeout

        config = self.serving.config
        limits = config.limits
        name, engine, passages, template = self._common(body, _generation_limits(body, limits))
        _check_decoding(body, len(passages), engine)
        budget = limits.max_request_cost
        timeout = config.batching.request_timeout_s
        plan = await self._rerank_plan(body, passages)
        bound = plan.window_passages(passages) if plan else passages
        rows, shapes = generate_shapes(body, template, bound, plan.k if plan else None)
        counter = self.serving.counter(name, lm=True)
        _, prefill, culprit = await prompt_tokens(shapes, engine, counter, budget, timeout, cancel)
        cost = prefill + rows * body.max_new_tokens
        ranking = plan.cost if plan is not None else 0
        if cost + ranking > budget:
            reranked = f", and {ranking} to rerank the documents" if plan is not None else ""
            raise InvalidField(
                "documents" if ranking > cost else culprit,
                f"cost {cost + ranking} {counter.unit} (of the prompts, most of them from "
                f"{culprit}, and rows x new tokens{reranked}) is over the limit of {budget}: "
                "send fewer or shorter documents, or fewer new tokens",
            )
        choice, chosen = await self._ranked(plan, body.query, passages)
        index = choice.indexes if choice is not None else list(range(len(passages)))
        # the client's scores of the chosen documents, else the reranker's (replug's weights)
        scores = [body.scores[i] for i in index] if body.scores is not None else None
        if scores is None and choice is not None:
            scores = choice.scores
        deadline = time.monotonic() + timeout
        model = self.serving.model_thread(name, cancel)
        late = f"not generated within {timeout:g} s: retry later"
        async with model.admitted(cost, late, late_errors=(DecodingTimeout,)):
            asm, prompts = await model.run(_prepare, engine, template, body, chosen)
            if body.decoding == "naive":
                for chunk in slices(prompts, model.slice_tokens()):
                    tokens = sum(len(p.ids) for p in chunk)
                    await model.run_slice(tokens, asm.question_logprobs, chunk)
            answer, longest = await model.run(
                _generate, asm, body, chosen, scores, deadline, cancel
            )
        sent = [_document(d).id for d in body.documents]
        doc_ids = [doc_id if doc_id is not None else i for i, doc_id in enumerate(sent)]
        order, gen = [index[i] for i in answer.order], answer.generation
        ordered_ids = [doc_ids[i] for i in order]
        return GeneratedAnswer(
            reranker=name,
            decoding=body.decoding,
            order=order,
            answer=gen.text,
            tokens=gen.tokens,
            attribution=[
                ordered_ids[s.passage] if s.passage is not None else None for s in gen.steps
            ],
            weights=[s.weights for s in gen.steps],
            layers=[s.layer for s in gen.steps],
            rerank=choice,
            documents=len(chosen),
            prompt_tokens=longest,
            generated_tokens=len(gen.tokens),
        )
