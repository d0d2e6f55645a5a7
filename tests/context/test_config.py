"""The context settings: modes as str enums, each default declared once (the CLI flags and the API
schemas read the configs), range errors as plain sentences, a light import, and the one
order -> reorder -> generate function of `cisrank generate` and `/v1/generate`."""

from __future__ import annotations

import inspect
import json
import subprocess
import sys

import pytest
from context.helpers import QUESTION, passages

from cisrank.context import (
    ArrangeConfig,
    Arrangement,
    AssemblerConfig,
    ContextAssembler,
    DecoderConfig,
    Decoding,
    EnsembleDecoder,
    GenerationAssemblerConfig,
    answer_question,
)
from cisrank.errors import CisrankError


def test_modes_are_their_strings():
    assert (
        Arrangement.CURVATURE == "curvature" and json.dumps(Arrangement.CURVATURE) == '"curvature"'
    )
    assert [a.value for a in Arrangement] == [
        "ranked",
        "reverse",
        "edges",
        "pmi_rotation",
        "likelihood_select",
        "curvature",
    ]
    assert [a for a in Arrangement if a.scored] == [
        "pmi_rotation",
        "likelihood_select",
        "curvature",
    ]
    assert [d.value for d in Decoding] == ["naive", "avg_ens", "replug", "leens", "clehe"]
    assert [d for d in Decoding if d.ensemble] == ["avg_ens", "replug", "leens", "clehe"]
    assert {Decoding.LEENS: 1}["leens"] == 1  # a str key finds its member
    assert Arrangement.parse("edges") is Arrangement.EDGES
    with pytest.raises(CisrankError, match=r"^unknown arrangement 'up': use one of ranked, "):
        Arrangement.parse("up")
    with pytest.raises(CisrankError, match=r"^--decoding 'beam': use one of naive, avg_ens, "):
        Decoding.parse("beam", "--decoding")


def test_defaults_and_range_errors():
    assert (AssemblerConfig().template, GenerationAssemblerConfig().template) == ("qa", "entropy")
    assert ArrangeConfig() == ArrangeConfig(arrange=Arrangement.RANKED, shuffles=None, seed=0)
    d = DecoderConfig()
    assert (d.decoding, d.tau, d.beta, d.layers, d.replug_temperature, d.max_new_tokens) == (
        Decoding.NAIVE,
        0.25,
        0.25,
        None,
        1.0,
        32,
    )
    assert DecoderConfig().replace(decoding="clehe", layers=[1, 2]).layers == (1, 2)
    for change, message in [
        ({"tau": 0.0}, "tau must be > 0, got 0.0"),
        ({"beta": -1.0}, "beta must be >= 0, got -1.0"),
        ({"replug_temperature": 0}, "the RePlug temperature must be > 0, got 0"),
        ({"max_new_tokens": 0}, "max_new_tokens must be >= 1, got 0"),
        ({"decoding": "beam"}, "unknown decoding 'beam'"),
        ({"tau": "warm"}, "decoder options: tau: Input should be a valid number"),
        ({"temperature": 1.0}, "unknown decoder option(s): temperature"),
    ]:
        with pytest.raises(CisrankError) as info:
            DecoderConfig().replace(**change)
        assert str(info.value).startswith(message), (change, info.value)
    with pytest.raises(CisrankError, match=r"^the number of shuffles must be >= 0, got -1$"):
        ArrangeConfig().replace(shuffles=-1)


def test_cli_and_api_declare_no_default_of_their_own():
    from typing import get_args

    from cisrank.api import schemas
    from cisrank.cli.context import context
    from cisrank.cli.generate import generate
    from cisrank.serving import types

    # a flag left out is None: the config's default
    for verb, flags in [
        (context, ["arrange", "template", "chat", "shuffles", "seed"]),
        (generate, ["decoding", "arrange", "template", "chat", "tau", "beta"]),
        (generate, ["layers", "replug_temperature", "max_new_tokens"]),
    ]:
        params = inspect.signature(verb).parameters
        assert all(params[f].default is None for f in flags), verb
    # the API's request defaults are the configs', and its mode names the enums'
    ctx, gen = schemas.ContextRequest.model_fields, schemas.GenerateRequest.model_fields
    assert ctx["arrange"].default == ArrangeConfig().arrange
    assert (ctx["template"].default, ctx["chat"].default) == ("qa", False)
    assert (ctx["shuffles"].default, ctx["seed"].default) == (None, 0)
    assert gen["template"].default == GenerationAssemblerConfig().template
    for name in ["decoding", "tau", "beta", "layers", "max_new_tokens"]:
        assert gen[name].default == getattr(DecoderConfig(), name), name
    assert get_args(types.Arrangement) == tuple(Arrangement)
    assert get_args(types.Decoding) == tuple(Decoding)


def test_settings_import_without_the_model_side():
    code = (
        "import sys, cisrank.context, cisrank.api.schemas, cisrank.cli; "
        "print('torch' in sys.modules, 'transformers' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert out.stdout.strip() == "False False", out.stderr


def test_answer_question_orders_naive_and_keeps_the_input_for_ensembles(tiny):
    asm = ContextAssembler(tiny.engine, "entropy")
    docs = passages(4)
    scores = [0.5, 2.0, -1.0, 1.0]
    naive = EnsembleDecoder(asm, layers=[1, 2], max_new_tokens=3)
    curvature = ArrangeConfig(arrange=Arrangement.CURVATURE)
    got = answer_question(naive, QUESTION, docs, curvature, scores=scores)
    order = asm.order(QUESTION, docs, "curvature").order
    want = naive.generate(QUESTION, [docs[i] for i in order], "naive")
    assert got.order == order and got.passages == [docs[i] for i in order]
    assert got.scores == [scores[i] for i in order]
    assert got.generation.decoding == "naive" and got.generation.tokens == want.tokens
    assert got.to_json() == {"order": order, **want.to_json(got.passages)}
    # the document-parallel decodings read every passage alone: the input order, whatever the
    # arrangement, with each passage's own score
    replug = EnsembleDecoder(asm, decoding="replug", layers=[1, 2], max_new_tokens=3)
    got = answer_question(replug, QUESTION, docs, curvature, scores=scores)
    want = replug.generate(QUESTION, docs, scores=scores)
    assert got.order == [0, 1, 2, 3] and got.generation.tokens == want.tokens
    assert [s.weights for s in got.generation.steps] == [s.weights for s in want.steps]
    # naive over no passages, ranked: the closed-book answer, nothing to arrange
    closed = answer_question(naive, QUESTION, [])
    assert closed.order == [] and closed.generation.tokens == naive.generate(QUESTION, []).tokens
