# attnbench: `make run` runs the smoke sweep, `make test` runs the tests. Both set up .venv.
# Boxes with no index: `make wheelhouse` (here), `make gpu-install` (there), `make rehearsal` (CI).
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: run test test-slow selftest setup clean wheelhouse gpu-install rehearsal readers-only

# The box's Python (major.minor; empty: the lent H200's 3.12), the wheelhouse, the box's prefix,
# and distributions to leave out of the wheelhouse (WITHOUT=bokeh: no dashboards on the box).
PYTHON_VERSION ?=
WHEELHOUSE     ?= .whl
PREFIX         ?= /tmp/attnbench
WITHOUT        ?=
TEST_JOBS      ?= 2

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

# Exit 4 is findings (PyTorch's CPU flash backward: docs/findings.md), printed above the
# dashboard's path: the run worked. Failures (1) and errors still stop make.
run: $(STAMP)
	$(VENV)/bin/attnbench run sweeps/smoke.yaml || test $$? -eq 4

# Two test processes, a file to each (module fixtures are built once); TEST_JOBS=0 runs in one.
test: $(STAMP)
	$(PY) -m pytest -q -n $(TEST_JOBS) --dist loadfile

test-slow: $(STAMP)
	$(PY) -m pytest -q -m slow

selftest: $(STAMP)
	$(VENV)/bin/attnbench selftest

clean:
	rm -rf $(VENV) results

# Wheels for a box without an index: attnbench's own and what such a box lacks (dask,
# distributed, tornado, ...), for its Python; never torch, triton or CUDA's (attnbench/offline).
wheelhouse:
	$(PYTHON) -m attnbench.offline wheelhouse --out $(WHEELHOUSE) \
	  $(if $(PYTHON_VERSION),--python-version $(PYTHON_VERSION)) $(foreach n,$(WITHOUT),--without $(n))

# On the box, with its own python3: the wheelhouse into PREFIX with no index and no dependency
# resolution (torch and triton untouched), then a check; afterwards `export PYTHONPATH=$(PREFIX)`.
gpu-install:
	$(PYTHON) -m attnbench.offline install --wheelhouse $(WHEELHOUSE) --prefix $(PREFIX)

# CI, after `make test`: a fresh torch-only venv gets the wheelhouse offline and runs the check.
rehearsal:
	bash .ci/rehearsal

# A venv without torch, the readers' install line of docs/install.md, every reader run (CI).
readers-only:
	bash .ci/readers-only
