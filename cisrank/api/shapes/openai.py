"""OpenAI's embeddings shape (`POST /v1/embeddings`, as infinity and TEI serve it too), for a
served dense reranker's bi-encoder.

`input` is one text or a list of texts (a single text's errors name `input`, a list's
`input.N`); `encoding_format: base64` is the little-endian float32 bytes of each vector, what the
openai client asks for by default.
"""

from __future__ import annotations

import base64

from cisrank.api.schemas import EmbeddingOut, EmbeddingsRequest, EmbeddingsResponse, EmbeddingsUsage
from cisrank.api.shapes.renaming import fields_renamed, query_of, renamed_list
from cisrank.serving.ranking import RankingService
from cisrank.serving.types import EmbedQuery


async def embeddings(service: RankingService, body: EmbeddingsRequest) -> EmbeddingsResponse:
    single = isinstance(body.input, str)
    texts = [body.input] if isinstance(body.input, str) else list(body.input)
    with fields_renamed(renamed_list("texts", "input", single)):
        result = await service.embed(query_of(EmbedQuery, body, texts=texts))
    if body.encoding_format == "base64":
        data = [
            EmbeddingOut(index=i, embedding=base64.b64encode(row.astype("<f4").tobytes()).decode())
            for i, row in enumerate(result.vectors)
        ]
    else:
        data = [
            EmbeddingOut(index=i, embedding=row.tolist()) for i, row in enumerate(result.vectors)
        ]
    return EmbeddingsResponse(
        data=data,
        model=result.reranker,
        usage=EmbeddingsUsage(prompt_tokens=result.tokens, total_tokens=result.tokens),
    )
