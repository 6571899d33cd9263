"""The operator's client as deployed: from a kubeconfig (or in-cluster files), against the real API server."""

from __future__ import annotations

from rtj_operator.kube import Kube, configure


def test_a_kubeconfig_token_authenticates(cluster, monkeypatch, tmp_path):
    """The kubernetes package's loaders keep the token where its request code does not look; the
    operator's client must still send it (an anonymous request gets HTTP 401)."""
    kubeconfig = cluster.kubeconfig_for("rtj-system", "rtj-operator", tmp_path / "kubeconfig")
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    kube = Kube(configure())
    assert any(n["metadata"]["name"].startswith("p5-") for n in kube.list("Node"))
