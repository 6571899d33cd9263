#!/usr/bin/env bash
# Builds the upstream control plane for the local cluster from Go modules (module proxy only):
# kube-apiserver, kube-controller-manager, kube-scheduler and etcd from this folder's go.mod,
# kwok and CoreDNS with `go install MODULE@VERSION`. Binaries go to a cache keyed by version,
# outside git; a complete cache is reused as is, so later runs take well under a second.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
K8S_VERSION="$(awk '$1=="k8s.io/kubernetes" && $2 ~ /^v/ {print $2; exit} $1=="require" && $2=="k8s.io/kubernetes" {print $3; exit}' "$here/go.mod")"
[[ -n "$K8S_VERSION" ]] || { echo "build.sh: no k8s.io/kubernetes version in $here/go.mod" >&2; exit 1; }
KWOK_VERSION="${KWOK_VERSION:-v0.8.0}"
# CoreDNS: hack/kube/coredns/ (its main names only the plugins the node agents use; go.mod pins the version).
COREDNS_VERSION="$(awk '$1=="require" && $2=="github.com/coredns/coredns" {print $3; exit}' "$here/coredns/go.mod")"
[[ -n "$COREDNS_VERSION" ]] || { echo "build.sh: no github.com/coredns/coredns version in $here/coredns/go.mod" >&2; exit 1; }
CACHE="${RTJ_KUBE_CACHE:-$HOME/.cache/rtj-kube}"
BIN="$CACHE/k8s-$K8S_VERSION-kwok-$KWOK_VERSION-coredns-$COREDNS_VERSION-min/bin"
NEED_GB="${RTJ_KUBE_NEED_GB:-6}"

# One build at a time (two test lanes may ask at once): the second waits, then finds it built.
mkdir -p "$CACHE"; exec 9>"$CACHE/.lock-kube"; flock 9

all=(kube-apiserver kube-controller-manager kube-scheduler etcd kwok coredns)
missing=()
for b in "${all[@]}"; do [[ -x "$BIN/$b" ]] || missing+=("$b"); done
if [[ ${#missing[@]} -eq 0 ]]; then
  echo "$BIN"
  exit 0
fi

# A cold build needs ~4 GB of Go module and build cache plus ~0.5 GB of binaries.
for d in "$(go env GOMODCACHE)" "$(go env GOCACHE)" "$CACHE"; do
  mkdir -p "$d"
  free_gb=$(( $(df -Pk "$d" | awk 'NR==2 {print $4}') / 1024 / 1024 ))
  if (( free_gb < NEED_GB )); then
    echo "build.sh: only ${free_gb} GB free under $d; building Kubernetes needs ${NEED_GB} GB (set RTJ_KUBE_CACHE/GOCACHE elsewhere)" >&2
    exit 1
  fi
done
mkdir -p "$BIN"
minor="${K8S_VERSION#v1.}"; minor="${minor%%.*}"
ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$K8S_VERSION \
 -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor \
 -X k8s.io/component-base/version.gitTreeState=clean"

step() { echo "[kube-build $(date +%H:%M:%S)] $*" >&2; }
cd "$here"
for b in "${missing[@]}"; do
  start=$SECONDS
  case "$b" in
    kube-*)
      step "building $b $K8S_VERSION (cold: several minutes on 2 cores)"
      go build -trimpath -ldflags "$ldflags" -o "$BIN/$b.tmp" "k8s.io/kubernetes/cmd/$b" ;;
    etcd)
      step "building etcd (the version $K8S_VERSION requires)"
      go build -trimpath -ldflags "-s -w" -o "$BIN/etcd.tmp" go.etcd.io/etcd/server/v3 ;;
    kwok)
      step "building kwok $KWOK_VERSION"
      GOBIN="$BIN/.gobin" go install -trimpath -ldflags "-s -w" "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION"
      mv "$BIN/.gobin/kwok" "$BIN/kwok.tmp" ;;
    coredns)
      step "building CoreDNS $COREDNS_VERSION (bind, errors, kubernetes: hack/kube/coredns)"
      (cd "$here/coredns" && go build -trimpath -ldflags "-s -w" -o "$BIN/coredns.tmp" .) ;;
  esac
  mv "$BIN/$b.tmp" "$BIN/$b"   # rename last: a half-written binary never looks complete
  step "$b done in $((SECONDS - start)) s"
done
rmdir "$BIN/.gobin" 2>/dev/null || true
echo "$BIN"
