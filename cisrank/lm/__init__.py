"""The language model's floor: every causal-LM load, score and decode, below the rerankers
(`cisrank.rerank`) and RAG context assembly (`cisrank.context`), which both build on it.

- `engine`: `CausalLMEngine`, summed log-probabilities of target spans after their contexts (the
  one hot path of CIS forward and reverse, priors, the context gauge and the orderings);
- `backend`: the `LMBackend` interface a runtime implements (`torch_backend`, the default;
  another runtime is one added module);
- `decoding`: lock-step decoding of several prompts with one shared generated suffix;
- `prompts`: prompt templates as data, the one chat renderer and the one field checker;
- `loader`: every way a causal LM is loaded (hub id, folder, catalogue name, GGUF);
- `batching`: dedupe, sort by length, batch, pad, scatter back (shared with the cross-encoder).
"""
