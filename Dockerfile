# Two images from one file (BuildKit: DOCKER_BUILDKIT=1 or buildx; no `# syntax=` line, so that
# the builder's own Dockerfile frontend is used and nothing is pulled from a registry):
#   docker build --network host --target operator -t rtj-operator:0.1.0 .
#   docker build --network host --target worker   -t rtj-worker:0.1.0 .
# `make images` (hack/images/build.sh) builds both FROM a local debootstrap base, without any image
# registry, and smoke-tests them; see "Images" in README.md.
#
# Build arguments (defaults are the production images):
#   OPERATOR_BASE   any Debian/Ubuntu image; Python comes from the image or from apt
#   WORKER_BASE     CUDA on Ubuntu 24.04: glibc 2.39 and Python 3.12, which NVRx >= 0.6 wheels need
#                   (an NGC PyTorch base works too; its torch is replaced by the pinned one)
#   NVRX_VERSION    nvidia-resiliency-ext for the worker; replaces pyproject.toml's pin. 0.6.x needs
#                   glibc >= 2.39 and Python 3.10-3.12; 0.4.1 runs on Debian 12 (glibc 2.36, Python 3.11)
#   INSTALL_EFA     1: download and run the AWS EFA installer (internet); 0 in CI
#   PYTHON          the interpreter to make /opt/venv with (installed with apt if the base lacks it)
# CI: OPERATOR_BASE=WORKER_BASE=rtj-base:bookworm NVRX_VERSION=0.4.1 INSTALL_EFA=0.

ARG OPERATOR_BASE=python:3.11.14-slim-bookworm
ARG WORKER_BASE=nvcr.io/nvidia/cuda:13.0.2-runtime-ubuntu24.04
ARG PYTHON=python3
ARG PIP_VERSION=25.3

# ---------------------------------------------------------------------------------------------
FROM ${OPERATOR_BASE} AS operator
ARG PYTHON
ARG PIP_VERSION
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PATH=/opt/venv/bin:$PATH
COPY hack/images/python-venv.sh hack/images/pip.sh hack/images/requirements.py /opt/rtj-build/
RUN --mount=type=secret,id=pip-ca sh /opt/rtj-build/python-venv.sh "$PYTHON" "$PIP_VERSION"
# Dependencies first (this layer is rebuilt only when pyproject.toml changes), then the code.
COPY pyproject.toml /opt/rtj-build/
RUN --mount=type=cache,target=/root/.cache/pip,sharing=locked --mount=type=secret,id=pip-ca \
    python /opt/rtj-build/requirements.py /opt/rtj-build/pyproject.toml > /opt/rtj-build/requirements.txt \
 && sh /opt/rtj-build/pip.sh install -r /opt/rtj-build/requirements.txt
WORKDIR /src
COPY pyproject.toml README.md ./
COPY operator/ operator/
COPY worker/ worker/
COPY crds/ crds/
RUN --mount=type=cache,target=/root/.cache/pip,sharing=locked --mount=type=secret,id=pip-ca \
    sh /opt/rtj-build/pip.sh install --no-deps . && pip check && cd / && rm -rf /src /opt/rtj-build
WORKDIR /
# Non-root with a read-only root filesystem (see charts/rtj-operator/values.yaml). The uid needs a
# passwd entry: kopf names its peering identity with getpass.getuser(), which fails without one.
RUN groupadd -g 65532 rtj && useradd -u 65532 -g 65532 -M -d /nonexistent -s /usr/sbin/nologin rtj
USER 65532:65532
EXPOSE 8080 9090
ENTRYPOINT ["rtj-operator"]
CMD ["--all-namespaces"]

# ---------------------------------------------------------------------------------------------
FROM ${WORKER_BASE} AS worker
ARG PYTHON
ARG PIP_VERSION
# EFA: libfabric and the aws-ofi-nccl plugin let NCCL use the 32 EFA interfaces of a p5.48xlarge.
# The installer comes from the internet and supports Ubuntu/Amazon Linux, not Debian: off in CI.
ARG INSTALL_EFA=1
ARG EFA_INSTALLER_VERSION=1.43.2
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PATH=/opt/venv/bin:$PATH
# Recent installers put aws-ofi-nccl under lib/x86_64-linux-gnu/: linked into lib/, where the library path
# and NCCL_TUNER_PLUGIN look, and the build fails if NCCL's net plugin is not there (NCCL would otherwise
# fall back to TCP sockets without an error).
RUN if [ "$INSTALL_EFA" = 1 ]; then \
        apt-get update \
     && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
            curl ca-certificates pciutils environment-modules \
     && curl -fsSL "https://efa-installer.amazonaws.com/aws-efa-installer-${EFA_INSTALLER_VERSION}.tar.gz" \
        | tar xz -C /tmp \
     && cd /tmp/aws-efa-installer && ./efa_installer.sh -y --skip-kmod --skip-limit-conf --no-verify \
     && rm -rf /tmp/aws-efa-installer /var/lib/apt/lists/* \
     && if [ -d /opt/amazon/ofi-nccl/lib/x86_64-linux-gnu ]; then \
            ln -sf /opt/amazon/ofi-nccl/lib/x86_64-linux-gnu/*.so* /opt/amazon/ofi-nccl/lib/; fi \
     && ls /opt/amazon/ofi-nccl/lib/libnccl-net*.so /opt/amazon/ofi-nccl/lib/libnccl-ofi-tuner.so; \
    else echo "INSTALL_EFA=$INSTALL_EFA: EFA installer skipped"; fi
ENV LD_LIBRARY_PATH=/opt/amazon/efa/lib:/opt/amazon/ofi-nccl/lib:/opt/amazon/ofi-nccl/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH} \
    FI_PROVIDER=efa NCCL_SOCKET_IFNAME=^lo,docker
COPY hack/images/python-venv.sh hack/images/pip.sh hack/images/requirements.py /opt/rtj-build/
RUN --mount=type=secret,id=pip-ca sh /opt/rtj-build/python-venv.sh "$PYTHON" "$PIP_VERSION"
# torch from PyPI carries its CUDA runtime and NCCL (pyproject.toml's `worker` extra); NVRx is
# NVRX_VERSION (declared here so that the layers above are shared by every version). The pip cache
# mount keeps the ~3 GB of wheels across rebuilds where the index's responses may be cached.
ARG NVRX_VERSION=0.6.0
COPY pyproject.toml /opt/rtj-build/
RUN --mount=type=cache,target=/root/.cache/pip,sharing=locked --mount=type=secret,id=pip-ca \
    python /opt/rtj-build/requirements.py /opt/rtj-build/pyproject.toml worker \
        --nvrx "$NVRX_VERSION" --check-glibc > /opt/rtj-build/requirements.txt \
 && sh /opt/rtj-build/pip.sh install -r /opt/rtj-build/requirements.txt
WORKDIR /src
COPY pyproject.toml README.md ./
COPY operator/ operator/
COPY worker/ worker/
COPY crds/ crds/
RUN --mount=type=cache,target=/root/.cache/pip,sharing=locked --mount=type=secret,id=pip-ca \
    sh /opt/rtj-build/pip.sh install --no-deps . && cd / && rm -rf /src /opt/rtj-build
LABEL dev.rtj.nvidia-resiliency-ext="${NVRX_VERSION}" dev.rtj.efa="${INSTALL_EFA}"
WORKDIR /workspace
ENTRYPOINT ["rtj-worker", "--"]
CMD ["python", "-m", "rtj_worker.train"]
