"""The language model's floor: every causal-LM score and decode, below the rerankers
(`cisrank.rerank`) and RAG context assembly (`cisrank.context`), which both build on it.

- `engine`: `CausalLMEngine`, summed log-probabilities of target spans after their contexts (the
  one hot path of CIS forward and reverse, priors, the context gauge and the orderings), on any
  runtime of the table (`cisrank.runtimes`: torch, the default; ctranslate2, onnx);
- `backends`: an engine by runtime name (`load_engine`; `auto` resolved for the host);
- `decoding`: lock-step decoding of several prompts with one shared generated suffix;
- `prompts`: prompt templates as data, the one chat renderer and the one field checker.
"""
