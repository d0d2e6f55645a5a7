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
from typing import Annotated

import typer

from cisrank.cli.options import BatchOpt, DeviceOpt, ModelOpt
from cisrank.errors import CisrankError


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
DocumentOpt = Annotated[
    str | None,
    typer.Option(
        "--document",
        help="Passage format with {index}, {title}, {text}, {id} (default the template's: "
        "'Document [{index}](Title: {title}) {text}').",
    ),
]
ChatOpt = Annotated[
    bool, typer.Option("--chat", help="Wrap the prompt in the tokenizer's chat template.")
]
TopKOpt = Annotated[
    int | None, typer.Option("--top-k", min=1, help="Use only the first K passages.")
]


def load_inputs(
    query: str,
    passages: Path,
    template: str,
    field: list[str] | None,
    document: str | None,
    top_k: int | None,
    model: str | None,
):
    """Check what can be checked before a model loads: the query, the template, the passages."""
    from cisrank.context import resolve_template
    from cisrank.context.passages import read_scored_passages

    if not query.strip():
        raise CisrankError("--query is empty")
    fields = _parse_fields(field)
    resolve_template(template, fields, document)
    docs, scores = read_scored_passages(passages)
    if model is None:
        raise CisrankError("--model is needed: a causal LM (Hugging Face id or local folder)")
    return docs[:top_k], (scores[:top_k] if scores is not None else None), fields


def context(
    query: QueryOpt,
    passages: PassagesOpt,
    model: ModelOpt = None,
    arrange: Annotated[
        str,
        typer.Option(
            "--arrange",
            help="ranked, reverse (best next to the question), edges, pmi_rotation, "
            "likelihood_select or curvature.",
        ),
    ] = "ranked",
    template: Annotated[
        str,
        typer.Option(
            "--template",
            help="qa, noise, kv, entropy, or a custom string holding {documents} and {question}.",
        ),
    ] = "qa",
    field: FieldOpt = None,
    document: DocumentOpt = None,
    chat: ChatOpt = False,
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
        int | None,
        typer.Option("--shuffles", min=0, help="likelihood_select: random shuffles (default K-1)."),
    ] = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed of shuffles and noise.")] = 0,
    pmi: Annotated[
        bool, typer.Option("--pmi", help="Also gauge PMI against the prompt with no passages.")
    ] = False,
    batch_size: BatchOpt = None,
    device: DeviceOpt = None,
) -> None:
    """Arrange passages into a RAG prompt with the language model's question likelihood (JSON)."""
    from cisrank.context import ARRANGEMENTS, ContextAssembler
    from cisrank.context.noise import (
        RANDOM_WORDS,
        random_word_passages,
        sample_noise,
        vocabulary_words,
    )

    if arrange not in ARRANGEMENTS:
        raise CisrankError(f"--arrange {arrange!r}: use one of {', '.join(ARRANGEMENTS)}")
    docs, _, fields = load_inputs(query, passages, template, field, document, top_k, model)
    assembler = ContextAssembler(
        model,  # type: ignore[arg-type]  # load_inputs raised if None
        template,
        fields=fields,
        document=document,
        chat=chat,
        device=device,
        batch_size=batch_size,
    )
    noise_passages = []
    if noise:
        if noise_from == RANDOM_WORDS:
            words = vocabulary_words(assembler.engine.tokenizer)
            noise_passages = random_word_passages(words, noise, seed)
        else:
            from cisrank.data.corpus import iter_corpus

            noise_passages = sample_noise(iter_corpus(noise_from), noise, seed, exclude=docs)
    result = assembler.arrange(
        query, docs, arrange, shuffles_n=shuffles, seed=seed, noise=noise_passages, pmi=pmi
    )
    out = {
        "query": query,
        "model": assembler.engine.model_name,
        "template": assembler.template.name,
        **result.to_json(),
    }
    typer.echo(json.dumps(out, indent=2))
