#!/usr/bin/env bash
# Builds promtool and the Prometheus server from the Prometheus Go module (module proxy only) into a
# cache keyed by version, outside git, and prints the folder; cached binaries are reused as they are.
# promtool: `promtool test rules` on the chart's PrometheusRule (tests/unit/test_alert_rules.py).
# prometheus: a real scrape of the operator's metrics endpoint as the chart's ServiceMonitor configures
# it (tests/cluster/test_prometheus_scrape.py); built without its service-discovery plugins
# (`remove_all_sd`: static targets only), which keeps the build to about a minute after promtool's.
set -euo pipefail
VERSION="${PROMETHEUS_MODULE_VERSION:-v0.316.0}"   # the Go module's version of Prometheus 3.x
BIN="${RTJ_PROMTOOL_CACHE:-$HOME/.cache/rtj-promtool}/$VERSION/bin"
# One build at a time (two test lanes may ask at once): the second waits, then finds it built.
mkdir -p "$BIN"; exec 9>"$BIN/../.lock"; flock 9
ldflags="-s -w -X github.com/prometheus/common/version.Version=$VERSION"
if [[ ! -x "$BIN/promtool" ]]; then
  echo "[promtool-build $(date +%H:%M:%S)] go install github.com/prometheus/prometheus/cmd/promtool@$VERSION" >&2
  GOBIN="$BIN" go install -trimpath -ldflags "$ldflags" "github.com/prometheus/prometheus/cmd/promtool@$VERSION"
fi
if [[ ! -x "$BIN/prometheus" ]]; then
  echo "[promtool-build $(date +%H:%M:%S)] go install -tags remove_all_sd github.com/prometheus/prometheus/cmd/prometheus@$VERSION" >&2
  GOBIN="$BIN/.tmp" go install -trimpath -tags remove_all_sd -ldflags "$ldflags" \
    "github.com/prometheus/prometheus/cmd/prometheus@$VERSION"
  mv "$BIN/.tmp/prometheus" "$BIN/prometheus"   # last: a half-written binary never looks complete
  rmdir "$BIN/.tmp"
fi
echo "$BIN"
