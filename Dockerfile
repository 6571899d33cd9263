# syntax=docker/dockerfile:1.7
# Two images from one file:
#   docker build --target operator -t rtj-operator:0.1.0 .
#   docker build --target worker   -t rtj-worker:0.1.0 .
# (`make image`; needs a Docker engine, which CI does not have.)

ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm

# ---------------------------------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS base
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m pip install --upgrade pip==25.3
WORKDIR /src
COPY pyproject.toml README.md ./
COPY operator/ operator/
COPY worker/ worker/
COPY crds/ crds/

# ---------------------------------------------------------------------------------------------
FROM base AS operator
RUN pip install . && rm -rf /src
# Non-root with a read-only root filesystem (see charts/rtj-operator/values.yaml).
USER 65532:65532
EXPOSE 8080 9090
ENTRYPOINT ["rtj-operator"]
CMD ["--all-namespaces"]

# ---------------------------------------------------------------------------------------------
FROM base AS worker
# EFA: libfabric and the aws-ofi-nccl plugin let NCCL use the 32 EFA interfaces of a p5.48xlarge.
ARG EFA_INSTALLER_VERSION=1.43.2
RUN apt-get update \
 && apt-get install -y --no-install-recommends curl ca-certificates pciutils environment-modules \
 && curl -fsSL "https://efa-installer.amazonaws.com/aws-efa-installer-${EFA_INSTALLER_VERSION}.tar.gz" \
    | tar xz -C /tmp \
 && cd /tmp/aws-efa-installer && ./efa_installer.sh -y --skip-kmod --skip-limit-conf --no-verify \
 && rm -rf /tmp/aws-efa-installer /var/lib/apt/lists/*
ENV LD_LIBRARY_PATH=/opt/amazon/efa/lib:/opt/amazon/ofi-nccl/lib:${LD_LIBRARY_PATH} \
    FI_PROVIDER=efa NCCL_SOCKET_IFNAME=^lo,docker
# torch 2.13.0 from PyPI carries its CUDA runtime and NCCL; NVRx pinned to 0.4.1.
RUN pip install ".[worker]" && rm -rf /src
WORKDIR /workspace
ENTRYPOINT ["rtj-worker", "--"]
CMD ["python", "-m", "rtj_worker.train"]
