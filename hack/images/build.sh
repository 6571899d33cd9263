#!/usr/bin/env bash
# Build both images of the Dockerfile without any image registry, and smoke-test them (`make images`).
#
# 1. a Docker engine: installs Debian's docker.io if there is no dockerd, starts
#    `dockerd --iptables=false --bridge=none` if none answers (and stops it on exit);
# 2. a base image made locally: hack/images/base.sh (debootstrap + docker import);
# 3. `--target operator` and `--target worker` FROM that base, BuildKit, `--network host`,
#    the EFA installer off, NVRx 0.4.1 (Debian 12's glibc 2.36 cannot run NVRx >= 0.6 wheels);
# 4. smoke tests: the operator starts (as 65532 on a read-only root) and serves its liveness
#    endpoint, `rtj-worker --help`, and one real CPU training run through rtj-worker -> ft_launcher.
#
# Run it again: Docker's layer cache (and the pip cache mount) make the second run quick.
# Environment: BASE_SUITE (bookworm), NVRX_VERSION (0.4.1), TAG (dev), SKIP_WORKER=1, LOGDIR,
# DOCKER_DATA_ROOT (where a dockerd started here keeps images; default /var/lib/docker).
set -euo pipefail
cd "$(dirname "$0")/../.."

BASE_SUITE=${BASE_SUITE:-bookworm}
NVRX_VERSION=${NVRX_VERSION:-0.4.1}
TAG=${TAG:-dev}
OPERATOR_IMAGE=rtj-operator:$TAG
WORKER_IMAGE=rtj-worker:$TAG
LOGDIR=${LOGDIR:-/tmp/rtj-images}
mkdir -p "$LOGDIR"

T0=$(date +%s)
TIMES=()
phase_start=$T0
phase() {  # phase NAME: record the seconds since the previous phase
    local now; now=$(date +%s)
    TIMES+=("$(printf '%-28s %5ds' "$1" $((now - phase_start)))")
    phase_start=$now
}
log() { printf '\n==> %s\n' "$*"; }

# --- 1. engine ------------------------------------------------------------------------------
if ! command -v dockerd >/dev/null; then
    log "installing docker.io (Debian's engine)"
    if [[ $(id -u) != 0 ]]; then echo "need root to install docker.io" >&2; exit 1; fi
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io >/dev/null
fi
# The CLI that comes with the engine (another `docker` earlier in PATH may want buildx for BuildKit).
if [[ -x /usr/bin/docker ]]; then DOCKER=/usr/bin/docker; else DOCKER=docker; fi
export DOCKER DOCKER_BUILDKIT=1
phase "engine installed"

