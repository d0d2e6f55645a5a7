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
