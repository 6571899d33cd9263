#!/usr/bin/env bash
# Builds helm-unittest (github.com/helm-unittest/helm-unittest, a Go module: module proxy only) into a
# cache keyed by version outside git; a built binary is reused as is. Prints the binary's path. Its
# go.mod has a replace directive, so it is built as the main module from a copy of its module source.
# It renders with the Helm v3 library it embeds and runs charts/rtj-operator/tests/*_test.yaml.
set -euo pipefail
VERSION="${HELM_UNITTEST_VERSION:-v1.1.2}"
CACHE="${RTJ_KUBE_CACHE:-$HOME/.cache/rtj-kube}"
OUT="$CACHE/helm-unittest-$VERSION"
# One build at a time (two test lanes may ask at once): the second waits, then finds it built.
mkdir -p "$CACHE"; exec 9>"$CACHE/.lock-helm-unittest"; flock 9
if [[ -x "$OUT/bin/helm-unittest" ]]; then
  echo "$OUT/bin/helm-unittest"
  exit 0
fi
start=$SECONDS
echo "[helm-unittest-build $(date +%H:%M:%S)] building helm-unittest $VERSION" >&2
go mod download "github.com/helm-unittest/helm-unittest@$VERSION"
src="$(go env GOMODCACHE)/github.com/helm-unittest/helm-unittest@$VERSION"
work="$(mktemp -d)"
trap 'chmod -R u+w "$work"; rm -rf "$work"' EXIT
cp -r "$src/." "$work"
chmod -R u+w "$work"
mkdir -p "$OUT/bin"
(cd "$work" && go build -trimpath -ldflags "-s -w" -o "$OUT/bin/helm-unittest.tmp" ./cmd/helm-unittest)
mv "$OUT/bin/helm-unittest.tmp" "$OUT/bin/helm-unittest"   # last: a half-built cache never looks complete
echo "[helm-unittest-build $(date +%H:%M:%S)] done in $((SECONDS - start)) s" >&2
echo "$OUT/bin/helm-unittest"
