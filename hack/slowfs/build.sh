#!/usr/bin/env bash
# Builds slowfs (hack/slowfs/main.go: a FUSE volume with FSx-for-Lustre-like checkpoint timing, a
# simulation for tests) into a cache keyed by a hash of its sources, outside git, and prints the
# folder; a cached binary is reused as is, and an edit to main.go/go.mod/go.sum builds anew. The
# first build fetches go-fuse through the Go module proxy (go.sum pins it).
set -euo pipefail
SRC="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
KEY="$(cat "$SRC/main.go" "$SRC/go.mod" "$SRC/go.sum" | sha256sum | cut -c1-16)"
BIN="${RTJ_SLOWFS_CACHE:-$HOME/.cache/rtj-slowfs}/$KEY/bin"
# One build at a time (two test lanes may ask at once): the second waits, then finds it built.
mkdir -p "$BIN"; exec 9>"$BIN/../.lock"; flock 9
if [[ ! -x "$BIN/slowfs" ]]; then
  echo "[slowfs-build $(date +%H:%M:%S)] go build $SRC -> $BIN/slowfs" >&2
  (cd "$SRC" && go build -trimpath -o "$BIN/slowfs.tmp" .)
  mv "$BIN/slowfs.tmp" "$BIN/slowfs"
fi
echo "$BIN"
