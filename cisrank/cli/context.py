"""`cisrank context`: arrange a query's passages into a RAG prompt, gauge it, print JSON.

    cisrank context --query "who wrote hamlet" --passages top10.jsonl --arrange curvature \\
        --noise 5 --model HuggingFaceTB/SmolLM2-135M-Instruct

prints `{query, model, template, arrange, order, ids, noise, scores, candidates, gauge, prompt}`:
`order` indexes the input passages in prompt order (noise passages come first and are not in it),
`ids` are the final prompt's passage ids, `scores` the per-passage curvature scores (or null),
`candidates` the scored rotations/shuffles and `gauge` the question likelihood of the prompt.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from cisrank.cli.defaults import config_flag
from cisrank.cli.options import BatchOpt, DeviceOpt, LanguageModelOpt
from cisrank.context.config import ArrangeConfig, Arrangement, AssemblerConfig
from cisrank.errors import CisrankError

if TYPE_CHECKING:
    from cisrank.context import ContextAssembler
    from cisrank.data.types import Passage


def _parse_fields(items: list[str] | None) -> dict[str, str]:
    fields: dict[str, str] = {}
    for item in items or []:
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise CisrankError(f"--field {item!r}: expected NAME=VALUE")
        fields[name.strip()] = value
    return fields


QueryOpt = Annotated[str, typer.Option("--query", help="The question.")]
PassagesOpt = Annotated[
    Path,
    typer.Option(
        "--passages",
        help="jsonl with 'text' and optional 'title', 'id' and 'score', or one passage per "
        "line; best first (as a reranker ranked them).",
    ),
]
FieldOpt = Annotated[
    list[str] | None,
    typer.Option("--field", help="NAME=VALUE for a custom template's other fields (repeat)."),
]
DocumentOpt = Annotated[str | None, config_flag(AssemblerConfig, "document", "--document")]
ChatOpt = Annotated[bool | None, config_flag(AssemblerConfig, "chat", "--chat")]
TopKOpt = Annotated[
    int | None,
    typer.Option(
        "--top-n",
        "--top-k",
        "-k",
        min=1,
        help="Use only the first N passages (--top-k, -k: aliases).",
    ),
]


def arrangement(
    arrange: str | None, shuffles: int | None = None, seed: int | None = None
) -> ArrangeConfig:
    """The arrangement flags over `ArrangeConfig`'s defaults (an unknown --arrange is an error
    naming the flag)."""
    method = None if arrange is None else Arrangement.parse(arrange, "--arrange")
    return ArrangeConfig().replace(arrange=method, shuffles=shuffles, seed=seed)


def load_inputs(
    query: str,
    passages: Path,
    top_k: int | None,
    base: AssemblerConfig,
    *,
    template: str | None,
    field: list[str] | None,
    document: str | None,
    chat: bool | None,
) -> tuple[list[Passage], list[float] | None, AssemblerConfig]:
    """Check what can be checked before a model loads: the query, the template, the passages.
    Returns the first `top_k` passages, their scores (or None) and the assembler settings: the
    template flags over `base`."""
    from cisrank.context import resolve_template
    from cisrank.context.passages import read_scored_passages

    if not query.strip():
        raise CisrankError("--query is empty")
    settings = base.replace(
        template=template, fields=_parse_fields(field), document=document, chat=chat
    )
    resolve_template(settings.template, settings.fields, settings.document)
    docs, scores = read_scored_passages(passages)
    return docs[:top_k], (scores[:top_k] if scores is not None else None), settings


def context(
    query: QueryOpt,
    passages: PassagesOpt,
    model: LanguageModelOpt,
    arrange: Annotated[str | None, config_flag(ArrangeConfig, "arrange", "--arrange")] = None,
    template: Annotated[str | None, config_flag(AssemblerConfig, "template", "--template")] = None,
    field: FieldOpt = None,
    document: DocumentOpt = None,
    chat: ChatOpt = None,
    top_k: TopKOpt = None,
    noise: Annotated[
        int, typer.Option("--noise", min=0, help="Random passages put before the retrieved ones.")
    ] = 0,
    noise_from: Annotated[
        str,
        typer.Option(
            "--noise-from",
            help="'words' (random words of the model's vocabulary) or a corpus file "
            "(jsonl/tsv) to draw noise passages from.",
        ),
    ] = "words",
    shuffles: Annotated[
        int | None, config_flag(ArrangeConfig, "shuffles", "--shuffles", min=0)
    ] = None,
    seed: Annotated[
        int | None,
        config_flag(ArrangeConfig, "seed", "--seed", text="Seed of shuffles and noise."),
    ] = None,
    pmi: Annotated[
        bool, typer.Option("--pmi", help="Also gauge PMI against the prompt with no passages.")
    ] = False,
    batch_size: BatchOpt = None,
    device: DeviceOpt = None,
) -> None:
    """Arrange passages into a RAG prompt with the language model's question likelihood (JSON)."""
    from cisrank.context import ContextAssembler

    settings = arrangement(arrange, shuffles, seed)
    docs, _, prompt = load_inputs(
        query,
        passages,
        top_k,
        AssemblerConfig(),
        template=template,
        field=field,
        document=document,
        chat=chat,
    )
    assembler = ContextAssembler(model, config=prompt, device=device, batch_size=batch_size)
    result = assembler.arrange(
        query,
        docs,
        settings.arrange,
        shuffles_n=settings.shuffles,
        seed=settings.seed,
        noise=_noise_passages(noise, noise_from, assembler, settings.seed, docs),
        pmi=pmi,
    )
    echo_json(query, assembler, result.to_json())


def _noise_passages(
    n: int, source: str, assembler: ContextAssembler, seed: int, docs: list[Passage]
) -> list[Passage]:
    """`--noise` passages: random words of the model's vocabulary, or passages drawn from a
    corpus file, none of them one of the retrieved `docs`."""
    from cisrank.context.noise import (
        RANDOM_WORDS,
        random_word_passages,
        sample_noise,
        vocabulary_words,
    )

    if not n:
        return []
    if source == RANDOM_WORDS:
        words = vocabulary_words(assembler.engine.tokenizer)
        return random_word_passages(words, n, seed)
    from cisrank.data.corpus import iter_corpus

    return sample_noise(iter_corpus(source), n, seed, exclude=docs)


def echo_json(query: str, assembler: ContextAssembler, result: dict[str, Any]) -> None:
    """Print what `context` and `generate` answer: the query, the model and template that made
    the prompt, then the result's own fields."""
    out = {
        "query": query,
        "model": assembler.engine.model_name,
        "template": assembler.template.name,
        **result,
    }
    typer.echo(json.dumps(out, indent=2))
