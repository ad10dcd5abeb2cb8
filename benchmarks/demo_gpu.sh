#!/usr/bin/env bash
# The demo on the GPU stack (docs/demo.md, "On a GPU"): `molt-train demo --gpu` on one GPU (an H200: ~10 minutes),
# then its curve into docs/demo-gpu.png and its printed figures into docs/demo-gpu.txt, to commit.
# Needs CUDA and vLLM (`pip install -e '.[gpu]'`, or benchmarks/gpu/README.md's staging); run from anywhere.
set -euo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 HF_HUB_OFFLINE=1
PY=${PYTHON:-python3}
out=${1:-runs/demo-gpu}
mkdir -p "$(dirname "$out")"
$PY -m molt_train.cli demo --gpu --seed 42 --output_dir "$out" --no-progress 2>&1 | tee "$out.log"
cp "$out/report.png" docs/demo-gpu.png
sed -n '/, seed [0-9]*: SFT saw/,$p' "$out.log" > docs/demo-gpu.txt
cat docs/demo-gpu.txt
