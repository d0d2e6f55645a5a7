"""The tiny models load through the same from_pretrained path a user's model takes."""

from transformers import AutoModel, AutoModelForCausalLM, AutoTokenizer


def test_tiny_causal_lms_load_and_tokenize(tiny_gpt2_dir, tiny_llama_dir):
    for path in (tiny_gpt2_dir, tiny_llama_dir):
        tok = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path)
        ids = tok("Shakespeare wrote Hamlet .", add_special_tokens=False)["input_ids"]
        assert tok.unk_token_id not in ids
        assert tok.convert_ids_to_tokens(ids) == ["shakespeare", "wrote", "hamlet", "."]
        assert model.config.vocab_size == len(tok)
        assert tok.bos_token_id is not None


def test_tiny_bert_loads(tiny_bert_dir):
    tok = AutoTokenizer.from_pretrained(tiny_bert_dir)
    model = AutoModel.from_pretrained(tiny_bert_dir)
    enc = tok("Paris is the capital of France.", return_tensors="pt")
    assert enc["input_ids"][0, 0].item() == tok.cls_token_id
    assert tok.tokenize("Paris is the capital of France.") == [
        "paris",
        "is",
        "the",
        "capital",
        "of",
        "france",
        ".",
    ]
    assert model(**enc).last_hidden_state.shape[-1] == 64


def test_bpe_tokenizer_round_trips(tiny_gpt2_bpe_dir):
    tok = AutoTokenizer.from_pretrained(tiny_gpt2_bpe_dir)
    text = "Hamlet is a tragedy set in Denmark."
    assert tok.decode(tok(text, add_special_tokens=False)["input_ids"]) == text
