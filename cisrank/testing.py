"""Small models built in-process, saved with `save_pretrained` and loaded back by path.

No model can be downloaded here, so tests and benchmarks build their own: a word-level or BPE
tokenizer, and GPT-2, Llama and BERT configs of any size. Loading them goes through the same
`from_pretrained` path as a user's model, so the tests exercise the real loading code.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from pathlib import Path

BOS, EOS, PAD, UNK = "<bos>", "<eos>", "<pad>", "<unk>"
_WORD_RE = re.compile(r"\w+|[^\w\s]")


def words(texts: Iterable[str], lowercase: bool = True) -> list[str]:
    """Distinct word and punctuation tokens in first-seen order (the word-level vocab)."""
    seen: dict[str, None] = {}
    for text in texts:
        for w in _WORD_RE.findall(text.lower() if lowercase else text):
            seen.setdefault(w, None)
    return list(seen)


def word_level_tokenizer(
    vocab_words: Sequence[str], vocab_size: int | None = None, lowercase: bool = True
):
    """A fast word-level tokenizer; padded with filler entries up to `vocab_size` if given."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate([PAD, UNK, BOS, EOS])}
    for w in vocab_words:
        vocab.setdefault(w, len(vocab))
    if vocab_size is not None:
        if len(vocab) > vocab_size:
            vocab = dict(list(vocab.items())[:vocab_size])
        for i in range(len(vocab), vocab_size):
            vocab[f"<filler{i}>"] = i
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    if lowercase:
        tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation()]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=BOS, eos_token=EOS, pad_token=PAD, unk_token=UNK
    )


def bpe_tokenizer(corpus: Sequence[str], vocab_size: int = 300):
    """A byte-level BPE tokenizer trained on `corpus` (GPT-2 style: merges can cross words)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[PAD, BOS, EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(corpus, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=BOS, eos_token=EOS, pad_token=PAD
    )


def build_causal_lm(
    out_dir: str | Path,
    tokenizer,
    arch: str = "gpt2",
    *,
    layers: int = 2,
    hidden: int = 64,
    heads: int = 4,
    max_positions: int = 1024,
    seed: int = 0,
) -> Path:
    """Random-weight GPT-2 or Llama, saved with its tokenizer; returns the folder."""
    import torch
    from transformers import AutoModelForCausalLM, GPT2Config, LlamaConfig

    torch.manual_seed(seed)
    common = dict(
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    config: GPT2Config | LlamaConfig
    if arch == "gpt2":
        config = GPT2Config(
            n_layer=layers, n_embd=hidden, n_head=heads, n_positions=max_positions, **common
        )
    elif arch == "llama":
        config = LlamaConfig(
            num_hidden_layers=layers,
            hidden_size=hidden,
            num_attention_heads=heads,
            num_key_value_heads=max(1, heads // 2),
            intermediate_size=hidden * 2,
            max_position_embeddings=max_positions,
            tie_word_embeddings=False,
            **common,
        )
    else:
        raise ValueError(f"unknown arch {arch!r}: gpt2 or llama")
    model = AutoModelForCausalLM.from_config(config)
    out = Path(out_dir)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def build_bert(
    out_dir: str | Path,
    vocab_words: Sequence[str],
    *,
    layers: int = 2,
    hidden: int = 64,
    heads: int = 2,
    max_positions: int = 512,
    seed: int = 0,
) -> Path:
    """Random-weight BERT with a WordPiece vocab of whole words, saved with its tokenizer."""
    import torch

    # transformers 5 keeps BertTokenizerFast only as a runtime alias of BertTokenizer, which its
    # type stubs do not export; 4.x needs the name, so it stays.
    from transformers import BertConfig, BertModel, BertTokenizerFast  # type: ignore[attr-defined]

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    vocab = list(dict.fromkeys([*specials, *vocab_words]))
    (out / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    # Loaded from the folder: transformers 5 ignores `vocab_file=` in the constructor and would
    # save a tokenizer that maps every word to [UNK].
    tokenizer = BertTokenizerFast.from_pretrained(out, do_lower_case=True)
    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=len(vocab),
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=hidden * 2,
        max_position_embeddings=max_positions,
    )
    BertModel(config).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


SAMPLE_SENTENCES = [
    "William Shakespeare wrote Hamlet.",
    "Shakespeare was born in 1564 in Stratford-upon-Avon.",
    "Hamlet is a tragedy set in Denmark.",
    "The author of Hamlet is Shakespeare.",
    "When was the author of Hamlet born?",
    "Paris is the capital of France.",
    "Fleas can live up to a year depending on conditions.",
    "Goldfish grow to the size of their tank in some cases.",
    "Bluetooth and wifi are wireless technologies with different ranges.",
    "The United States entered World War I in 1917.",
]


# ------------------------------------------------------------------ Ray jobs: faults and counts
# Wrappers around the `ShardJob` of an `--engine ray` build (its `job_wrapper` option). They live
# here, in an importable module, because Ray pickles the job to every actor by reference.


class CountingJob:
    """Appends the shard numbers of every block it scores to `log` (one line per shard), so a
    test counts which shards a run scored. Lines are short single writes in append mode: the
    actors of one pool can share the file."""

    def __init__(self, job, log: str | Path) -> None:
        self.job = job
        self.log = str(log)

    def load(self):
        return self.job.load()

    def describe(self, state):
        return self.job.describe(state)

    def score(self, state, batch):
        out = self.job.score(state, batch)
        import pyarrow.compute as pc

        shards = pc.unique(batch.column("shard")).to_pylist()
        with open(self.log, "a", encoding="utf-8") as f:
            f.write("".join(f"{s}\n" for s in shards))
        return out


class ExitOnceJob(CountingJob):
    """Kills its actor's process (os._exit, as a segfault or the OOM killer would) when it is
    given shard `shard` while the file `marker` exists; the marker is removed first, so only the
    first attempt dies. `delay` seconds of sleep per block let other shards finish first."""

    def __init__(self, job, log: str | Path, marker: str | Path, shard: int, delay: float = 0.0):
        super().__init__(job, log)
        self.marker = str(marker)
        self.shard = shard
        self.delay = delay

    def score(self, state, batch):
        import os
        import time

        import pyarrow.compute as pc

        if self.delay:
            time.sleep(self.delay)
        shards = pc.unique(batch.column("shard")).to_pylist()
        if self.shard in shards and os.path.exists(self.marker):
            os.unlink(self.marker)
            os._exit(1)
        return super().score(state, batch)


class SlowJob(CountingJob):
    """Sleeps `delay` seconds before each block: a driver can be killed while shards are done."""

    def __init__(self, job, log: str | Path, delay: float) -> None:
        super().__init__(job, log)
        self.delay = delay

    def score(self, state, batch):
        import time

        time.sleep(self.delay)
        return super().score(state, batch)


# ------------------------------------------------------------------ exact models for shard jobs
# Models whose outputs are small integers, so that an offline job's files are the same bytes on
# every CPU (float outputs of real models move with the host's kernels): the shard-job tests
# compare what the prior job, the dense build and teacher scoring write against files built once
# and committed (tests/shard_outputs.json). Wrappers (`job_wrapper`) put them under a job's own
# scoring code on every engine, so only the model is a stand-in.

EXACT_DIM = 6
"""Dimensions of `ExactEncoder`'s embeddings."""


