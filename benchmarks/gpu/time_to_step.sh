#!/bin/bash
# Time to the first trained steps (issue 41 §5): whole 3-step GRPO runs, process start to exit, ours and TRL's,
# one after the other on one GPU. Each RUN is MODE:NAME; MODE cold empties the compile caches first (vLLM's,
# Inductor's, Triton's: a fresh machine), warm keeps what the runs before left (a user's second run).
#   bash benchmarks/gpu/time_to_step.sh cold:trl cold:ours cold:fast warm:fast ...
# NAME: trl (TRL's GRPOTrainer), ours (the config the GRPO-step table measures: 2 engines, vLLM and the policy
# compiled), fast (--no-vllm.compile, the policy's layers compiled with symbolic shapes from the first call),
# fast1 (fast with one engine), short (--no-vllm.compile and the policy eager, the trainer's default: the recipe
# for a short run). The project's wheel must be installed (its entry points name the envs): gpu/README.md.
# Logs: $OUT/MODE-NAME.log; a RESULT line each; WALL lines on stdout.
set -u
M=/tmp/models/q06
OUT=${OUT:-/tmp/time_to_step}; mkdir -p "$OUT"
for run in "$@"; do  # every run named right before anything starts
  case $run in cold:* | warm:*) ;; *) echo "run $run: MODE must be cold or warm"; exit 2 ;; esac
done
python3 -c "import env_registry; env_registry.spec('molt/gsm8k-v1')" > /dev/null 2>&1 \
  || { echo "molt/gsm8k-v1 is not registered: install this project's wheel (.stage/whl, gpu/README.md)"; exit 2; }
[ -f $M/config.json ] || python3 benchmarks/gpu/shapes.py $M 0.6b > "$OUT/shapes.log" 2>&1 || exit 1
OURS="benchmarks/gpu/grpo_step_bench.py --model $M --compile --no-recompute --steps 3 --sync-reps 0 --max-num-seqs 256 --no-check"
begin=$(date +%s)
for run in "$@"; do
  mode=${run%%:*}; name=${run#*:}
  case $name in
    trl) cmd="benchmarks/gpu/trl_step_bench.py --model $M --steps 3" ;;
    ours) cmd="$OURS --engines 2" ;;
    fast) cmd="$OURS --engines 2 --no-vllm-compile --dynamic-first" ;;
    fast1) cmd="$OURS --engines 1 --no-vllm-compile --dynamic-first" ;;
    short) cmd="${OURS/--compile /} --engines 2 --no-vllm-compile" ;;
    *) echo "unknown run $run"; exit 2 ;;
  esac
  left=$((570 - $(date +%s) + begin))
  [ $left -gt 60 ] || { echo "SKIP $run: ${left}s left in the call"; continue; }
  [ "$mode" = cold ] && rm -rf ~/.cache/vllm /tmp/torchinductor_* ~/.triton/cache
  log="$OUT/$mode-$name.log"
  s=$(date +%s.%N)
  timeout $left python3 $cmd > "$log" 2>&1; rc=$?
  e=$(date +%s.%N)
  python3 -c "print(f'WALL $run {$e - $s:.1f}s rc=$rc')"
  grep -E "^step [0-9]|ready in|since start|engine [0-9.]+s|Graph capturing finished|torch.compile take|init engine|Traceback|Error" "$log" | cut -c1-300 | head -20
done
