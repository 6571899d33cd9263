"""NetworkPolicy ingress enforcement for the node agents (nodeagent.py), in each node's network namespace
with iptables: a stand-in for the cluster's enforcing engine (on EKS the VPC CNI's network policy agent,
or Calico or Cilium), none of which can run on the local control plane. **A simulation**, for what the
tests need of one: that a pod outside a job cannot open a connection to the job's pods, and that the job's
own traffic and the peers its policy admits still flow.

What it implements of networking.k8s.io/v1 (the semantics the Kubernetes docs give):
- a pod is isolated for ingress when a policy of its namespace selects it (`podSelector`, matchLabels and
  matchExpressions) with `Ingress` in its policyTypes (or no policyTypes and no egress rules);
- an isolated pod accepts a connection when some rule of a policy that selects it admits it: the rule's
  `from` peers (`podSelector` in the policy's namespace, `namespaceSelector` with an optional
  `podSelector`, `ipBlock` with `except`; none: any source) and its `ports` (numbers and ranges, by
  protocol; none: every port);
- replies to connections the pod opened are always accepted (stateful, as every engine is); traffic from
  the node itself (the host side of the bridge: the kubelet's probes, the API relay) is too.

What it cannot do as an engine does: pods of one node share its network namespace and IP (the agents run
them as processes there), so rules are per node: a node that runs an isolated pod accepts only what that
pod's policies admit, for every process on it, and a peer is admitted by its node's IP. Named ports and
egress rules are not implemented (a policy with them is applied without them, and says so in the log).
"""

from __future__ import annotations

import ipaddress
import logging
import subprocess
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

CHAIN = "RTJ-NETPOL"


def selects(selector: dict[str, Any] | None, labels: dict[str, str]) -> bool:
    """metav1.LabelSelector: {} selects everything; None selects nothing (an absent selector)."""
    if selector is None:
        return False
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], expr.get("values") or []
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and key in labels and labels[key] in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True


@dataclass(frozen=True)
class Allow:
    """One admitted (source, port) pair: `source` a CIDR (a pod's IP as /32), `except_` CIDRs inside it;
    `port`/`end_port` None: every port."""

    source: str
    protocol: str = "TCP"
    port: int | None = None
    end_port: int | None = None
    except_: tuple[str, ...] = ()


def _labels(obj: dict[str, Any]) -> dict[str, str]:
    return obj.get("metadata", {}).get("labels") or {}


def _ingress_policy(policy: dict[str, Any]) -> bool:
    spec = policy.get("spec") or {}
    types = spec.get("policyTypes")
    return "Ingress" in types if types else True  # the default includes Ingress always


def _sources(peer: dict[str, Any], policy_ns: str, pods: list[dict[str, Any]],
             namespaces: dict[str, dict[str, str]]) -> Iterable[tuple[str, tuple[str, ...]]]:
    if "ipBlock" in peer:
        block = peer["ipBlock"]
        yield block["cidr"], tuple(block.get("except") or ())
        return
    ns_selector = peer.get("namespaceSelector")
    pod_selector = peer.get("podSelector", {}) if ns_selector is not None else peer.get("podSelector")
    for pod in pods:
        meta = pod["metadata"]
        in_scope = (selects(ns_selector, namespaces.get(meta["namespace"], {})) if ns_selector is not None
                    else meta["namespace"] == policy_ns)
        ip = (pod.get("status") or {}).get("podIP")
        if in_scope and ip and selects(pod_selector, _labels(pod)):
            yield f"{ip}/32", ()


def node_ingress(local_pods: list[dict[str, Any]], policies: list[dict[str, Any]], pods: list[dict[str, Any]],
                 namespaces: dict[str, dict[str, str]]) -> list[Allow] | None:
    """What a node's network namespace admits: None when none of its pods is isolated (everything), else
    the union of what the policies selecting its pods admit (empty: nothing)."""
    allowed: list[Allow] | None = None
    for pod in local_pods:
        for policy in policies:
            meta, spec = policy["metadata"], policy.get("spec") or {}
            if meta["namespace"] != pod["metadata"]["namespace"] or not _ingress_policy(policy):
                continue
            if not selects(spec.get("podSelector", {}), _labels(pod)):
                continue
            allowed = allowed if allowed is not None else []
            for rule in spec.get("ingress") or []:
                peers = rule.get("from")
                sources = ([("0.0.0.0/0", ())] if not peers else
                           [s for peer in peers for s in _sources(peer, meta["namespace"], pods, namespaces)])
                ports = rule.get("ports") or [{}]
                for source, excepted in sources:
                    for port in ports:
                        number = port.get("port")
                        if number is not None and not isinstance(number, int):
                            log.warning("netpol: named port %r of %s/%s not enforced", number,
                                        meta["namespace"], meta["name"])
                            continue
                        allowed.append(Allow(source, port.get("protocol", "TCP"), number, port.get("endPort"),
                                             excepted))
    return list(dict.fromkeys(allowed)) if allowed is not None else None  # in order, once each


