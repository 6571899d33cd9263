"""Issue 30.3: what a real Prometheus stores after scraping the operator (the Prometheus server built from
its Go module by hack/promtool/build.sh, without service discovery), configured from the chart's own
ServiceMonitor: the per-job series keep the job's `namespace` (honorLabels), the scrape goes over HTTPS
with a bound ServiceAccount token the API server reviews (metrics.secure), and a scraper the chart's
metrics-reader role does not cover gets nothing.

What runs here in place of Prometheus Operator and Kubernetes service discovery, which cannot run on the
local control plane (kwok pods have no reachable address): the scrape job is written from the rendered
ServiceMonitor's endpoint (honorLabels, scheme, bearerTokenFile, tlsConfig) as Prometheus Operator
writes it, and the target is static, with the labels Prometheus Operator's relabelling gives a
ServiceMonitor target (namespace, service, pod, container, endpoint, job)."""

from __future__ import annotations

import json
import os
import subprocess
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from clusterkit import helm
from rtj_operator import metrics_server
from rtj_operator.kube import Kube, configure
from testkit import RELEASE, RELEASE_NS, ROOT, free_port, wait_until

PROMETHEUS = Path(os.environ.get("RTJ_PROMTOOL_BIN", Path.home() / ".cache" / "rtj-promtool" / "v0.316.0" / "bin")) \
    / "prometheus"
# The labels Prometheus Operator's relabelling gives a ServiceMonitor target (job: the Service's name).
TARGET_LABELS = {"namespace": RELEASE_NS, "service": f"{RELEASE}-metrics", "pod": f"{RELEASE}-5d4f8-x2x7q",
                 "container": "operator", "endpoint": "metrics"}
CHART_JOB = f"{RELEASE}-metrics"


def service_monitor(cluster: Any) -> dict[str, Any]:
    out = helm(cluster, "template", RELEASE, str(ROOT / "charts" / "rtj-operator"), "-n", RELEASE_NS,
               "--set", "metrics.serviceMonitor.enabled=true", "--show-only", "templates/servicemonitor.yaml")
    return yaml.safe_load(out)


def scrape_job(name: str, endpoint: dict[str, Any], target: str, token_file: Path, job: str) -> dict[str, Any]:
    """One ServiceMonitor endpoint as Prometheus Operator turns it into a scrape job (the fields the chart
    sets; the token file is the scraper's own, as a Prometheus pod mounts it)."""
    config: dict[str, Any] = {"job_name": name, "scrape_interval": "1s", "scrape_timeout": "1s",
                              "honor_labels": bool(endpoint.get("honorLabels")),
                              "scheme": endpoint.get("scheme", "http"),
                              "static_configs": [{"targets": [target], "labels": {**TARGET_LABELS, "job": job}}]}
    if endpoint.get("bearerTokenFile"):
        config["authorization"] = {"type": "Bearer", "credentials_file": str(token_file)}
    if tls := endpoint.get("tlsConfig"):
        config["tls_config"] = {"insecure_skip_verify": bool(tls.get("insecureSkipVerify"))}
    return config


def series(port: int, expr: str) -> list[dict[str, str]]:
    """The label sets of an instant query's result."""
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=5) as answer:
        return [r["metric"] for r in json.load(answer)["data"]["result"]]


def targets(port: int) -> dict[str, dict[str, Any]]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/targets", timeout=5) as answer:
        return {t["scrapePool"]: t for t in json.load(answer)["data"]["activeTargets"]}


