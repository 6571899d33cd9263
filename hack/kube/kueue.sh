#!/usr/bin/env bash
# Builds Kueue's controller manager from its Go module (module proxy only) and copies the manifests the
# module ships (CRDs, webhook configurations) next to it, in a cache keyed by version outside git; a
# complete cache is reused as is. Prints the cache folder: bin/kueue, crd/*.yaml, webhook/manifests.yaml.
# Cold: about 4.5 minutes on 2 cores.
set -euo pipefail
KUEUE_VERSION="${KUEUE_VERSION:-v0.17.0}"
CACHE="${RTJ_KUBE_CACHE:-$HOME/.cache/rtj-kube}"
OUT="$CACHE/kueue-$KUEUE_VERSION"
# One build at a time (two test lanes may ask at once): the second waits, then finds it built.
mkdir -p "$CACHE"; exec 9>"$CACHE/.lock-kueue"; flock 9
if [[ -x "$OUT/bin/kueue" && -f "$OUT/webhook/manifests.yaml" ]]; then
  echo "$OUT"
  exit 0
fi
step() { echo "[kueue-build $(date +%H:%M:%S)] $*" >&2; }
start=$SECONDS
mkdir -p "$OUT/bin" "$OUT/crd" "$OUT/webhook"
step "building kueue $KUEUE_VERSION (cold: several minutes on 2 cores)"
GOBIN="$OUT/.gobin" go install -trimpath -ldflags "-s -w" "sigs.k8s.io/kueue/cmd/kueue@$KUEUE_VERSION"
src="$(go env GOMODCACHE)/sigs.k8s.io/kueue@$KUEUE_VERSION/config/components"
cp "$src"/crd/bases/*.yaml "$OUT/crd/"
cp "$src/webhook/manifests.yaml" "$OUT/webhook/manifests.yaml.tmp"
mv "$OUT/webhook/manifests.yaml.tmp" "$OUT/webhook/manifests.yaml"
mv "$OUT/.gobin/kueue" "$OUT/bin/kueue"   # last: a half-built cache never looks complete
rmdir "$OUT/.gobin" 2>/dev/null || true
step "kueue done in $((SECONDS - start)) s"
echo "$OUT"
