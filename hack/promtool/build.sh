#!/usr/bin/env bash
# Builds promtool from the Prometheus Go module (module proxy only) into a cache keyed by version,
# outside git, and prints the folder; a cached binary is reused as is. For `promtool test rules` on
# the chart's PrometheusRule (tests/cluster/test_alert_rules.py).
set -euo pipefail
VERSION="${PROMETHEUS_MODULE_VERSION:-v0.316.0}"   # the Go module's version of Prometheus 3.x
BIN="${RTJ_PROMTOOL_CACHE:-$HOME/.cache/rtj-promtool}/$VERSION/bin"
# One build at a time (two test lanes may ask at once): the second waits, then finds it built.
mkdir -p "$BIN"; exec 9>"$BIN/../.lock"; flock 9
if [[ ! -x "$BIN/promtool" ]]; then
  mkdir -p "$BIN"
  echo "[promtool-build $(date +%H:%M:%S)] go install github.com/prometheus/prometheus/cmd/promtool@$VERSION" >&2
  GOBIN="$BIN" go install "github.com/prometheus/prometheus/cmd/promtool@$VERSION"
fi
echo "$BIN"
