"""The wire shapes clients bring, one converter each, between a request body (`cisrank.api.schemas`)
and the serving engine's plain queries and results (`cisrank.serving.types`):

- `cohere`: Cohere's and Jina's rerank (also what vLLM, LiteLLM and infinity serve);
- `tei`: Hugging Face text-embeddings-inference's rerank and endpoint info;
- `openai`: OpenAI's embeddings;
- `native`: cisrank's own search, context, generation and model list.

A converter holds only renames: cisrank's own request bodies are the engine's queries and go to it
as they are; the Cohere, TEI and OpenAI converters rename the few fields their shapes name their
own way and take the others by name (`renaming.query_of`). Each renames the fields the engine's
errors blame to its own shape's (`renaming`) and writes its shape's answer; it decides nothing
the engine decides. A new
REST shape is one more module here, its schemas and its routes. No web framework here (an
import-linter contract), so each converter is tested without a server.
"""
