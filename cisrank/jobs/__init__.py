"""The offline jobs' machinery: where a model's work runs and how a sharded job resumes.

- `shards`: the one shard runner (`run_shards`) of the dense build, the prior job and teacher
  scoring: the engine's dispatch, claiming and resuming, atomic shard writes, progress;
- `resume`: what a rerun of an interrupted job keeps (`claim_shard_dir`, `resume_shards`);
- `pool`: a model's work spread over local worker processes, one per core (`WorkerPool`), used
  by the runner's `local` engine and by a pooled reranker;
- `ray`: the runner's `ray` engine, shards scored on a Ray actor pool (Ray imported lazily).

It imports only the shared types and the leaves, so every floor that runs model work (rerank,
indexes, eval, distill, serving, cli) can use it.
"""
