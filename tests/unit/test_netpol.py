"""The node agents' NetworkPolicy stand-in (hack/rtj_dev/netpol.py): which sources and ports a node admits,
from the policies that select its pods, and the iptables rules that say so. The e2e tier runs it against a
job's real traffic and a pod outside the job."""

from __future__ import annotations

from typing import Any

import pytest

from rtj_dev.netpol import Allow, iptables_rules, node_ingress, selects
from rtj_operator.builders import build_network_policy
from rtj_operator.spec import RTJ
from testkit import rtj_body


def pod(name: str, ns: str, ip: str, **labels: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": ns, "labels": labels}, "status": {"podIP": ip}}


@pytest.mark.parametrize("selector, labels, expect", [
    ({}, {"a": "1"}, True),
    (None, {"a": "1"}, False),
    ({"matchLabels": {"a": "1"}}, {"a": "1", "b": "2"}, True),
    ({"matchLabels": {"a": "2"}}, {"a": "1"}, False),
    ({"matchExpressions": [{"key": "a", "operator": "In", "values": ["1", "3"]}]}, {"a": "1"}, True),
    ({"matchExpressions": [{"key": "a", "operator": "NotIn", "values": ["1"]}]}, {"a": "1"}, False),
    ({"matchExpressions": [{"key": "a", "operator": "NotIn", "values": ["1"]}]}, {}, True),
    ({"matchExpressions": [{"key": "a", "operator": "Exists"}]}, {}, False),
    ({"matchExpressions": [{"key": "a", "operator": "DoesNotExist"}]}, {}, True),
])
def test_label_selectors(selector, labels, expect):
    assert selects(selector, labels) is expect


def rtj_policy(**isolation: Any) -> dict[str, Any]:
    body = rtj_body(isolation={"enabled": True, **isolation})
    return build_network_policy(RTJ.from_body(body))


def job_pods() -> list[dict[str, Any]]:
    """The RTJ's two workers and its coordinator, labelled as the builders label them."""
    labels = rtj_policy()["spec"]["podSelector"]["matchLabels"]
    return [pod("train-0", "default", "10.77.0.10", **labels), pod("train-1", "default", "10.77.0.11", **labels),
            pod("train-rdzv", "default", "10.77.0.13", **labels)]


NAMESPACES = {"default": {"kubernetes.io/metadata.name": "default"},
              "team-b": {"kubernetes.io/metadata.name": "team-b", "team": "b"}}


def test_the_rtjs_policy_admits_its_own_pods_on_every_port_and_nothing_else():
    pods = [*job_pods(), pod("nosy", "team-b", "10.77.0.12")]
    allowed = node_ingress([job_pods()[2]], [rtj_policy()], pods, NAMESPACES)
    assert allowed == [Allow("10.77.0.10/32"), Allow("10.77.0.11/32"), Allow("10.77.0.13/32")]


def test_allow_from_admits_the_namespace_it_names():
    policy = rtj_policy(allowFrom=[{"namespaceSelector": {"matchLabels": {"team": "b"}}}])
    pods = [*job_pods(), pod("scraper", "team-b", "10.77.0.12")]
    allowed = node_ingress([job_pods()[0]], [policy], pods, NAMESPACES)
    assert Allow("10.77.0.12/32") in allowed


def test_a_node_without_an_isolated_pod_admits_everything():
    other = pod("web", "team-b", "10.77.0.12", app="web")
    assert node_ingress([other], [rtj_policy()], [*job_pods(), other], NAMESPACES) is None
    assert node_ingress([], [rtj_policy()], job_pods(), NAMESPACES) is None


@pytest.mark.parametrize("rule, expect", [
    ({}, []),  # a policy without ingress rules: isolated, nothing admitted
    ({"ingress": [{}]}, [Allow("0.0.0.0/0")]),  # a rule without peers: any source
    ({"ingress": [{"from": [{"ipBlock": {"cidr": "10.0.0.0/8", "except": ["10.1.0.0/16"]}}],
                   "ports": [{"port": 29400, "endPort": 29402}]}]},
     [Allow("10.0.0.0/8", "TCP", 29400, 29402, ("10.1.0.0/16",))]),
    ({"ingress": [{"ports": [{"port": "rdzv"}]}]}, []),  # a named port: not enforced (logged)
])
def test_rules_peers_and_ports(rule, expect):
    policy = {"metadata": {"name": "p", "namespace": "default"}, "spec": {"podSelector": {}, **rule}}
    assert node_ingress([job_pods()[0]], [policy], job_pods(), NAMESPACES) == expect


def test_an_egress_only_policy_isolates_nothing_for_ingress():
    policy = {"metadata": {"name": "p", "namespace": "default"},
              "spec": {"podSelector": {}, "policyTypes": ["Egress"]}}
    assert node_ingress([job_pods()[0]], [policy], job_pods(), NAMESPACES) is None


def test_the_iptables_rules_keep_replies_and_the_node_then_drop_new_connections():
    rules = iptables_rules([Allow("10.77.0.10/32"), Allow("10.0.0.0/8", "TCP", 29400, 29402, ("10.1.0.0/16",))],
                           "10.77.0.1")
    assert rules[:3] == ["*filter", ":RTJ-NETPOL - [0:0]", "-F RTJ-NETPOL"]
    assert rules[3:] == [
        "-A RTJ-NETPOL -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT", "-A RTJ-NETPOL -i lo -j ACCEPT",
        "-A RTJ-NETPOL -s 10.77.0.1/32 -j ACCEPT", "-A RTJ-NETPOL -s 10.77.0.10/32 -p tcp -j ACCEPT",
        "-A RTJ-NETPOL -s 10.1.0.0/16 -p tcp --dport 29400:29402 -j DROP",
        "-A RTJ-NETPOL -s 10.0.0.0/8 -p tcp --dport 29400:29402 -j ACCEPT",
        "-A RTJ-NETPOL -m conntrack --ctstate NEW -j DROP", "COMMIT", ""]
    assert iptables_rules(None, "10.77.0.1") == ["*filter", ":RTJ-NETPOL - [0:0]", "-F RTJ-NETPOL", "COMMIT", ""]