DOCKERD_PID=
CONTAINERS=()
cleanup() {
    local rc=$?
    for c in "${CONTAINERS[@]}"; do $DOCKER rm -f "$c" >/dev/null 2>&1 || true; done
    if [[ -n $DOCKERD_PID ]]; then
        echo "stopping the dockerd started here (pid $DOCKERD_PID)"
        kill "$DOCKERD_PID" 2>/dev/null || true
        for _ in $(seq 60); do kill -0 "$DOCKERD_PID" 2>/dev/null || break; sleep 0.5; done
        kill -9 "$DOCKERD_PID" 2>/dev/null || true
        wait "$DOCKERD_PID" 2>/dev/null || true
    fi
    exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

if ! $DOCKER info >/dev/null 2>&1; then
    log "starting dockerd (log: $LOGDIR/dockerd.log)"
    dockerd --iptables=false --bridge=none ${DOCKER_DATA_ROOT:+--data-root "$DOCKER_DATA_ROOT"} \
        >"$LOGDIR/dockerd.log" 2>&1 &
    DOCKERD_PID=$!
    for _ in $(seq 120); do
        $DOCKER info >/dev/null 2>&1 && break
        kill -0 "$DOCKERD_PID" 2>/dev/null || { tail -20 "$LOGDIR/dockerd.log"; exit 1; }
        sleep 0.5
    done
    $DOCKER info >/dev/null
fi
echo "engine $($DOCKER version --format '{{.Server.Version}}'), storage driver $($DOCKER info --format '{{.Driver}}')"
phase "engine running"

# --- 2. base ----------------------------------------------------------------------------------
log "base image ($BASE_SUITE)"
BASE=$(hack/images/base.sh "$BASE_SUITE" 2>"$LOGDIR/base.log") || { tail -20 "$LOGDIR/base.log"; exit 1; }
tail -1 "$LOGDIR/base.log"
phase "base image ($BASE)"

# --- 3. images --------------------------------------------------------------------------------
# pip in the build trusts this machine's CA bundle (a TLS-intercepting proxy in CI), as a BuildKit
# secret: it is not written into any layer.
CA_BUNDLE=${PIP_CERT:-${REQUESTS_CA_BUNDLE:-${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}}}
SECRET=()
[[ -s $CA_BUNDLE ]] && SECRET=(--secret "id=pip-ca,src=$CA_BUNDLE")
build() {  # build TARGET IMAGE ARGS...
    local target=$1 image=$2; shift 2
    log "docker build --target $target -> $image (log: $LOGDIR/build-$target.log)"
    if ! $DOCKER build --network host --progress plain "${SECRET[@]}" --target "$target" -t "$image" "$@" . \
            >"$LOGDIR/build-$target.log" 2>&1; then
        tail -40 "$LOGDIR/build-$target.log"
        exit 1
    fi
    grep -E '^#[0-9]+ (CACHED|DONE)' "$LOGDIR/build-$target.log" | awk '{print $2}' | sort | uniq -c \
        | awk '{printf "  %s steps %s\n", $1, $2}'
}
build operator "$OPERATOR_IMAGE" --build-arg OPERATOR_BASE="$BASE"
phase "build operator"
if [[ -z ${SKIP_WORKER:-} ]]; then
    build worker "$WORKER_IMAGE" --build-arg WORKER_BASE="$BASE" --build-arg NVRX_VERSION="$NVRX_VERSION" \
        --build-arg INSTALL_EFA=0
    phase "build worker"
fi

# --- 4. smoke tests ---------------------------------------------------------------------------
log "operator: --help"
$DOCKER run --rm --network none --read-only "$OPERATOR_IMAGE" --help | sed -n 1,3p
log "operator: starts as 65532 on a read-only root and serves /healthz"
# No cluster here: the operator is pointed at a closed port; it must still start kopf, log and
# serve its liveness endpoint (the Deployment's probe), which shows the image is complete.
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
NAME=rtj-smoke-operator-$$
CONTAINERS+=("$NAME")
$DOCKER run -d --name "$NAME" --network host --read-only --cap-drop ALL --security-opt no-new-privileges \
    "$OPERATOR_IMAGE" --server http://127.0.0.1:9 --metrics-port 0 \
    --liveness "http://127.0.0.1:$PORT/healthz" >/dev/null
ok=
for _ in $(seq 60); do
    if python3 -c "import urllib.request as u; u.urlopen('http://127.0.0.1:$PORT/healthz', timeout=2)" 2>/dev/null; then
        ok=1; break
    fi
    [[ $($DOCKER inspect -f '{{.State.Running}}' "$NAME") == true ]] || break
    sleep 1
done
echo "user: $($DOCKER exec "$NAME" id -u) (running: $($DOCKER inspect -f '{{.State.Running}}' "$NAME"))"
$DOCKER logs "$NAME" 2>&1 | sed -n 1,5p
if [[ -z $ok ]]; then echo "FAIL: the operator did not serve /healthz" >&2; $DOCKER logs "$NAME" 2>&1 | tail -n 30; exit 1; fi
echo "GET /healthz: OK"
$DOCKER rm -f "$NAME" >/dev/null
phase "smoke operator"

if [[ -z ${SKIP_WORKER:-} ]]; then
    log "worker: versions"
    $DOCKER run --rm --network none --entrypoint python "$WORKER_IMAGE" -c '
import importlib.metadata as m, platform, sys
import torch, nvidia_resiliency_ext, rtj_worker.entrypoint, rtj_worker.train
print("python", sys.version.split()[0], "glibc", platform.libc_ver()[1], "torch", torch.__version__,
      "nvidia-resiliency-ext", m.version("nvidia-resiliency-ext"))' 2>&1 | grep -v -i pynvml
    log "worker: rtj-worker --help"
    set +e
    $DOCKER run --rm --network none --entrypoint rtj-worker "$WORKER_IMAGE" --help >"$LOGDIR/worker-help.log" 2>&1
    rc=$?
    set -e
    grep -v -i pynvml "$LOGDIR/worker-help.log" | tail -5
    case $rc in
        0) echo "rtj-worker --help: exit 0" ;;
        *) echo "FAIL: rtj-worker --help exited $rc" >&2; exit 1 ;;
    esac
    log "worker: a CPU training run: rtj-worker -- python -m rtj_worker.train (1 node, 2 ranks)"
    NAME=rtj-smoke-worker-$$
    CONTAINERS+=("$NAME")
    set +e
    # As in a pod: the hostname resolves (gloo looks it up; unresolvable, the ranks hang on DNS).
    timeout 300 $DOCKER run --name "$NAME" --network none --hostname rtj-smoke-0 --add-host rtj-smoke-0:127.0.0.1 \
        -e NNODES=1 -e RTJ_NNODES=1:1 -e NPROC_PER_NODE=2 -e NODE_RANK=0 \
        -e RTJ_RDZV_ENDPOINT=127.0.0.1:29500 -e RTJ_RDZV_ID=smoke -e RTJ_RDZV_TIMEOUT=60 \
        -e RTJ_FT_MAX_RESTARTS=1 -e RTJ_FT_HEARTBEAT_TIMEOUT=30 -e RTJ_FT_INITIAL_HEARTBEAT_TIMEOUT=60 \
        -e RTJ_FT_MONITOR_INTERVAL=1 -e RTJ_CHECKPOINT_DIR=/workspace/ckpt -e RTJ_CHECKPOINT_INTERVAL=5 \
        -e RTJ_EVENT_LOG=/workspace/events.jsonl -e RTJ_TERMINATION_LOG=/workspace/termination-log \
        -e TORCH_CPP_LOG_LEVEL=ERROR \
        "$WORKER_IMAGE" python -m rtj_worker.train --steps 10 --model-dim 32 --layers 2 --batch 8 \
        >"$LOGDIR/worker-train.log" 2>&1
    rc=$?
    set -e
    report=$($DOCKER cp "$NAME:/workspace/termination-log" - 2>/dev/null | tar xO 2>/dev/null || true)
    $DOCKER rm -f "$NAME" >/dev/null
    grep -E 'training finished' "$LOGDIR/worker-train.log" | sed -n 1,2p
    echo "exit $rc, termination log: ${report:-none} (log: $LOGDIR/worker-train.log)"
    if [[ $rc != 0 ]]; then tail -30 "$LOGDIR/worker-train.log"; echo "FAIL: training run" >&2; exit 1; fi
    phase "smoke worker"
fi

# --- report -----------------------------------------------------------------------------------
log "images"
$DOCKER image ls --format '{{.Repository}}:{{.Tag}} {{.Size}}' | grep -E "^(rtj-base:$BASE_SUITE|rtj-operator:$TAG|rtj-worker:$TAG) "
log "timings"
printf '%s\n' "${TIMES[@]}"
printf '%-28s %5ds\n' total $(( $(date +%s) - T0 ))
