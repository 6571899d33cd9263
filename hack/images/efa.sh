#!/usr/bin/env bash
# The production worker image with EFA (`make images-efa`): the Dockerfile's worker target on its CUDA
# base with INSTALL_EFA=1, then, inside the built image, `python -m rtj_worker.requirements efa`: the
# aws-ofi-nccl net plugin is on the library path, loads as NCCL loads it (dlopen, its libfabric resolved),
# and offers the network the pods select (NCCL_NET="AWS Libfabric"), so NCCL on p5 cannot fall back to
# TCP sockets quietly.
#
# Needs what CI's machine does not have: a registry for WORKER_BASE (nvcr.io by default) and
# efa-installer.amazonaws.com. Run it on a build host with that network (docs/images.md).
# Environment: TAG (efa), NVRX_VERSION (0.6.0), WORKER_BASE, EFA_INSTALLER_VERSION, DOCKER (docker).
set -euo pipefail
cd "$(dirname "$0")/../.."
DOCKER=${DOCKER:-docker}
IMAGE=rtj-worker:${TAG:-efa}
args=(--target worker --build-arg INSTALL_EFA=1 --build-arg "NVRX_VERSION=${NVRX_VERSION:-0.6.0}" -t "$IMAGE")
[[ -n ${WORKER_BASE:-} ]] && args+=(--build-arg "WORKER_BASE=$WORKER_BASE")
[[ -n ${EFA_INSTALLER_VERSION:-} ]] && args+=(--build-arg "EFA_INSTALLER_VERSION=$EFA_INSTALLER_VERSION")
DOCKER_BUILDKIT=1 "$DOCKER" build "${args[@]}" .
# No GPU or EFA device is needed to load the plugin: the check reads the library, not the hardware.
"$DOCKER" run --rm --entrypoint python "$IMAGE" -m rtj_worker.requirements efa
echo "$IMAGE: NCCL's EFA net plugin loads and offers the network the pods select"