class ExactEncoder:
    """A stand-in for a SentenceTransformer: each text's embedding counts its lowercased words by
    crc32 bucket (integers, exact in float32; crc32, unlike `hash`, is the same in every
    process). It ignores `normalize_embeddings` so that no division rounds."""

    name = "torch"
    compute_type = "float32"

    def embed(self, texts, batch_size: int = 32, normalize: bool = True):
        """The `EmbedderBackend` face the dense build reads (`encode`, unnormalized)."""
        return self.encode(texts, batch_size)

    def encode(self, texts, batch_size: int = 32, **_ignored):
        import zlib

        import numpy as np

        out = np.zeros((len(texts), EXACT_DIM), dtype=np.float32)
        for i, text in enumerate(texts):
            for word in text.lower().split():
                out[i, zlib.crc32(word.encode()) % EXACT_DIM] += 1.0
        return out

    def parameters(self):
        import torch

        yield torch.zeros(1, dtype=torch.float32)


class ExactLM:
    """An `LMBackend` whose log-probabilities are -1 .. -5 by (previous, next) token, so summed
    log p(K) are integers. It poses as the torch runtime (a reranker config names a known one),
    and its identity is a constant: its fingerprint depends on the tokenizer alone."""

    name = "torch"
    model_name = "exact-lm"
    compute_type = "float32"
    device = "cpu"
    max_positions = None
    num_layers = 1
    supports_prefix_cache = False

    def score_rows(self, rows, context, pad_id, cached=None):
        import numpy as np

        out = [
            -float(1 + (row[j - 1] * 7 + row[j]) % 5)
            for row, ctx in zip(rows, context, strict=True)
            for j in range(ctx, len(row))
        ]
        return np.asarray(out, dtype=np.float32)

    def prefix_state(self, prefix):
        return None

    def identity(self) -> list[bytes]:
        return [b"cisrank.testing.ExactLM/1"]


def exact_engine(batch_tokens: int | None = None):
    """A causal-LM engine on `ExactLM` with the word-level tokenizer of `SAMPLE_SENTENCES`."""
    from cisrank.lm.engine import CausalLMEngine

    tokenizer = word_level_tokenizer(words(SAMPLE_SENTENCES))
    return CausalLMEngine(ExactLM(), tokenizer, batch_tokens=batch_tokens)


def load_exact_lm(model: str, compute_type: str | None, **_options):
    """`ExactLM` as a loader of the runtime table (`cisrank.runtimes.table`): what a test puts
    in a row to show that a new causal-LM runtime is one loader and one row."""
    engine = exact_engine()
    return engine.backend, engine.tokenizer


class _ExactModel:
    """A shard job with its model replaced: the job's own `describe` and `score` run on what
    `load` returns here."""

    def __init__(self, job) -> None:
        self.job = job

    def describe(self, state):
        return self.job.describe(state)

    def score(self, state, batch):
        return self.job.score(state, batch)

    def close(self, state) -> None:
        close = getattr(self.job, "close", None)
        if close is not None:
            close(state)


class ExactEncoderJob(_ExactModel):
    """The dense build's job on `ExactEncoder`."""

    def load(self):
        return ExactEncoder(), 32  # the encoder and its texts a batch, as `open_encoder` gives


class ExactPriorJob(_ExactModel):
    """The prior job's job on `ExactLM`: the CIS reranker's own prior path, with the job's store
    where it has one (the local job) and its memory otherwise (a Ray actor)."""

    def load(self):
        return self.job.loaded(
            getattr(self.job, "store", None), engine=exact_engine(self.job.batch_tokens)
        )