def test_a_real_prometheus_keeps_each_jobs_namespace_and_scrapes_only_with_a_granted_token(
        cluster, ns, operator, operator_token, rtj, tmp_path):
    assert PROMETHEUS.exists(), f"{PROMETHEUS}: run `bash hack/promtool/build.sh` (make cluster does)"
    [endpoint] = service_monitor(cluster)["spec"]["endpoints"]
    assert endpoint["scheme"] == "https"
    rtj.create()
    rtj.wait_running()

    # Scrapers: one bound to the chart's metrics-reader ClusterRole, one not.
    tokens = {}
    for name in ("prometheus", "stranger"):
        cluster.api("POST", f"/api/v1/namespaces/{ns}/serviceaccounts",
                    {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name}})
        tokens[name] = tmp_path / f"{name}.token"
        tokens[name].write_text(cluster.service_account_token(ns, name, seconds=600))
    bindings = "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings"
    binding = f"{ns}-prometheus"[:63]
    cluster.api("POST", bindings, {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": binding},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                    "name": f"{RELEASE}-metrics-reader"},
        "subjects": [{"kind": "ServiceAccount", "name": "prometheus", "namespace": ns}]})

    # The operator's endpoint as the chart runs it: HTTPS, reviews made as the chart's ServiceAccount.
    as_operator = Kube(configure(cluster.server, token=operator_token, ca_file=str(cluster.ca_file)))
    metrics_port, prom_port = free_port(), free_port()
    server, thread = metrics_server.serve(metrics_port, metrics_server.Reviewer(as_operator),
                                          metrics_server.Certificates(), addr="127.0.0.1")
    target = f"127.0.0.1:{metrics_port}"
    jobs = [scrape_job("chart", endpoint, target, tokens["prometheus"], CHART_JOB),
            # The same without honorLabels: what Prometheus Operator makes of a ServiceMonitor that lacks it.
            scrape_job("no-honor-labels", {**endpoint, "honorLabels": False}, target, tokens["prometheus"],
                       "no-honor-labels"),
            scrape_job("stranger", endpoint, target, tokens["stranger"], "stranger")]
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump({"scrape_configs": jobs}))
    log = (tmp_path / "prometheus.log").open("wb")
    prometheus = subprocess.Popen(
        [str(PROMETHEUS), f"--config.file={tmp_path / 'prometheus.yml'}", f"--storage.tsdb.path={tmp_path / 'data'}",
         f"--web.listen-address=127.0.0.1:{prom_port}", "--log.level=warn"],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        def scraped() -> bool:
            assert prometheus.poll() is None, (tmp_path / "prometheus.log").read_text()[-3000:]
            try:
                pools = targets(prom_port)
            except OSError:  # not listening yet
                return False
            return all(pools.get(job["job_name"], {}).get("lastScrape", "0001").startswith("0001") is False
                       for job in jobs)
        wait_until(scraped, timeout=60, what="every scrape job has scraped")
        # This test's job: the registry is the process's, which other tests' jobs (also named train) share.
        running = f'name="{rtj.name}",phase="Running"'
        wait_until(lambda: series(prom_port, f'rtj_job_phase{{job="{CHART_JOB}",namespace="{ns}",{running}}}'),
                   timeout=30, what="the job's series stored")

        pools = targets(prom_port)
        assert pools["chart"]["health"] == "up", pools["chart"]
        # A scraper the metrics-reader role does not cover is refused, and stores nothing but `up`.
        assert pools["stranger"]["health"] == "down" and "403" in pools["stranger"]["lastError"], pools["stranger"]
        assert not series(prom_port, 'rtj_leader{job="stranger"}')

        # The chart's scrape: a job's series carry its own namespace; the operator's own carry the target's.
        assert [m.get("exported_namespace") for m in series(
            prom_port, f'rtj_job_phase{{job="{CHART_JOB}",namespace="{ns}",{running}}}')] == [None]
        assert not series(prom_port, f'{{job="{CHART_JOB}",exported_namespace!=""}}')
        assert [m["namespace"] for m in series(prom_port, f'rtj_leader{{job="{CHART_JOB}"}}')] == [RELEASE_NS]
        # Without honorLabels the target's namespace wins and the job's is renamed: the bug the chart avoids.
        assert [m["namespace"] for m in series(
            prom_port, f'rtj_job_phase{{job="no-honor-labels",exported_namespace="{ns}",{running}}}')] == [RELEASE_NS]
        assert not series(prom_port, f'rtj_job_phase{{job="no-honor-labels",namespace="{ns}"}}')
    finally:
        prometheus.terminate()
        prometheus.wait(30)
        log.close()
        server.shutdown()
        thread.join(5)
        cluster.api("DELETE", f"{bindings}/{binding}", missing_ok=True)
