"""The shared batching helper against brute-force references, and its use by both engines."""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest

from cisrank.runtimes.batching import LengthBatcher, dedupe, pad_batch, scatter


def reference_plan(lengths, batch_size, batch_tokens, max_padding):
    """Greedy by hand: walk the items longest first (ties by index) and close the batch when the
    next one would break a limit."""
    order = sorted((i for i, n in enumerate(lengths) if n > 0), key=lambda i: (-lengths[i], i))
    batches = []
    for i in order:
        cur = batches[-1] if batches else None
        fits = cur is not None
        if fits:
            width = lengths[cur[0]]
            rows = len(cur) + 1
            fits = (batch_size is None or rows <= batch_size) and (
                batch_tokens is None or rows * width <= batch_tokens
            )
            if max_padding is not None:
                fits = fits and width - lengths[i] <= max_padding * width
        if fits:
            cur.append(i)
        else:
            batches.append([i])
    return batches


POLICIES = [
    (None, None, None),
    (3, None, None),
    (None, 40, None),
    (None, None, 0.0),
    (None, None, 0.25),
    (4, 64, 0.1),
    (1, 1, 0.5),
]


@pytest.mark.parametrize("policy", POLICIES)
def test_plan_matches_reference_and_respects_every_limit(policy):
    batch_size, batch_tokens, max_padding = policy
    batcher = LengthBatcher(batch_size, batch_tokens, max_padding)
    rng = random.Random(7)
    for _ in range(200):
        lengths = [rng.choice([0, 1, 2, 5, 9, 10, 11, 30]) for _ in range(rng.randint(0, 25))]
        plan = batcher.plan(lengths)
        assert plan == reference_plan(lengths, *policy)
        flat = [i for b in plan for i in b]
        # Every item with something to score is in exactly one batch; empty items in none.
        assert sorted(flat) == [i for i, n in enumerate(lengths) if n > 0]
        # Longest first, ties by index, across and within batches.
        assert flat == sorted(flat, key=lambda i: (-lengths[i], i))
        for b in plan:
            width = lengths[b[0]]
            assert width == max(lengths[i] for i in b)
            if batch_size is not None:
                assert len(b) <= batch_size
            if batch_tokens is not None and len(b) > 1:
                assert len(b) * width <= batch_tokens
            if max_padding is not None:
                assert all(width - lengths[i] <= max_padding * width for i in b)


def test_plan_cuts_only_where_a_limit_forces_it():
    # Greedy and nothing more: consecutive batches could not have been merged by one item.
    assert LengthBatcher().plan([3, 1, 2]) == [[0, 2, 1]]
    assert LengthBatcher(batch_size=2).plan([3, 1, 2]) == [[0, 2], [1]]
    assert LengthBatcher(batch_tokens=6).plan([3, 1, 2]) == [[0, 2], [1]]
    assert LengthBatcher(max_padding=0.5).plan([4, 1, 2, 3]) == [[0, 3, 2], [1]]
    assert LengthBatcher(batch_tokens=2).plan([5, 5]) == [[0], [1]]  # one row may exceed it


def test_run_scores_each_item_once_and_restores_order():
    lengths = [4, 0, 2, 7, 2, 1, 0, 3]
    calls = []

    def score(rows):
        calls.append(list(rows))
        return [10 * i for i in rows]

    out = LengthBatcher(batch_size=2).run(lengths, score, empty=-1)
    assert out == [0, -1, 20, 30, 40, 50, -1, 70]
    scored = [i for c in calls for i in c]
    assert sorted(scored) == [0, 2, 3, 4, 5, 7]  # each non-empty item exactly once
    with pytest.raises(RuntimeError, match="gave 1 results"):
        LengthBatcher().run([1, 1], lambda rows: [0], empty=0)


def test_dedupe_and_scatter_round_trip():
    rng = random.Random(3)
    for _ in range(100):
        items = [rng.choice("abcde") * rng.randint(1, 3) for _ in range(rng.randint(0, 20))]
        unique, slots = dedupe(items)
        assert unique == list(dict.fromkeys(items))  # first-seen order, no repeats
        assert [unique[s] for s in slots] == items
        assert scatter([u.upper() for u in unique], slots) == [i.upper() for i in items]


@pytest.mark.parametrize("left", [False, True])
def test_pad_batch_against_brute_force(left):
    seqs = [[5, 6, 7], [8], [], [1, 2, 3, 4]]
    ids, mask, offsets = pad_batch(seqs, pad_value=-9, left=left)
    assert ids.dtype == np.int64 and ids.shape == mask.shape == (4, 4)
    for row, m, off, s in zip(ids.tolist(), mask.tolist(), offsets, seqs, strict=True):
        pad = [-9] * (4 - len(s))
        assert row == (pad + s if left else s + pad)
        ones = [1] * len(s)
        assert m == ([0] * len(pad) + ones if left else ones + [0] * len(pad))
        assert off == (len(pad) if left else 0)


def test_batcher_rejects_bad_limits():
    for bad in ({"batch_size": 0}, {"batch_tokens": 0}, {"max_padding": 1.0}):
        with pytest.raises(ValueError):
            LengthBatcher(**bad)


def test_causal_lm_batches_follow_the_shared_plan(tiny_gpt2_dir):
    """The CIS engine's forwards are exactly the batches `LengthBatcher.plan` gives for its
    policy, over the distinct non-empty passages."""
    from transformers import AutoTokenizer

    from cisrank.lm.engine import CausalLMEngine
    from cisrank.testing import SAMPLE_SENTENCES

    tok = AutoTokenizer.from_pretrained(tiny_gpt2_dir)
    conts = [tok(s, add_special_tokens=False)["input_ids"] for s in SAMPLE_SENTENCES]
    conts += [conts[1], [], conts[0]]
    prefix = [tok.bos_token_id, *tok("who wrote hamlet")["input_ids"]]
    for cache, policy in itertools.product((True, False), ((3, 64, 0.5), (None, 4096, 0.05))):
        engine = CausalLMEngine(
            str(tiny_gpt2_dir),
            device="cpu",
            batch_size=policy[0],
            batch_tokens=policy[1],
            max_padding=policy[2],
            use_prefix_cache=cache,
        )
        unique, _ = dedupe(tuple(c) for c in conts)
        extra = 0 if cache else len(prefix)  # uncached rows read the prefix too
        lengths = [len(c) + extra if c else 0 for c in unique]
        want = [[lengths[i] for i in b] for b in LengthBatcher(*policy).plan(lengths)]
        seen = []

        def hook(module, args, kwargs, output, seen=seen, cached=len(prefix) - extra):
            # Real tokens per row that this forward reads (a cached prefix is not read again).
            seen.append((kwargs["attention_mask"].sum(1) - cached).tolist())

        handle = engine.backend.base.register_forward_hook(hook, with_kwargs=True)
        try:
            engine.score_continuations(prefix, conts)
        finally:
            handle.remove()
        if cache:
            assert seen[0] == [0]  # the prefix's own forward, once
            seen = seen[1:]
        assert seen == want, (cache, policy)
