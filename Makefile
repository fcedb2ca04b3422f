# attnbench: `make run` runs the smoke sweep, `make test` runs the tests. Both set up .venv.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: run test test-slow selftest setup clean

$(STAMP): pyproject.toml
	# A torch that the system Python already has (a GPU box's own build) is reused.
	test -x $(PY) || { $(PYTHON) -c "import torch" 2>/dev/null \
	  && $(PYTHON) -m venv --system-site-packages $(VENV) || $(PYTHON) -m venv $(VENV); }
	$(PY) -m pip install --quiet --upgrade pip
	# torch: keep an importable one (GPU boxes bring their own); else the CPU build 2.13.0.
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install --quiet torch==2.13.0
	# Pin the torch and triton that are there, so pip never swaps a box's own build (2.x.0a0+nv).
	$(PY) -m pip list --format=freeze | grep -iE '^(torch|triton)==' > $(VENV)/keep.txt || true
	$(PY) -m pip install --quiet -e ".[test]" -c $(VENV)/keep.txt
	touch $(STAMP)

setup: $(STAMP)

run: $(STAMP)
	$(VENV)/bin/attnbench run sweeps/smoke.yaml

test: $(STAMP)
	$(PY) -m pytest -q

test-slow: $(STAMP)
	$(PY) -m pytest -q -m slow

selftest: $(STAMP)
	$(VENV)/bin/attnbench selftest

clean:
	rm -rf $(VENV) results
