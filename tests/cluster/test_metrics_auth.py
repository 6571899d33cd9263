"""Issue 30.3: the operator's metrics endpoint as the chart runs it (metrics.secure, the default), each
scrape's token reviewed by the real API server (TokenReview, SubjectAccessReview) through a client of the
chart's ServiceAccount, so the chart's grants are what is tested; scrapers are ServiceAccounts with
bound tokens, as a Prometheus pod's is. The guard's own logic without an API server is
tests/unit/test_metrics_server.py's."""

from __future__ import annotations

import http.client
import ssl

from rtj_operator import metrics_server
from rtj_operator.kube import Kube, configure
from testkit import RELEASE, free_port, wait_until

READER_ROLE = f"{RELEASE}-metrics-reader"  # the chart's fullname is the release's name (it holds the chart's)


def scrape(port: int, token: str | None) -> tuple[int, str]:
    conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=10, context=ssl._create_unverified_context())
    conn.request("GET", "/metrics", headers={"Authorization": f"Bearer {token}"} if token else {})
    answer = conn.getresponse()
    out = answer.status, answer.read().decode()
    conn.close()
    return out


def test_a_scrape_needs_a_token_the_api_server_authorizes_for_metrics(cluster, ns, operator_token):
    assert cluster.api("GET", f"/apis/rbac.authorization.k8s.io/v1/clusterroles/{READER_ROLE}")["rules"] == [
        {"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]
    for name in ("prometheus", "nosy"):
        cluster.api("POST", f"/api/v1/namespaces/{ns}/serviceaccounts",
                    {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name}})
    binding = "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings"

    def bind(account: str) -> str:
        name = f"{ns}-{account}"[:63]
        cluster.api("POST", binding, {
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": READER_ROLE},
            "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": ns}]})
        return name

    bound = [bind("prometheus")]
    as_operator = Kube(configure(cluster.server, token=operator_token, ca_file=str(cluster.ca_file)))
    port = free_port()
    server, thread = metrics_server.serve(port, metrics_server.Reviewer(as_operator, deny_ttl=1.0),
                                          metrics_server.Certificates(), addr="127.0.0.1")
    try:
        reader = cluster.service_account_token(ns, "prometheus", seconds=600)
        code, text = scrape(port, reader)
        assert code == 200 and "rtj_leader" in text, (code, text)

        nosy = cluster.service_account_token(ns, "nosy", seconds=600)
        code, text = scrape(port, nosy)
        assert code == 403 and "rtj_leader" not in text, (code, text)
        assert scrape(port, None)[0] == 401
        assert scrape(port, reader[:-4] + "AAAA")[0] == 401  # a bound token whose signature does not verify
        # The cluster admin's token is no ServiceAccount's, and still goes through the same review.
        assert scrape(port, cluster.admin_token)[0] == 200

        # A binding made after a refusal takes effect once the refusal's short cache ends.
        bound.append(bind("nosy"))
        wait_until(lambda: scrape(port, nosy)[0] == 200, timeout=30, what="nosy's scrape allowed once bound")
        # A deleted ServiceAccount's token is refused (the TokenReview checks it still exists, from the API
        # server's informer: a moment later) once the allowed decision's cache ends (a new Reviewer here).
        cluster.api("DELETE", f"/api/v1/namespaces/{ns}/serviceaccounts/nosy")
        wait_until(lambda: metrics_server.Reviewer(as_operator).review(nosy).status == 401, timeout=30,
                   what="the deleted ServiceAccount's token refused")
    finally:
        server.shutdown()
        thread.join(5)
        for name in bound:
            cluster.api("DELETE", f"{binding}/{name}", missing_ok=True)
