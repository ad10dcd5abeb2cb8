#!/bin/bash
# The GPU measurements of benchmarks/README.md "GPU (H200)", in two device calls (each under 10 minutes), run from
# the repository root on the device machine after the vLLM bundle is installed (source .stage-vllm/p2/install.sh).
#   bash benchmarks/gpu/run_h200.sh hf  # rollout through the HF engine (256 / 1024 concurrent); needs no vLLM
#   bash benchmarks/gpu/run_h200.sh a   # GPU tests, rollout through the vLLM engine, colocated GRPO step at 0.6B
#   bash benchmarks/gpu/run_h200.sh b   # NCCL sync GPU0 -> GPU1 (0.6B, 1.7B) when 2 GPUs; GRPO step at 1.7B
# On nvidia-h200-x2, with Ray, TRL and AutoModel carried as wheels (.stage-gpu/{a,b}: ray's wheel split in two),
# back-to-back calls (carry in brackets):
#   stage1 [.stage-vllm/p1]: models | stage2 [.stage-gpu/a] | stage3 [.stage-vllm/p2]: vLLM |
#   (stage3 also: the trainer's training MFU in three variants, its GPU test, vLLM rollout at 256 / 1024) |
#   c [.stage-gpu/b]: ray/trl/automodel wheels, the CLI GPU tests (disaggregated, async, 2-way) |
#   d: placement bench (disaggregated async vs colocated sync) |
#   e [.stage-gpu/b]: our GRPO step and TRL's GRPOTrainer step side by side (GPU 1 / GPU 0), NCCL sync at 1.7B
#   f (after stage1, instead of stage3) [.stage-vllm/p2]: training MFU (one variant profiled),
#   the worker's GPU test, our GRPO step compiled
#   g (after stage1, instead of stage3) [.stage-vllm/p2]: our compiled GRPO step (GPU 0), vLLM rollout 256 x 512
#   (GPU 1). Then stage2, and e with GRPO_FLAGS="--compile --overlap --steps 4" GRPO_FLAGS2="--compile --steps 4"
#   SKIP_NCCL=1 (ours overlapped, then in series, beside TRL; PROFILE_ROLLOUT=1: then vLLM's profile of 32 decode
#   steps on GPU 0), and c with CLI_K=two_way (runs test_gpu_vllm.py first)
# On one nvidia-h200 (sixth session: engines sharing the GPU), back-to-back calls:
#   one1 [.stage-vllm/p1]: models | one2 [.stage-vllm/p2 .stage-gpu/t] (source .stage-vllm/p2/install.sh first):
#   rollout 256 x 512 with 1, 2 and 4 engines, TRL's wheels | one3 (source /tmp/stg/install.sh first): our overlapped
#   step with the best engine count, then TRL's step, in one command | one4: the vLLM GPU tests, our steps in series
# Logs and RESULT json files go to $OUT. Every phase has its own time limit, so one failure does not stop the rest.
set -u
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
M06=/tmp/models/q06; M17=/tmp/models/q17
phase() { local name=$1 limit=$2 rc; shift 2; echo "=== $name ($(date +%T), limit ${limit}s)"; \
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1; rc=$?; echo "=== $name rc=$rc ($(date +%T))"; \
  grep -E "^(RESULT|step |made|vllm engine|hf |vllm |engine |before|0\.6b|1\.7b|[0-9]+ passed|FAILED|ERROR|E  |\
colocated_sync|disaggregated|automodel|trl|float32|bfloat16|\{)" "$OUT/$name.log" | cut -c1-400 | tail -40; \
  [ $rc -eq 0 ] || tail -n 25 "$OUT/$name.log" | cut -c1-300; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
export PYTHONPATH=$PYTHONPATH:/tmp/site2  # ray, trl, datasets, gymnasium (stage3)
M06T=/tmp/models/tiny
case "$1" in
stage1)
  mkdir -p /tmp/stg && cp .stage-vllm/p1/* /tmp/stg/
  for m in "$M06 0.6b" "$M06T tiny" "$M17 1.7b"; do set -- $m; CUDA_VISIBLE_DEVICES=0 python3 benchmarks/gpu/shapes.py $1 $2; done
  ;;
stage2) mkdir -p /tmp/whl && cp .stage-gpu/a/* /tmp/whl/ ;;
stage3)  # run as: source .stage-vllm/p2/install.sh && bash benchmarks/gpu/run_h200.sh stage3
  cp .stage-vllm/p2/install.sh /tmp/stg/install.sh  # later calls: source /tmp/stg/install.sh (vLLM is unpacked)
  (  # GPU 0: the trainer's training-phase MFU, three variants, then the worker's GPU test; GPU 1: rollout
    for v in "--param-dtype float32" "--param-dtype bfloat16" "--param-dtype bfloat16 --compile"; do
      phase "mfu_${v// /_}" 200 env CUDA_VISIBLE_DEVICES=0 python3 benchmarks/gpu/train_mfu_bench.py --model $M06 $v
    done
    phase worker_test 200 env CUDA_VISIBLE_DEVICES=0 python3 -m pytest -q -p no:cacheprovider tests/molt_train/test_gpu_policy_worker.py
  ) & 
  phase rollout_vllm 250 env CUDA_VISIBLE_DEVICES=1 python3 benchmarks/gpu/rollout_bench.py --engine vllm --model $M06
  wait
  ;;
c|e)
  if [ ! -d /tmp/site2 ]; then  # the wheels, once per machine
    cp .stage-gpu/b/* /tmp/whl/ && cd /tmp/whl && cat ray.whl.part0? > ray-2.60.0-cp312-cp312-manylinux2014_x86_64.whl \
      && sha256sum -c ray.sha256 && rm ray.whl.part0? && cd - >/dev/null || exit 1
    python3 -m pip install -q --no-index --no-deps --target /tmp/site2 /tmp/whl/{ray,jsonschema,referencing,rpds,trl,datasets,multiprocess,gymnasium,cloudpickle,farama,molt_ecosystem}*.whl
    python3 -m pip install -q --no-index --no-deps --target /tmp/site_am /tmp/whl/{nemo_automodel,megatron_fsdp,transformers,torchao}*.whl
    python3 -c "import vllm, ray, env_registry, molt_train.trainer; print('imports ok', vllm.__version__, ray.__version__,
      env_registry.spec('molt/gsm8k-v1').id)"  # the project's wheel in /tmp/site2 gives the registry its manifests
  fi
  ;;&
c)
  [ "${CLI_K:-}" ] && phase vllm_tests 200 env CUDA_VISIBLE_DEVICES=0 python3 -m pytest -q -p no:cacheprovider \
    tests/molt_train/test_gpu_vllm.py
  phase cli_tests 540 python3 -m pytest -q -p no:cacheprovider tests/molt_train/test_gpu_trainer_vllm.py \
    -k "${CLI_K:-disaggregated or two_way}"
  ;;
d)
  phase placement 280 python3 benchmarks/gpu/placement_bench.py --model $M06 --eager
  ;;
f)  # run as: source .stage-vllm/p2/install.sh && bash benchmarks/gpu/run_h200.sh f
  cp .stage-vllm/p2/install.sh /tmp/stg/install.sh
  (  # GPU 0: training MFU (one variant profiled), then the worker's GPU test
    for v in "--compile --profile" "" "--compile --micro-rows 64 --max-tokens 65536"; do
      phase "mfu_${v// /_}" 240 env CUDA_VISIBLE_DEVICES=0 python3 benchmarks/gpu/train_mfu_bench.py --model $M06 $v
    done
    phase worker_test 150 env CUDA_VISIBLE_DEVICES=0 python3 -m pytest -q -p no:cacheprovider tests/molt_train/test_gpu_policy_worker.py
  ) &
  phase grpo_06b_compile 330 env CUDA_VISIBLE_DEVICES=1 python3 benchmarks/gpu/grpo_step_bench.py --model $M06 --compile
  wait
  ;;
g)  # run as: source .stage-vllm/p2/install.sh && bash benchmarks/gpu/run_h200.sh g
  cp .stage-vllm/p2/install.sh /tmp/stg/install.sh
  G="python3 benchmarks/gpu/grpo_step_bench.py --model $M06 --compile --steps 4"
  phase grpo_compile 280 env CUDA_VISIBLE_DEVICES=0 $G --tag compile &
  phase rollout_vllm 250 env CUDA_VISIBLE_DEVICES=1 python3 benchmarks/gpu/rollout_bench.py --engine vllm --model $M06 \
    --concurrency 256 --new-tokens 512
  wait
  ;;
e)  # side by side: TRL's GRPOTrainer on GPU 0, ours (the trainer's PolicyWorker + our vLLM engine) on GPU 1
  (
    phase grpo_06b 300 env CUDA_VISIBLE_DEVICES=1 python3 benchmarks/gpu/grpo_step_bench.py --model $M06 --tag 0.6b \
      ${GRPO_FLAGS:-}
    [ "${GRPO_FLAGS2:-}" ] && phase grpo_06b_2 260 env CUDA_VISIBLE_DEVICES=1 python3 benchmarks/gpu/grpo_step_bench.py \
      --model $M06 --tag 0.6b_2 $GRPO_FLAGS2
  ) &
  phase trl_06b 330 env CUDA_VISIBLE_DEVICES=0 python3 benchmarks/gpu/trl_step_bench.py --model $M06
  [ "${PROFILE_ROLLOUT:-}" ] && phase rollout_profile 150 env CUDA_VISIBLE_DEVICES=0 python3 \
    benchmarks/gpu/rollout_bench.py --engine vllm --model $M06 --concurrency 256 --new-tokens 512 --reps 1 \
    --profile "$OUT/prof" && find "$OUT/prof" -name "*.txt" -exec head -n 45 {} \; | cut -c1-220
  wait
  [ "${SKIP_NCCL:-}" ] || phase nccl_17b 120 env CUDA_VISIBLE_DEVICES=1 python3 benchmarks/gpu/nccl_sync_bench.py --model $M17 --tag 1.7b \
    --trainer-gpu 0
  ;;
one1)
  mkdir -p /tmp/stg && cp .stage-vllm/p1/* /tmp/stg/
  for m in "$M06 0.6b" "$M06T tiny"; do set -- $m; python3 benchmarks/gpu/shapes.py $1 $2; done
  ;;
one2)  # run as: source .stage-vllm/p2/install.sh && bash benchmarks/gpu/run_h200.sh one2
  cp .stage-vllm/p2/install.sh /tmp/stg/install.sh
  python3 -m pip install -q --no-index --no-deps --target /tmp/site_trl .stage-gpu/t/*.whl
  for k in 1 2 4; do
    phase rollout_x$k 200 python3 benchmarks/gpu/rollout_bench.py --engine vllm --model $M06 --concurrency 256 \
      --new-tokens 512 --reps 3 --max-num-seqs 256 --engines $k
    grep -h "^vllm x$k" "$OUT/rollout_x$k.log" | sed -E 's/.* = ([0-9]+) tok\/s/\1/' | sort -n | tail -1 \
      | sed "s/$/ $k/" >> /tmp/best_engines
  done
  sort -n /tmp/best_engines | tail -1
  ;;
one3)  # run as: source /tmp/stg/install.sh && bash benchmarks/gpu/run_h200.sh one3
  K=${ENGINES:-$(sort -n /tmp/best_engines | tail -1 | cut -d' ' -f2)}
  phase grpo_overlap_x$K 300 python3 benchmarks/gpu/grpo_step_bench.py --model $M06 --tag overlap_x$K --compile \
    --overlap --no-recompute --steps 4 --sync-reps 2 --max-num-seqs 256 --engines $K
  phase trl_06b 280 env PYTHONPATH=$PYTHONPATH:/tmp/site_trl python3 benchmarks/gpu/trl_step_bench.py --model $M06
  ;;
one4)  # run as: source /tmp/stg/install.sh && bash benchmarks/gpu/run_h200.sh one4
  K=${ENGINES:-$(sort -n /tmp/best_engines | tail -1 | cut -d' ' -f2)}
  phase gpu_tests 300 python3 -m pytest -q -p no:cacheprovider tests/molt_train/test_gpu_vllm.py
  phase grpo_series_x$K 250 python3 benchmarks/gpu/grpo_step_bench.py --model $M06 --tag series_x$K --compile \
    --no-recompute --steps 3 --sync-reps 2 --max-num-seqs 256 --engines $K
  ;;
one5)  # run as: source .stage-vllm/p2/install.sh && bash benchmarks/gpu/run_h200.sh one5: log-probs on/off, both runners
  cp .stage-vllm/p2/install.sh /tmp/stg/install.sh
  R="python3 benchmarks/gpu/rollout_bench.py --engine vllm --model $M06 --concurrency 256 --new-tokens 512 --reps 2 \
    --max-num-seqs 256 --ab-logprobs"
  phase runner_v2 170 $R
  phase runner_v1 170 env VLLM_USE_V2_MODEL_RUNNER=0 $R
  ;;
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
