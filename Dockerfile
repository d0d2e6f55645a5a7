# cisrank REST API (CPU). Build:  docker build -t cisrank .
# Run:    docker run -p 8000:8000 -v cisrank-models:/models -v $PWD/indexes:/app/indexes cisrank
# With no flags it serves what `cisrank serve` serves (deploy/server.json, copied in below): the
# all-MiniLM-L6-v2 bi-encoder on ONNX Runtime int8 on /v1/rerank ('dense'), the shipped student
# by name ('student') and the bi-encoder in float32 on /v1/embeddings ('dense-float32'), each
# exported once into /models/cache. docs/deploy.md has the rest.
# GPU hosts: build FROM an image with CUDA torch instead, or set TORCH_INDEX_URL to a CUDA index.
FROM python:3.11-slim AS base

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HF_HOME=/models/hf \
    CISRANK_MODEL_HOME=/models/cisrank \
    XDG_CACHE_HOME=/models/cache \
    TOKENIZERS_PARALLELISM=false

WORKDIR /app

# torch first, from the PyTorch CPU index, pinned by the same constraint file the project uses:
# without it a newer torch with several GB of CUDA packages would be pulled in.
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
COPY constraints.txt ./
RUN pip install --index-url "$TORCH_INDEX_URL" -c constraints.txt torch

# Dependencies before the source, so that code edits do not reinstall them.
COPY pyproject.toml README.md ./
COPY cisrank ./cisrank
# onnx: the default's and the student's runtime; models: `cisrank models pull` (CIS's language model); dense:
# BM25 and FAISS indexes (/v1/search) and the related distractors of `eval rag`.
ARG EXTRAS=serve,onnx,minilm,models,dense
RUN pip install -c constraints.txt ".[${EXTRAS}]"

RUN useradd --create-home --uid 1000 cisrank \
    && mkdir -p /app/indexes /models/hf /models/cisrank /models/cache /etc/cisrank \
    && chown -R cisrank /app/indexes /models
COPY deploy/server.json /etc/cisrank/server.json
USER cisrank

EXPOSE 8000
HEALTHCHECK --interval=15s --timeout=3s --start-period=60s --retries=3 \
    CMD python -c "import urllib.request,sys; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:8000/readyz', timeout=2).status == 200 else 1)"

# SIGTERM (docker stop) lets in-flight requests finish; give it time: docker stop -t 60.
STOPSIGNAL SIGTERM
ENTRYPOINT ["cisrank"]
CMD ["serve", "--host", "0.0.0.0", "--port", "8000", "--config", "/etc/cisrank/server.json"]
