"""Tiny GPT-2 and Llama models with a float64 brute-force reference for context assembly."""

from __future__ import annotations

import copy

import pytest
import torch
from context.helpers import Tiny
from transformers import AutoModelForCausalLM, AutoTokenizer

from cisrank.lm.engine import CausalLMEngine

SHARPEN = 6.0


@pytest.fixture(scope="session", params=["gpt2", "llama"])
def tiny(request, tiny_gpt2_dir, tiny_llama_dir) -> Tiny:
    path = tiny_gpt2_dir if request.param == "gpt2" else tiny_llama_dir
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    # Random init (std 0.02) gives near-uniform attention and next-token distributions, under
    # which every order scores alike; sharper weights make positions matter, so an arrangement
    # test can tell orders apart. The reference is the same weights in float64.
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(SHARPEN)
    ref = copy.deepcopy(model).double()
    # max_padding 0.99: prompts of different lengths share a batch, so padding is exercised.
    engine = CausalLMEngine(model, tok, max_padding=0.99, batch_size=3)
    return Tiny(request.param, engine, ref, tok)
