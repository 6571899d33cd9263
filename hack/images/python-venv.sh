#!/bin/sh
# Run inside the image build: make /opt/venv from the base image's Python, installing one with apt
# where the base has none (nvidia/cuda Ubuntu 24.04 images, the debootstrap base of hack/images/base.sh).
#   python-venv.sh PYTHON PIP_VERSION      e.g. python-venv.sh python3 25.3
set -eu
PYTHON=${1:-python3}
PIP_VERSION=${2:-}
if ! command -v "$PYTHON" >/dev/null || ! "$PYTHON" -c 'import ensurepip, venv' 2>/dev/null; then
    apt-get update
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "$PYTHON" "$PYTHON-venv" ca-certificates
    rm -rf /var/lib/apt/lists/*
fi
"$PYTHON" -m venv /opt/venv
if [ -n "$PIP_VERSION" ]; then
    sh "$(dirname "$0")/pip.sh" install --no-cache-dir --upgrade "pip==$PIP_VERSION"
fi
/opt/venv/bin/python -c 'import platform, sys; print("python", sys.version.split()[0], "glibc", platform.libc_ver()[1])'
