"""The runtimes' floor: what executes a model, for every task, below the engines that use it.

- `table`: the one table of runtimes (torch, onnx, ctranslate2) by task (`causal-lm`,
  `sequence-classification`), with their compute types, extras and loaders; every `--backend`
  name, config `Literal` and error message that lists runtimes comes from it;
- `auto`: what `--backend auto` picks for the host, per task, and the measurements behind it;
- `lm` and `lm_torch`, `lm_onnx`, `lm_ctranslate2` (with `lm_loader`): the causal-LM interface
  (`LMBackend`) and its runtimes, under the engine of `cisrank.lm`;
- `encoder` and `encoder_torch`, `encoder_onnx`: the sequence-classification interface
  (`EncoderBackend`) and its runtimes, under the cross-encoder reranker;
- `batching`: dedupe, sort by length, batch, pad, scatter back (every model-backed scorer);
- `onnx_export`, `checked_cache`: one-time exports and conversions, cached by the source
  folder's files and checked like a pulled model.

Adding a runtime is one module implementing a task's interface and one row of `table`.
"""
