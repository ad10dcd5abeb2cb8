#!/bin/bash
# The GPU measurements of benchmarks/README.md "GPU (H200)", in two device calls (each under 10 minutes), run from
# the repository root on the device machine after the vLLM bundle is installed (source .stage-vllm/p2/install.sh).
#   bash benchmarks/gpu/run_h200.sh hf  # rollout through the HF engine (256 / 1024 concurrent); needs no vLLM
#   bash benchmarks/gpu/run_h200.sh a   # GPU tests, rollout through the vLLM engine, colocated GRPO step at 0.6B
#   bash benchmarks/gpu/run_h200.sh b   # NCCL sync GPU0 -> GPU1 (0.6B, 1.7B) when 2 GPUs; GRPO step at 1.7B
# Logs and RESULT json files go to $OUT. Every phase has its own time limit, so one failure does not stop the rest.
set -u
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
M06=/tmp/models/q06; M17=/tmp/models/q17
phase() { local name=$1 limit=$2; shift 2; echo "=== $name ($(date +%T), limit ${limit}s)"; \
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1; echo "=== $name rc=$? ($(date +%T))"; \
  grep -E "^(RESULT|step |made|vllm engine|hf |vllm |engine |before|0\.6b|1\.7b|[0-9]+ passed|FAILED|ERROR|E  )" \
    "$OUT/$name.log" | cut -c1-400 | tail -40; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
case "$1" in
hf)  # needs no vLLM: runs while the bundle's first part is copied
  CUDA_VISIBLE_DEVICES=0 python3 benchmarks/gpu/shapes.py $M06 0.6b
  phase rollout_hf 150 env CUDA_VISIBLE_DEVICES=0 python3 benchmarks/gpu/rollout_bench.py --engine hf --model $M06 --reps 1
  ;;
a)
  CUDA_VISIBLE_DEVICES=0 python3 benchmarks/gpu/shapes.py $M06 0.6b
  phase gpu_tests 150 env CUDA_VISIBLE_DEVICES=0 python3 -m pytest -q -x -p no:cacheprovider tests/molt_train/test_gpu_vllm.py
  phase rollout_vllm 150 env CUDA_VISIBLE_DEVICES=0 python3 benchmarks/gpu/rollout_bench.py --engine vllm --model $M06
  phase grpo_06b 190 env CUDA_VISIBLE_DEVICES=0 python3 benchmarks/gpu/grpo_step_bench.py --model $M06 --tag 0.6b
  ;;
b)
  if [ "$(nvidia-smi -L | wc -l)" -ge 2 ]; then
    phase nccl_06b 120 env CUDA_VISIBLE_DEVICES=1 python3 benchmarks/gpu/nccl_sync_bench.py --model $M06 --tag 0.6b
    CUDA_VISIBLE_DEVICES=0 python3 benchmarks/gpu/shapes.py $M17 1.7b
    phase nccl_17b 120 env CUDA_VISIBLE_DEVICES=1 python3 benchmarks/gpu/nccl_sync_bench.py --model $M17 --tag 1.7b
  fi
  CUDA_VISIBLE_DEVICES=0 python3 benchmarks/gpu/shapes.py $M17 1.7b
  phase grpo_17b 150 env CUDA_VISIBLE_DEVICES=0 python3 benchmarks/gpu/grpo_step_bench.py --model $M17 --tag 1.7b --steps 2 --sync-reps 3 --micro-rows 8
  ;;
esac