def iptables_rules(allowed: list[Allow] | None, host_ip: str) -> list[str]:
    """iptables-restore input for the filter table's CHAIN (jumped to from INPUT)."""
    lines = ["*filter", f":{CHAIN} - [0:0]", f"-F {CHAIN}"]
    if allowed is not None:
        lines += [f"-A {CHAIN} -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT",
                  f"-A {CHAIN} -i lo -j ACCEPT", f"-A {CHAIN} -s {host_ip}/32 -j ACCEPT"]
        for a in allowed:
            protocol = a.protocol.lower()
            match = f"-p {protocol}" + (f" --dport {a.port}" + (f":{a.end_port}" if a.end_port else "")
                                        if a.port is not None else "")
            for excepted in a.except_:
                lines.append(f"-A {CHAIN} -s {excepted} {match} -j DROP")
            if ipaddress.ip_network(a.source, strict=False).prefixlen == 0:
                lines.append(f"-A {CHAIN} {match} -j ACCEPT")
            else:
                lines.append(f"-A {CHAIN} -s {a.source} {match} -j ACCEPT")
        lines.append(f"-A {CHAIN} -m conntrack --ctstate NEW -j DROP")
    return [*lines, "COMMIT", ""]


class Enforcer:
    """Every `interval` seconds: the cluster's NetworkPolicies, pods and namespaces, and for each node (netns,
    name, IP) the rules its pods' policies ask for, applied when they change. `stop()` removes them."""

    def __init__(self, api: Callable[..., Any], nodes: list[tuple[str, str, str]], host_ip: str,
                 interval: float = 0.5):
        self.api, self.nodes, self.host_ip, self.interval = api, nodes, host_ip, interval
        self._applied: dict[str, list[str]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="netpol", daemon=True)
        self.synced = threading.Event()  # set after every node's rules were applied once

    def start(self) -> Enforcer:
        for netns, _, _ in self.nodes:
            _netns(netns, "iptables", "-N", CHAIN, check=False)
            if _netns(netns, "iptables", "-C", "INPUT", "-j", CHAIN, check=False).returncode != 0:
                _netns(netns, "iptables", "-I", "INPUT", "-j", CHAIN)
        self._thread.start()
        return self

    def sync(self) -> None:
        policies = self.api("GET", "/apis/networking.k8s.io/v1/networkpolicies").get("items") or []
        pods = [p for p in self.api("GET", "/api/v1/pods").get("items") or []
                if (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")]
        namespaces = {n["metadata"]["name"]: _labels(n) for n in self.api("GET", "/api/v1/namespaces")["items"]}
        for netns, node, _ in self.nodes:
            local = [p for p in pods if p.get("spec", {}).get("nodeName") == node]
            rules = iptables_rules(node_ingress(local, policies, pods, namespaces), self.host_ip)
            if self._applied.get(netns) != rules:
                subprocess.run(["ip", "netns", "exec", netns, "iptables-restore", "--noflush"],
                               input="\n".join(rules), text=True, check=True, capture_output=True)
                self._applied[netns] = rules

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.sync()
                self.synced.set()
            except Exception as exc:  # the API server restarting, a node's netns gone: next round
                log.warning("netpol: sync failed: %s", exc)
            self._stop.wait(self.interval)

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5)
        for netns, _, _ in self.nodes:
            _netns(netns, "iptables", "-D", "INPUT", "-j", CHAIN, check=False)
            _netns(netns, "iptables", "-F", CHAIN, check=False)
            _netns(netns, "iptables", "-X", CHAIN, check=False)


def _netns(netns: str, *cmd: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", "netns", "exec", netns, *cmd], check=check, capture_output=True, text=True)
