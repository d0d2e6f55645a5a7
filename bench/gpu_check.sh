#!/usr/bin/env bash
# The checks a lent GPU machine runs, as one prepared script (the device tool's `run`; CI has no
# GPU). It needs what a bare machine lacks, built beforehand by bench/gpu_prepare.sh in the
# ignored folder .gpu/ (carried): wheels the machine's image lacks, DL19/21/22 and the training
# queries, SmolLM2-135M's config and tokenizer, and all-MiniLM-L6-v2 with float16 weights (45 MB
# fits the 64 MiB a call carries, 90 MB of float32 does not; widened back to float32 there, so
# the sweep's students start from weights within 1e-3 of the real ones).
#
#   1. a 7-step student training: the sweep's path works on this image, or stop at once;
#   2. tests/gpu: the engine, CIS and the cross-encoder on CUDA against the CPU;
#   3. bench/gpu_cis.py: CIS in float32 and bf16, GPU and CPU batching, on DL19;
#   4. bench/student_sweep.py: the student grid on DL21 dev, SWEEP_SECONDS at most
#      (SWEEP_VARIANTS and SWEEP_SEEDS pick the grid; its summary is copied to $OUT as it grows,
#      so a call stopped at its limit still brings back every finished run).
#
# SKIP_CHECKS=1 skips 1-3: a second call on the same warm machine resumes the sweep (finished
# runs are skipped), e.g. with more seeds.
#
# Everything it reports lands in $OUT (the device tool brings it back).
set -uo pipefail
OUT=${OUT:-out/gpu-check}
SWEEP_SECONDS=${SWEEP_SECONDS:-330}
SWEEP_PARALLEL=${SWEEP_PARALLEL:-8}  # on the H200: 94-247 s a run, 8 at a time
SWEEP_SEEDS=${SWEEP_SEEDS:-12 13 14}
SWEEP_VARIANTS=${SWEEP_VARIANTS:-}
SKIP_CHECKS=${SKIP_CHECKS:-0}
mkdir -p "$OUT"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .gpu/whl/*.whl || exit 2
export PYTHONPATH=/tmp/site:$PWD
mkdir -p /tmp/g && tar xJf .gpu/small.tar.xz -C /tmp/g || exit 2
export CISRANK_DATA_DIR=/tmp/g/data
python3 - <<'EOF' || exit 2
import shutil
from pathlib import Path
from safetensors.torch import load_file, save_file
src, dst = Path(".gpu/minilm"), Path("/tmp/minilm")
shutil.copytree(src, dst, dirs_exist_ok=True, ignore=shutil.ignore_patterns("*.safetensors"))
t = load_file(src / "model.fp16.safetensors")
save_file({k: (v.float() if v.is_floating_point() else v) for k, v in t.items()}, dst / "model.safetensors")
EOF
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/machine.txt"
python3 -c "import torch, transformers, sentence_transformers as st; print('torch', torch.__version__, 'transformers', transformers.__version__, 'sentence-transformers', st.__version__)" | tee -a "$OUT/machine.txt"

if [ "$SKIP_CHECKS" != 1 ]; then
# the sweep's own recipe, cut to 7 steps and a shallow dev set
SMOKE=$(cd bench && python3 -c "from student_sweep import RECIPE, flags; print(' '.join(flags(RECIPE, '--epochs 0.01 --eval-steps 3 --dev-depth 5')))") || exit 2
{ python3 -m cisrank.cli distill pool --out out/trainset \
    && python3 -m cisrank.cli distill train $SMOKE --base-model /tmp/minilm --device cuda --out /tmp/smoke; } \
    > "$OUT/smoke.log" 2>&1 || { tail -40 "$OUT/smoke.log"; exit 3; }
echo "smoke training: ok"

python3 -m pytest -q tests/gpu -p no:cacheprovider > "$OUT/pytest-gpu.log" 2>&1
tail -25 "$OUT/pytest-gpu.log"
(cd bench && python3 gpu_cis.py --model-config /tmp/g/smollm2) 2>&1 | grep -v "Loading\|Writing" | tee "$OUT/gpu_cis.log"
cp bench/results/gpu_cis.json "$OUT/" 2>/dev/null
fi

grid=(--seeds $SWEEP_SEEDS ${SWEEP_VARIANTS:+--variants $SWEEP_VARIANTS})
( while sleep 15; do cp /tmp/sweep/summary.json /tmp/sweep/summary.md "$OUT/" 2>/dev/null; done ) &
copier=$!
OMP_NUM_THREADS=2 timeout "$SWEEP_SECONDS" python3 bench/student_sweep.py --out /tmp/sweep \
    "${grid[@]}" --parallel "$SWEEP_PARALLEL" --device cuda --base-model /tmp/minilm \
    >> "$OUT/sweep.log" 2>&1
kill $copier
python3 bench/student_sweep.py --out /tmp/sweep "${grid[@]}" --summarize
cp /tmp/sweep/summary.json /tmp/sweep/summary.md "$OUT/" 2>/dev/null
exit 0
