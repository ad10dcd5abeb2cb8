#!/bin/bash
# The GPU measurements of benchmarks/README.md "GPU (H200)", in two device calls (each under 10 minutes), run from
# the repository root on the device machine after the vLLM bundle is installed (source .stage-vllm/p2/install.sh).
#   bash benchmarks/gpu/run_h200.sh hf  # rollout through the HF engine (256 / 1024 concurrent); needs no vLLM
#   bash benchmarks/gpu/run_h200.sh a   # GPU tests, rollout through the vLLM engine, colocated GRPO step at 0.6B
#   bash benchmarks/gpu/run_h200.sh b   # NCCL sync GPU0 -> GPU1 (0.6B, 1.7B) when 2 GPUs; GRPO step at 1.7B
# On nvidia-h200-x2, with Ray, TRL and AutoModel carried as wheels (.stage-gpu/{a,b}: ray's wheel split in two),
# back-to-back calls (carry in brackets):
#   stage1 [.stage-vllm/p1]: models | stage2 [.stage-gpu/a] | stage3 [.stage-vllm/p2]: vLLM, NCCL sync into vLLM |
#   c [.stage-gpu/b]: ray/trl/automodel wheels, the CLI GPU tests (colocated, 2-way, disaggregated) |
#   d: placement bench (disaggregated async vs colocated sync), AutoModel through the CLI |
#   e: TRL's GRPOTrainer step, NCCL sync at 1.7B, GRPO step at 1.7B
# Logs and RESULT json files go to $OUT. Every phase has its own time limit, so one failure does not stop the rest.
set -u
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
M06=/tmp/models/q06; M17=/tmp/models/q17
phase() { local name=$1 limit=$2 rc; shift 2; echo "=== $name ($(date +%T), limit ${limit}s)"; \
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1; rc=$?; echo "=== $name rc=$rc ($(date +%T))"; \
  grep -E "^(RESULT|step |made|vllm engine|hf |vllm |engine |before|0\.6b|1\.7b|[0-9]+ passed|FAILED|ERROR|E  |\
colocated_sync|disaggregated|automodel|trl|\{)" "$OUT/$name.log" | cut -c1-400 | tail -40; \
  [ $rc -eq 0 ] || tail -n 25 "$OUT/$name.log" | cut -c1-300; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
export PYTHONPATH=$PYTHONPATH:/tmp/site2  # ray, trl, datasets, gymnasium (stage3)
M06T=/tmp/models/tiny
case "$1" in
stage1)
  mkdir -p /tmp/stg && cp .stage-vllm/p1/* /tmp/stg/
  for m in "$M06 0.6b" "$M06T tiny"; do set -- $m; CUDA_VISIBLE_DEVICES=0 python3 benchmarks/gpu/shapes.py $1 $2; done
  ;;
stage2) mkdir -p /tmp/whl && cp .stage-gpu/a/* /tmp/whl/ ;;
stage3)  # run as: source .stage-vllm/p2/install.sh && bash benchmarks/gpu/run_h200.sh stage3
  cp .stage-vllm/p2/install.sh /tmp/stg/install.sh  # later calls: source /tmp/stg/install.sh (vLLM is unpacked)
  phase nccl_06b 150 env CUDA_VISIBLE_DEVICES=1 python3 benchmarks/gpu/nccl_sync_bench.py --model $M06 --tag 0.6b
  ;;
c)
  cp .stage-gpu/b/* /tmp/whl/ && cd /tmp/whl && cat ray.whl.part0? > ray-2.60.0-cp312-cp312-manylinux2014_x86_64.whl \
    && sha256sum -c ray.sha256 && rm ray.whl.part0? && cd - >/dev/null || exit 1
  python3 -m pip install -q --no-index --no-deps --target /tmp/site2 /tmp/whl/{ray,jsonschema,referencing,rpds,trl,datasets,multiprocess,gymnasium,cloudpickle,farama,molt_ecosystem}*.whl
  python3 -m pip install -q --no-index --no-deps --target /tmp/site_am /tmp/whl/{nemo_automodel,megatron_fsdp,transformers,torchao}*.whl
  python3 -c "import vllm, ray, env_registry, molt_train.trainer; print('imports ok', vllm.__version__, ray.__version__,
    env_registry.spec('molt/gsm8k-v1').id)"  # the project's wheel in /tmp/site2 gives the registry its manifests
  phase cli_tests 420 python3 -m pytest -q -p no:cacheprovider tests/molt_train/test_gpu_trainer_vllm.py
  ;;
d)
  phase placement 280 python3 benchmarks/gpu/placement_bench.py --model $M06 --eager
  phase automodel 200 env PYTHONPATH=/tmp/site_am:$PYTHONPATH bash -c "CUDA_VISIBLE_DEVICES=0 python3 -c \"from \
molt_train.actor_backend import load_policy_model as l; m = l('automodel', '$M06T'); print('automodel model', \
type(m).__module__, type(m).__name__)\" && python3 -m molt_train.cli rl --env molt/gsm8k-v1 --actor.backend automodel \
--actor.model_name_or_path $M06T --rollout.engine vllm --train.colocate_all --vllm.enforce_eager --train.force_sync_mode \
--train.check_weight_update_equal --rollout.batch_size 4 --rollout.n_samples_per_prompt 8 --algo.advantage.estimator grpo \
--rollout.max_new_tokens 64 --train.num_steps 3 --eval.max_samples 0 --ray.num_cpus 8 --ckpt.output_dir /tmp/am_run \
--no-logger.progress && tail -n 3 /tmp/am_run/metrics.jsonl | cut -c1-600"
  ;;
e)
  phase trl_06b 300 env CUDA_VISIBLE_DEVICES=0 python3 benchmarks/gpu/trl_step_bench.py --model $M06
  CUDA_VISIBLE_DEVICES=0 python3 benchmarks/gpu/shapes.py $M17 1.7b
  phase nccl_17b 120 env CUDA_VISIBLE_DEVICES=1 python3 benchmarks/gpu/nccl_sync_bench.py --model $M17 --tag 1.7b \
    --trainer-gpu 0
  phase grpo_17b 150 env CUDA_VISIBLE_DEVICES=0 python3 benchmarks/gpu/grpo_step_bench.py --model $M17 --tag 1.7b --steps 2 --sync-reps 3 --micro-rows 8
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
