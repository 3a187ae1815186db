# The README's commands. `make test` and `make demo` build .venv themselves.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export KERAS_BACKEND := tensorflow
export TF_CPP_MIN_LOG_LEVEL := 2

.PHONY: install test demo bench clean

$(STAMP): setup.py txl_tf/__init__.py  # the version lives in txl_tf/__init__.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[test]"
	touch $(STAMP)

install: $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -n 2 --dist loadscope --no-loadscope-reorder --durations=15 tests

demo: $(STAMP)
	$(PY) -m training.demo

bench: $(STAMP)
	$(PY) -m benchmarks.inference --preset=small --batch_sizes=1,16 --iters=100 \
		--output=benchmarks/results/inference.json
	$(PY) -m benchmarks.memory_worth --budget_s=480  # 480 s per seed, 3 seeds

clean:
	rm -rf $(VENV) build *.egg-info
