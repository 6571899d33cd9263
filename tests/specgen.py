"""RTJ specs generated for the fuzz tests, and the checks kube-apiserver makes on the children.

`bodies` and `pod_bodies` generate specs, hostile and plausible; `check(body)` asserts the property (a
rejection names the field, or every child the operator builds is valid). Valid means what kube-apiserver
accepts: the upstream OpenAPI schemas (kubernetes-validate, strict) and `server_side_errors`, an
independent transcription of the checks in k8s.io/kubernetes/pkg/apis/*/validation that the OpenAPI does
not express (names, labels, quantities, ports, env, tolerations, affinity, resources). Used by
tests/unit/test_fuzz_spec.py (the property, no cluster) and tests/cluster/test_fuzz_spec_server.py (the
same generator against a real API server).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from typing import Any

import kubernetes_validate
import kubernetes_validate.utils
from hypothesis import HealthCheck, example, settings
from hypothesis import strategies as st

from rtj_operator import api
from rtj_operator.builders import build_coordinator, build_job, build_pvc, build_service
from rtj_operator.spec import RTJ, parse_quantity, schema_errors, semantic_errors

K8S_VERSIONS = ("1.33.0", "1.37.0")
SETTINGS = settings(max_examples=800, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
FIELDS = (*api.SPEC_SCHEMA["properties"], "metadata.name")


def children_for_spec(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The objects the operator creates for an accepted RTJ (the Job of its first attempt)."""
    rtj = RTJ.from_body(body)
    return [m for m in (build_service(rtj), build_job(rtj, attempt=1), build_pvc(rtj), build_coordinator(rtj, 1))
            if m is not None]


def rejection(body: dict[str, Any]) -> list[str]:
    """Why `kubectl apply` (schema) or the operator (InvalidSpec) rejects the RTJ; [] if accepted."""
    return schema_errors(body) or semantic_errors(RTJ.from_body(body))


# --- Kubernetes' own checks, transcribed from pkg/apis/core/validation and apimachinery's validation ----

DNS1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
DNS1035_LABEL = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
QUALIFIED_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
CONFIG_KEY = re.compile(r"[-._a-zA-Z0-9]+")
DOWNWARD_FIELDS = {"metadata.name", "metadata.namespace", "metadata.uid", "spec.nodeName",
                   "spec.serviceAccountName", "status.hostIP", "status.hostIPs", "status.podIP", "status.podIPs"}
STANDARD_RESOURCES = {"cpu", "memory", "ephemeral-storage"}


def is_subdomain(value: Any, max_len: int = 253) -> bool:
    return isinstance(value, str) and len(value) <= max_len and DNS1123_SUBDOMAIN.fullmatch(value) is not None


def is_qualified_name(value: Any) -> bool:
    if not isinstance(value, str):
        return False
    prefix, _, name = value.rpartition("/")
    if "/" in value and (not prefix or not is_subdomain(prefix)):
        return False
    return len(name) <= 63 and QUALIFIED_NAME.fullmatch(name) is not None


def is_label_value(value: Any) -> bool:
    return isinstance(value, str) and len(value) <= 63 and LABEL_VALUE.fullmatch(value) is not None


def labels_errors(labels: dict[str, Any], where: str) -> list[str]:
    return [f"{where}: label {k!r}={v!r}" for k, v in labels.items() if not is_qualified_name(k)
            or not is_label_value(v)]


def quantity_errors(value: Any, where: str, positive: bool = False, integer: bool = False) -> list[str]:
    q = parse_quantity(value)
    if q is None or q < 0 or (positive and q == 0) or (integer and q % 1):
        return [f"{where}: quantity {value!r}"]
    return []


def resources_errors(resources: dict[str, Any], where: str) -> list[str]:
    errors, limits, requests = [], resources.get("limits", {}), resources.get("requests", {})
    for kind, values in (("limits", limits), ("requests", requests)):
        for name, value in values.items():
            extended = name not in STANDARD_RESOURCES
            if extended and ("/" not in name or "kubernetes.io/" in name or not is_qualified_name(name)):
                errors.append(f"{where}.{kind}: resource name {name!r}")
            errors += quantity_errors(value, f"{where}.{kind}[{name}]", integer=extended)
    for name, value in requests.items():
        if name not in STANDARD_RESOURCES and parse_quantity(limits.get(name)) != parse_quantity(value):
            errors.append(f"{where}.requests[{name}]: must equal the limit")
        elif name in limits and (parse_quantity(value) or 0) > (parse_quantity(limits[name]) or 0):
            errors.append(f"{where}.requests[{name}]: above the limit")
    return errors


def env_errors(env: list[dict[str, Any]], where: str) -> list[str]:
    errors, names = [], [e.get("name") for e in env]
    if len(set(names)) != len(names):
        errors.append(f"{where}: duplicate names {names}")
    for var in env:
        name, source = var.get("name"), var.get("valueFrom")
        if not isinstance(name, str) or not name or any(not " " <= c <= "~" or c == "=" for c in name):
            errors.append(f"{where}: name {name!r}")
        if not isinstance(var.get("value", ""), str):
            errors.append(f"{where}[{name}]: value {var['value']!r}")
        if source is None:
            continue
        if var.get("value") or len(source) != 1:
            errors.append(f"{where}[{name}]: value and valueFrom, or not one source: {var}")
        field = source.get("fieldRef", {}).get("fieldPath")
        sub = re.fullmatch(r"metadata\.(labels|annotations)\['(.*)'\]", field or "")
        if field is not None and field not in DOWNWARD_FIELDS and not (sub and is_qualified_name(sub[2].lower())):
            errors.append(f"{where}[{name}]: fieldPath {field!r}")
        ref = source.get("resourceFieldRef")
        if ref is not None:
            valid = ({"1m", "1"} if ref["resource"].endswith("cpu") else
                     {"1", "1k", "1M", "1G", "1T", "1P", "1E", "1Ki", "1Mi", "1Gi", "1Ti", "1Pi", "1Ei"})
            if not re.fullmatch(r"(limits|requests)\.(cpu|memory|ephemeral-storage)", ref["resource"]) or \
                    ref.get("containerName", "worker") != "worker" or str(ref.get("divisor", "1")) not in valid:
                errors.append(f"{where}[{name}]: resourceFieldRef {ref}")
        for kind in ("configMapKeyRef", "secretKeyRef"):
            ref = source.get(kind)
            if ref is not None and (not is_subdomain(ref.get("name")) or not CONFIG_KEY.fullmatch(ref.get("key", ""))
                                    or ref["key"].startswith("..") or ref["key"] == "."):
                errors.append(f"{where}[{name}]: {kind} {ref}")
    return errors


def toleration_errors(tol: dict[str, Any], where: str) -> list[str]:
    errors, key, op = [], tol.get("key", ""), tol.get("operator", "Equal")
    if key and not is_qualified_name(key):
        errors.append(f"{where}: key {key!r}")
    if not key and op != "Exists":
        errors.append(f"{where}: no key needs Exists")
    if op == "Exists" and tol.get("value"):
        errors.append(f"{where}: Exists with a value")
    if op == "Equal" and not is_label_value(tol.get("value", "")):
        errors.append(f"{where}: value {tol.get('value')!r}")
    if op not in ("Equal", "Exists") or tol.get("effect", "") not in ("", "NoSchedule", "PreferNoSchedule",
                                                                          "NoExecute"):
        errors.append(f"{where}: operator/effect {tol}")
    if "tolerationSeconds" in tol and tol.get("effect") != "NoExecute":
        errors.append(f"{where}: tolerationSeconds without NoExecute")
    return errors


def requirement_errors(req: dict[str, Any], where: str, fields: bool = False) -> list[str]:
    op, values = req["operator"], req.get("values", [])
    ok = {"In": bool(values), "NotIn": bool(values), "Exists": not values, "DoesNotExist": not values,
          "Gt": len(values) == 1, "Lt": len(values) == 1}.get(op, False)
    if fields:
        ok = ok and req["key"] == "metadata.name" and len(values) == 1
    elif not is_qualified_name(req["key"]):
        ok = False
    return [] if ok else [f"{where}: requirement {req}"]


def affinity_errors(affinity: dict[str, Any], where: str) -> list[str]:
    errors, node = [], affinity.get("nodeAffinity", {})
    terms = node.get("requiredDuringSchedulingIgnoredDuringExecution", {"nodeSelectorTerms": [{}]})
    if not terms.get("nodeSelectorTerms"):
        errors.append(f"{where}: no nodeSelectorTerms")
    terms = terms.get("nodeSelectorTerms", []) + [
        p["preference"] for p in node.get("preferredDuringSchedulingIgnoredDuringExecution", [])
        if 1 <= p["weight"] <= 100 or errors.append(f"{where}: weight {p['weight']}")]
    for term in terms:
        for req in term.get("matchExpressions", []):
            errors += requirement_errors(req, f"{where}.nodeAffinity")
        for req in term.get("matchFields", []):
            errors += requirement_errors(req, f"{where}.nodeAffinity", fields=True)
    for kind in ("podAffinity", "podAntiAffinity"):
        pod = affinity.get(kind, {})
        for term in pod.get("requiredDuringSchedulingIgnoredDuringExecution", []) + [
                w["podAffinityTerm"] for w in pod.get("preferredDuringSchedulingIgnoredDuringExecution", [])
                if 1 <= w["weight"] <= 100 or errors.append(f"{where}: weight {w['weight']}")]:
            if not is_qualified_name(term.get("topologyKey")):
                errors.append(f"{where}.{kind}: topologyKey {term.get('topologyKey')!r}")
            for sel in ("labelSelector", "namespaceSelector"):
                selector = term.get(sel, {})
                errors += labels_errors(selector.get("matchLabels", {}), f"{where}.{kind}.{sel}")
                for req in selector.get("matchExpressions", []):
                    if req["operator"] in ("Gt", "Lt") or any(not is_label_value(v) for v in req.get("values", [])):
                        errors.append(f"{where}.{kind}: {req}")
                    errors += requirement_errors(req, f"{where}.{kind}.{sel}")
            errors += [f"{where}: namespace {n!r}" for n in term.get("namespaces", [])
                       if not DNS1123_LABEL.fullmatch(n) or len(n) > 63]
    return errors


def pod_errors(pod: dict[str, Any], hostnames: list[str]) -> list[str]:
    errors = [f"hostname {h}" for h in hostnames if len(h) > 63 or not DNS1123_LABEL.fullmatch(h)]
    if len(pod["subdomain"]) > 63 or not DNS1123_LABEL.fullmatch(pod["subdomain"]):
        errors.append(f"subdomain {pod['subdomain']!r}")
    errors += [f"{k} {pod[k]!r}" for k in ("serviceAccountName", "priorityClassName")
               if k in pod and not is_subdomain(pod[k])]
    errors += labels_errors(pod.get("nodeSelector", {}), "nodeSelector")
    for i, tol in enumerate(pod["tolerations"]):
        errors += toleration_errors(tol, f"tolerations[{i}]")
    errors += affinity_errors(pod["affinity"], "affinity")
    volumes = [v["name"] for v in pod.get("volumes", [])]
    if len(set(volumes)) != len(volumes):
        errors.append(f"volume names not unique: {volumes}")
    for volume in pod.get("volumes", []):
        errors += volume_errors(volume, f"volume {volume['name']}")
    containers = [c["name"] for c in pod.get("initContainers", []) + pod["containers"]]
    if len(set(containers)) != len(containers):
        errors.append(f"container names not unique: {containers}")
    for c in pod.get("initContainers", []):
        errors += container_errors(c, set(volumes), f"initContainers[{c['name']}]")
    if "schedulerName" in pod and not is_subdomain(pod["schedulerName"]):
        errors.append(f"schedulerName {pod['schedulerName']!r}")
    errors += [f"imagePullSecrets {s}" for s in pod.get("imagePullSecrets", []) if not s.get("name")]
    for c in pod["containers"]:
        errors += mount_errors(c.get("volumeMounts", []), set(volumes), f"container {c['name']}")
    for c in pod["containers"]:
        if not c["image"] or c["image"] != c["image"].strip():
            errors.append(f"image {c['image']!r}")
        errors += resources_errors(c.get("resources", {}), "resources")
        errors += env_errors(c.get("env", []), "env")
        for port in c.get("ports", []):
            base = port["containerPort"]
            if not 1 <= base <= 65535 - (api.RENDEZVOUS_PORTS - 1):
                errors.append(f"containerPort {base}: the gang also listens on the 3 ports above it")
    return errors


IANA_SVC_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
VOLUME_SOURCES = ("persistentVolumeClaim", "configMap", "secret", "emptyDir", "hostPath", "nfs", "csi")


def no_backsteps(path: str) -> bool:
    return ".." not in path.split("/")


def volume_errors(volume: dict[str, Any], where: str) -> list[str]:
    """pkg/apis/core/validation validateVolumeSource and its sources'."""
    errors = [] if DNS1123_LABEL.fullmatch(volume["name"]) and len(volume["name"]) <= 63 else [
        f"{where}: name {volume['name']!r}"]
    sources = [s for s in VOLUME_SOURCES if s in volume]
    if len(sources) != 1:
        return [*errors, f"{where}: sources {sources}"]
    kind, source = sources[0], volume[sources[0]]
    if kind == "persistentVolumeClaim" and not source.get("claimName"):
        errors.append(f"{where}: claimName")
    if kind in ("configMap", "secret"):
        if not source.get("name" if kind == "configMap" else "secretName"):
            errors.append(f"{where}: {kind} name")
        if not 0 <= source.get("defaultMode", 0) <= 0o777:
            errors.append(f"{where}: defaultMode {source['defaultMode']}")
        for item in source.get("items", []):
            path = item.get("path", "")
            if not CONFIG_KEY.fullmatch(item.get("key", "")) or not path or path.startswith("/") or \
                    not no_backsteps(path) or path.startswith("..") or not 0 <= item.get("mode", 0) <= 0o777:
                errors.append(f"{where}: item {item}")
    if kind == "emptyDir":
        if source.get("medium", "") not in ("", "Memory") and not source["medium"].startswith("HugePages"):
            errors.append(f"{where}: medium {source['medium']!r}")
        if "sizeLimit" in source:
            errors += quantity_errors(source["sizeLimit"], f"{where}: sizeLimit")
    if kind == "hostPath" and (not source.get("path") or not no_backsteps(source["path"]) or source.get(
            "type", "") not in ("", "DirectoryOrCreate", "Directory", "FileOrCreate", "File", "Socket", "CharDevice",
                                "BlockDevice")):
        errors.append(f"{where}: hostPath {source}")
    if kind == "nfs" and (not source.get("server") or not source.get("path", "").startswith("/")):
        errors.append(f"{where}: nfs {source}")
    if kind == "csi" and (len(source.get("driver", "")) > 63 or not is_subdomain(source.get("driver", "").lower())):
        errors.append(f"{where}: csi driver {source.get('driver')!r}")
    return errors


def mount_errors(mounts: list[dict[str, Any]], volumes: set[str], where: str) -> list[str]:
    errors, paths = [], [m["mountPath"] for m in mounts]
    if len(set(paths)) != len(paths):
        errors.append(f"{where}: mountPaths not unique: {paths}")
    for m in mounts:
        sub = m.get("subPath", "")
        if m["name"] not in volumes or not m["mountPath"] or sub.startswith("/") or not no_backsteps(sub):
            errors.append(f"{where}: mount {m}")
    return errors


def port_errors(ports: list[dict[str, Any]], where: str) -> list[str]:
    errors, names = [], [p["name"] for p in ports if "name" in p]
    if len(set(names)) != len(names):
        errors.append(f"{where}: port names {names}")
    for port in ports:
        name = port.get("name")
        if not 1 <= port["containerPort"] <= 65535 or port.get("protocol", "TCP") not in ("TCP", "UDP", "SCTP") or (
                name is not None and (len(name) > 15 or not IANA_SVC_NAME.fullmatch(name) or "--" in name
                                      or not re.search("[a-z]", name))):
            errors.append(f"{where}: port {port}")
    return errors


def container_errors(c: dict[str, Any], volumes: set[str], where: str) -> list[str]:
    errors = [] if DNS1123_LABEL.fullmatch(c["name"]) and len(c["name"]) <= 63 else [f"{where}: name {c['name']!r}"]
    if not c.get("image") or c["image"] != c["image"].strip():
        errors.append(f"{where}: image {c.get('image')!r}")
    if c.get("restartPolicy", "Always") != "Always":
        errors.append(f"{where}: restartPolicy {c['restartPolicy']!r}")
    errors += resources_errors(c.get("resources", {}), f"{where}.resources")
    errors += env_errors(c.get("env", []), f"{where}.env")
    errors += port_errors(c.get("ports", []), where)
    errors += mount_errors(c.get("volumeMounts", []), volumes, where)
    sc = c.get("securityContext", {})
    if sc.get("privileged") and sc.get("allowPrivilegeEscalation") is False:
        errors.append(f"{where}: privileged without privilege escalation")
    seccomp = sc.get("seccompProfile")
    # validateSeccompProfileField: localhostProfile only (and then not empty, here) with Localhost.
    if seccomp and (seccomp.get("type") not in ("RuntimeDefault", "Unconfined", "Localhost") or not (
            bool(seccomp.get("localhostProfile")) if seccomp["type"] == "Localhost"
            else "localhostProfile" not in seccomp)):
        errors.append(f"{where}: seccompProfile {seccomp}")
    if not 0 <= sc.get("runAsUser", 0) <= 2**31 - 1 or not 0 <= sc.get("runAsGroup", 0) <= 2**31 - 1:
        errors.append(f"{where}: runAsUser/runAsGroup {sc}")
    return errors


def annotations_errors(annotations: dict[str, Any], where: str) -> list[str]:
    """apimachinery ValidateAnnotations: keys are qualified names in lower case; 256 KiB in all."""
    errors = [f"{where}: annotation {k!r}" for k in annotations if not is_qualified_name(k.lower())]
    if sum(len(k) + len(v) for k, v in annotations.items()) > 256 * 1024:
        errors.append(f"{where}: annotations too large")
    return errors


def server_side_errors(manifest: dict[str, Any]) -> list[str]:
    """What kube-apiserver rejects in a child although its OpenAPI schema accepts it."""
    kind, meta, spec = manifest["kind"], manifest["metadata"], manifest["spec"]
    name_ok = {"Service": lambda n: len(n) <= 63 and DNS1035_LABEL.fullmatch(n),
               "Job": lambda n: len(n) <= 63 and DNS1123_SUBDOMAIN.fullmatch(n),
               "Pod": is_subdomain, "PersistentVolumeClaim": is_subdomain}[kind](meta["name"])
    errors = [] if name_ok else [f"{kind} name {meta['name']!r}"]
    errors += labels_errors(meta.get("labels", {}), f"{kind} labels")
    if kind == "Service":
        errors += labels_errors(spec["selector"], "selector")
        errors += [f"port {p['port']}" for p in spec["ports"] if not 1 <= p["port"] <= 65535]
    elif kind == "PersistentVolumeClaim":
        errors += quantity_errors(spec["resources"]["requests"]["storage"], "storage", positive=True)
        if not is_subdomain(spec["storageClassName"]):
            errors.append(f"storageClassName {spec['storageClassName']!r}")
    elif kind == "Pod":  # the coordinator
        errors += annotations_errors(meta.get("annotations", {}), "coordinator annotations")
        errors += pod_errors(spec, [spec["hostname"]])
    else:
        errors += labels_errors(spec["template"]["metadata"]["labels"], "template labels")
        errors += annotations_errors(spec["template"]["metadata"].get("annotations", {}), "template annotations")
        errors += pod_errors(spec["template"]["spec"], [f"{meta['name']}-{i}" for i in (0, spec["completions"] - 1)])
    return errors


# --- The generator ---------------------------------------------------------------------------------

def maybe(hostile: st.SearchStrategy, plausible: st.SearchStrategy) -> st.SearchStrategy:
    """Mostly plausible values, one in eight hostile (a spec has many fields: most must be plausible)."""
    return st.integers(0, 7).flatmap(lambda i: hostile if i == 7 else plausible)  # hypothesis favours 0


def text(max_size: int = 12) -> st.SearchStrategy[str]:
    return st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=max_size)


dns_label = st.from_regex(r"\A[a-z]([-a-z0-9]{0,8}[a-z0-9])?\Z")
names = maybe(st.sampled_from(["70b-run", "llama.v2", "Train", "x" * 59, "a-", "a_b", "-a", "x" * 58]),
              dns_label)
label_keys = maybe(st.one_of(text(), st.sampled_from(["bad key", "a/", "/b", "A.b/c", "x" * 254 + "/y", "k" * 64])),
                   st.sampled_from(["team", "eks.amazonaws.com/nodegroup", "topology.kubernetes.io/zone", "a.b_c-d"]))
label_values = maybe(st.one_of(text(), st.sampled_from(["ml research", "-x", "x" * 64, "x\n"])),
                     st.sampled_from(["p5", "", "us-west-2a", "a.b_c-d", "x" * 63]))
quantities = maybe(st.one_of(st.integers(-5, 10**6), text(6), st.floats(allow_nan=False),
                             st.sampled_from(["0", "-1Gi", "1.2.3", "5iG", "1Gb", " 1Gi", "1e1.5", "0e3", "1Gi\n"])),
                   st.sampled_from(["1200Gi", "0.5Gi", "64Gi", "1", "500m", "1e3", "2Ti", "100"]))
subdomains = maybe(st.one_of(text(), st.sampled_from(["Trainer", "a..b", "sa\n", "x" * 254, "-a"])),
                   st.sampled_from(["rtj-worker", "default", "fsx-sc", "high.priority"]))
env_names = maybe(st.one_of(text(), st.sampled_from(["", "A=B", "NODE_RANK", "RTJ_NAME", "é"])),
                  st.sampled_from(["NCCL_DEBUG", "my.var-1", "FI_PROVIDER", "HF HOME", "X"]))
value_from = st.one_of(
    st.fixed_dictionaries({"fieldRef": st.fixed_dictionaries({"fieldPath": st.sampled_from([
        "metadata.name", "spec.nodeName", "metadata.labels['app']", "metadata.annotations['bad key']",
        "spec.containers", "status.podIPs"])})}),
    st.fixed_dictionaries({"resourceFieldRef": st.fixed_dictionaries(
        {"resource": st.sampled_from(["limits.cpu", "requests.memory", "limits.nvidia.com/gpu"])},
        optional={"divisor": st.sampled_from(["1", "1m", "1Mi", "1k", "2", 1]),
                  "containerName": st.sampled_from(["worker", "other"])})}),
    st.builds(lambda kind, ref: {kind: ref}, st.sampled_from(["secretKeyRef", "configMapKeyRef"]),
              st.fixed_dictionaries({"key": st.sampled_from(["token", "..x", "a.json", "bad key"])},
                                    optional={"name": subdomains, "optional": st.booleans()})),
    st.dictionaries(st.sampled_from(["fieldRef", "secretKeyRef"]),
                    st.just({"fieldPath": "metadata.name", "name": "s", "key": "k"}), max_size=2),
)
env_vars = maybe(
    st.fixed_dictionaries({}, optional={"name": env_names, "value": st.integers(), "valueFrom": value_from}),
    st.one_of(st.fixed_dictionaries({"name": env_names}, optional={"value": text()}),
              st.fixed_dictionaries({"name": env_names, "valueFrom": value_from})))
tolerations = st.fixed_dictionaries({}, optional={
    "key": label_keys, "operator": maybe(text(5), st.sampled_from(["Exists", "Equal"])),
    "value": label_values, "effect": maybe(text(5), st.sampled_from(["NoSchedule", "NoExecute", "PreferNoSchedule"])),
    "tolerationSeconds": st.integers(-10, 10**6)})
resource_lists = st.one_of(
    st.dictionaries(maybe(st.one_of(text(), st.sampled_from(["cpus", "kubernetes.io/x", "nvidia.com/gpu"])),
                          st.sampled_from(["cpu", "memory", "ephemeral-storage", "example.com/fpga"])),
                    quantities, max_size=3),
    st.dictionaries(st.sampled_from(["cpu", "memory"]), quantities, max_size=2),
)
resources = maybe(st.one_of(st.just("8"), st.just(["cpu"]), st.fixed_dictionaries(
    {}, optional={"limits": st.one_of(st.just("8"), st.just(["cpu"]), st.none())})),
    st.fixed_dictionaries({}, optional={"limits": resource_lists, "requests": resource_lists}))
requirement = st.fixed_dictionaries({"key": label_keys, "operator": st.sampled_from(
    ["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt", "Bogus"])}, optional={
    "values": st.lists(maybe(text(4), st.sampled_from(["a", "1", "us-west-2a"])), max_size=2)})
affinities = st.fixed_dictionaries({}, optional={
    "nodeAffinity": st.fixed_dictionaries({}, optional={
        "requiredDuringSchedulingIgnoredDuringExecution": st.fixed_dictionaries({"nodeSelectorTerms": st.lists(
            st.fixed_dictionaries({}, optional={"matchExpressions": st.lists(requirement, max_size=2),
                                                "matchFields": st.lists(requirement, max_size=1)}), max_size=2)}),
        "preferredDuringSchedulingIgnoredDuringExecution": st.lists(st.fixed_dictionaries({
            "weight": st.integers(-1, 101), "preference": st.fixed_dictionaries(
                {}, optional={"matchExpressions": st.lists(requirement, max_size=2)})}), max_size=2)}),
    "podAffinity": st.fixed_dictionaries({}, optional={
        "requiredDuringSchedulingIgnoredDuringExecution": st.lists(st.fixed_dictionaries(
            {"topologyKey": label_keys}, optional={
                "labelSelector": st.fixed_dictionaries({}, optional={
                    "matchLabels": st.dictionaries(label_keys, label_values, max_size=2),
                    "matchExpressions": st.lists(requirement, max_size=2)}),
                "namespaces": st.lists(names, max_size=2)}), max_size=2)}),
})


pod_label_keys = maybe(st.sampled_from(["training.rtj.dev/name", "batch.kubernetes.io/job-completion-index",
                                         "app.kubernetes.io/component", "bad key", "job-name", "a/"]),
                       st.sampled_from(["team", "example.com/cost-center", "a.b_c-d"]))
annotation_keys = maybe(st.one_of(text(), st.sampled_from(["Batch.Kubernetes.io/job-completion-index", "bad key",
                                                           "training.rtj.dev/x", "x" * 64])),
                        st.sampled_from(["karpenter.sh/do-not-disrupt", "Example.com/Note", "note"]))
volume_names = maybe(st.sampled_from(["dshm", "checkpoints", "Data", "a_b", "-a", "x" * 64]),
                     st.sampled_from(["data", "scratch", "s3"]))
mount_paths = maybe(st.sampled_from(["relative", "", "/dev/shm", "/checkpoints", "/checkpoints/", "/fsx"]),
                    st.sampled_from(["/data", "/mnt/s3", "/scratch"]))
relative_paths = maybe(st.sampled_from(["/abs", "../up", "a/../..", "..x"]), st.sampled_from(["a", "a/b", "x.json"]))
modes = maybe(st.sampled_from([-1, 0o1000]), st.sampled_from([0o644, 0o400]))
key_to_path = st.fixed_dictionaries({"key": maybe(st.sampled_from(["bad key", ""]), st.just("token")),
                                     "path": relative_paths}, optional={"mode": modes})
volume_sources = st.one_of(
    st.builds(lambda s: {"persistentVolumeClaim": s}, st.fixed_dictionaries(
        {"claimName": subdomains}, optional={"readOnly": st.booleans()})),
    st.builds(lambda s: {"emptyDir": s}, st.fixed_dictionaries({}, optional={
        "medium": maybe(st.just("Disk"), st.sampled_from(["", "Memory"])), "sizeLimit": quantities})),
    st.builds(lambda s: {"secret": s}, st.fixed_dictionaries({"secretName": subdomains}, optional={
        "items": st.lists(key_to_path, max_size=2), "defaultMode": modes, "optional": st.booleans()})),
    st.builds(lambda s: {"configMap": s}, st.fixed_dictionaries({"name": subdomains}, optional={
        "items": st.lists(key_to_path, max_size=2)})),
    st.builds(lambda s: {"hostPath": s}, st.fixed_dictionaries({"path": maybe(
        st.sampled_from(["", "relative", "/a/../b"]), st.sampled_from(["/opt/lib", "/var/run/x.sock"]))},
        optional={"type": maybe(st.just("Dir"), st.sampled_from(["", "Directory", "Socket"]))})),
    st.builds(lambda s: {"nfs": s}, st.fixed_dictionaries({
        "server": maybe(st.sampled_from(["", "a b"]), st.just("fs-1.example.com")), "path": mount_paths},
        optional={"readOnly": st.booleans()})),
    st.builds(lambda s: {"csi": s}, st.fixed_dictionaries({"driver": maybe(
        st.sampled_from(["", "Bad_Driver", "x" * 64]), st.sampled_from(["s3.csi.aws.com", "EFS.csi.aws.com"]))},
        optional={"volumeAttributes": st.dictionaries(st.sampled_from(["bucketName", "a b"]), text(), max_size=2),
                  "nodePublishSecretRef": st.fixed_dictionaries({"name": subdomains})})),
    st.just({}),
    st.just({"emptyDir": {}, "nfs": {"server": "s", "path": "/x"}}),
)
pod_volumes = st.builds(lambda name, source: {"name": name, **source}, volume_names, volume_sources)
volume_mounts = st.fixed_dictionaries({"name": volume_names, "mountPath": mount_paths},
                                      optional={"readOnly": st.booleans(), "subPath": relative_paths})
container_ports = st.fixed_dictionaries(
    {"containerPort": maybe(st.integers(-1, 70000), st.integers(1, 65535))},
    optional={"name": maybe(st.sampled_from(["80", "a--b", "UPPER", "x" * 16, "-a"]),
                            st.sampled_from(["metrics", "h"])),
              "protocol": maybe(st.just("ICMP"), st.sampled_from(["TCP", "UDP"]))})
security_contexts = st.fixed_dictionaries({}, optional={
    "privileged": st.booleans(), "allowPrivilegeEscalation": st.booleans(), "runAsNonRoot": st.booleans(),
    "runAsUser": maybe(st.just(-1), st.integers(0, 70000)),
    "capabilities": st.fixed_dictionaries({}, optional={"add": st.lists(maybe(st.just("a b"), st.just("SYS_ADMIN")),
                                                                        max_size=1),
                                                        "drop": st.just(["ALL"])}),
    "seccompProfile": st.fixed_dictionaries({"type": maybe(st.just("Bogus"), st.sampled_from(
        ["RuntimeDefault", "Localhost"]))}, optional={"localhostProfile": st.sampled_from(["", "p.json"])})})
init_containers = st.fixed_dictionaries(
    {"name": maybe(st.sampled_from(["worker", "Bad", "-x", "x" * 64]), st.sampled_from(["sidecar", "fetch"])),
     "image": maybe(st.sampled_from(["", " img", "a b"]), st.just("busybox:1"))},
    optional={"restartPolicy": maybe(st.just("OnFailure"), st.just("Always")), "env": st.lists(env_vars, max_size=2),
              "resources": resources, "volumeMounts": st.lists(volume_mounts, max_size=2),
              "ports": st.lists(container_ports, max_size=2), "securityContext": security_contexts,
              "command": st.lists(text(), max_size=2), "workingDir": st.sampled_from(["/tmp", ""])})
any_pods = st.fixed_dictionaries({}, optional={
    "labels": st.dictionaries(pod_label_keys, label_values, max_size=3),
    "annotations": st.dictionaries(annotation_keys, text(), max_size=2),
    "imagePullSecrets": st.lists(st.fixed_dictionaries({"name": subdomains}), max_size=2),
    "schedulerName": subdomains,
    "volumes": st.lists(pod_volumes, max_size=3),
    "volumeMounts": st.lists(volume_mounts, max_size=2),
    "initContainers": st.lists(init_containers, max_size=2)})
plausible_sources = st.sampled_from([
    {"persistentVolumeClaim": {"claimName": "imagenet", "readOnly": True}}, {"emptyDir": {"sizeLimit": "10Gi"}},
    {"secret": {"secretName": "hf", "items": [{"key": "token", "path": "hf/token", "mode": 0o400}]}},
    {"configMap": {"name": "cfg", "optional": True}}, {"csi": {"driver": "s3.csi.aws.com"}},
    {"nfs": {"server": "fs-1.example.com", "path": "/export"}}, {"hostPath": {"path": "/opt/lib", "type": ""}}])


@st.composite
def coherent_pods(draw: Any) -> dict[str, Any]:
    """A spec.pod whose mounts name its volumes (most of the time), with otherwise plausible parts: without
    it, nearly every generated spec.pod is rejected and the accepted side of the property says little."""
    names = draw(st.lists(st.sampled_from(["data", "scratch", "s3", "cfg"]), unique=True, max_size=3))
    mountable = [*names, "checkpoints", "dshm"]
    paths = st.lists(st.sampled_from(["/data", "/mnt/s3", "/scratch", "/etc/cfg"]), unique=True, max_size=2)
    pod: dict[str, Any] = {"volumes": [{"name": n, **draw(plausible_sources)} for n in names]}
    if names:
        pod["volumeMounts"] = [{"name": draw(st.sampled_from(names)), "mountPath": p,
                                "readOnly": draw(st.booleans())} for p in draw(paths)]
    pod["initContainers"] = [
        {"name": name, "image": "busybox:1", **draw(st.fixed_dictionaries({}, optional={
            "restartPolicy": st.just("Always"), "env": st.lists(env_vars, max_size=1), "resources": resources,
            "ports": st.just([{"containerPort": 8080, "name": "metrics"}]),
            "securityContext": security_contexts})),
         "volumeMounts": [{"name": draw(st.sampled_from(mountable)), "mountPath": p} for p in draw(paths)]}
        for name in draw(st.lists(st.sampled_from(["sidecar", "fetch"]), unique=True, max_size=2))]
    pod.update(draw(st.fixed_dictionaries({}, optional={
        "labels": st.dictionaries(st.sampled_from(["team", "example.com/cost-center"]), label_values, max_size=2),
        "annotations": st.dictionaries(st.sampled_from(["karpenter.sh/do-not-disrupt", "Example.com/Note"]),
                                       text(), max_size=2),
        "imagePullSecrets": st.just([{"name": "regcred"}]), "schedulerName": st.just("my-scheduler")})))
    return pod


pods = maybe(any_pods, coherent_pods())


def storage_using(field: str) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries({field: subdomains, "mountPath": maybe(
        st.sampled_from(["/dev/shm", "/dev/shm/x", "relative", "/a\nb"]),
        st.sampled_from(["/checkpoints", "/fsx/", "/"]))}, optional={
        "size": quantities,
        "accessMode": maybe(st.just("ReadWriteOnce"), st.just("ReadWriteMany"))})


storages = maybe(st.fixed_dictionaries({}, optional={"storageClassName": subdomains, "existingClaim": subdomains}),
                 st.one_of(storage_using("storageClassName"), storage_using("existingClaim")))
specs = st.fixed_dictionaries(
    {"image": maybe(st.one_of(text(), st.sampled_from([" worker:1", "worker:1 ", "", "a b"])),
                    st.sampled_from(["worker:1", "123.dkr.ecr.us-west-2.amazonaws.com/rtj:0.1"])),
     "nodes": maybe(st.fixed_dictionaries({"count": st.integers(-1, 2000)},
                                          optional={"spares": st.integers(-1, 65)}),
                    st.fixed_dictionaries({"count": st.integers(1, 4)})),
     "storage": storages,
     # Always present (possibly empty), so that most examples exercise the typed fields.
     "env": st.lists(env_vars, max_size=4),
     "placement": st.fixed_dictionaries(
         {"tolerations": maybe(st.just("all"), st.lists(tolerations, max_size=3))},
         optional={"instanceType": label_values, "nodeSelector": st.dictionaries(label_keys, label_values, max_size=3),
                   "affinity": affinities}),
     "resources": resources},
    optional={
        "gpusPerNode": maybe(st.just(17), st.sampled_from([0, 8])), "efaPerNode": st.sampled_from([0, 32]),
        "procsPerNode": st.integers(1, 4), "shmSize": quantities,
        "serviceAccountName": subdomains, "priorityClassName": subdomains, "pod": pods,
        "resiliency": st.fixed_dictionaries({}, optional={"rendezvousPort": maybe(st.integers(0, 70000),
                                                                                    st.integers(1024, 65535))}),
        "checkpoint": st.fixed_dictionaries({}, optional={"dir": maybe(
            st.sampled_from(["..", "a/../..", "/etc", "/checkpoints/../x", "/checkpointsX/y"]),
            st.sampled_from(["run1", "team/run1", "/checkpoints/run1", "./x", "/fsx/x"]))}),
        "suspend": st.booleans(),
    },
)
pod_bodies = st.builds(lambda pod: issue_example("train", pod=pod), pods)
bodies = st.builds(lambda name, spec: {"apiVersion": api.API_VERSION, "kind": api.KIND, "spec": spec,
                                       "metadata": {"name": name, "namespace": "default", "uid": "u1"}},
                   names, specs)


def issue_example(name: str = "train", **spec: Any) -> dict[str, Any]:
    base = {"image": "worker:1", "nodes": {"count": 2}, "storage": {"storageClassName": "fsx-sc"}}
    return {"apiVersion": api.API_VERSION, "kind": api.KIND, "spec": {**base, **spec},
            "metadata": {"name": name, "namespace": "default", "uid": "u1"}}


# The inputs issue 9 reported (item 2 and 3, and item 1's API server rejections), always tried first.
ISSUE_EXAMPLES = [
    issue_example("70b-run"), issue_example("llama.v2"),
    issue_example(env=[{"value": "x"}]), issue_example(env=[{"name": "A", "value": 64}]),
    issue_example(placement={"nodeSelector": {"team": "ml research"}}),
    issue_example(placement={"nodeSelector": {"bad key": "x"}}), issue_example(placement={"instanceType": "p5 48x"}),
    issue_example(placement={"tolerations": [{"operator": "Equal", "value": "x"}]}),
    issue_example(image=" worker:1"), issue_example(serviceAccountName="Trainer"),
    issue_example(priorityClassName="a..b"), issue_example(storage={"storageClassName": "fsx-sc", "size": "0"}),
    issue_example(storage={"storageClassName": "fsx-sc", "mountPath": "/dev/shm"}),
    issue_example(resources={"limits": "8"}), issue_example(resources={"limits": ["cpu"]}),
    issue_example(resources={"limits": None}), issue_example(resiliency={"rendezvousPort": 65534}),
    issue_example(checkpoint={"dir": "../other-job"}),
    # Issue 18.4: the pod template's parts.
    issue_example(pod={"labels": {"training.rtj.dev/name": "other"}}),
    issue_example(pod={"annotations": {"batch.kubernetes.io/job-completion-index": "3"}}),
    issue_example(pod={"volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "imagenet"}}],
                       "volumeMounts": [{"name": "data", "mountPath": "/data", "readOnly": True}]}),
    issue_example(pod={"volumeMounts": [{"name": "missing", "mountPath": "/data"}]}),
    issue_example(pod={"initContainers": [{"name": "worker", "image": "busybox:1"}]}),
    issue_example(pod={"initContainers": [{"name": "sidecar", "image": "busybox:1", "restartPolicy": "Always",
                                           "volumeMounts": [{"name": "checkpoints", "mountPath": "/ckpt"}]}],
                       "imagePullSecrets": [{"name": "regcred"}], "schedulerName": "my-scheduler",
                       "labels": {"team": "ml"}, "annotations": {"karpenter.sh/do-not-disrupt": "true"}}),
]


def with_issue_examples(test: Any) -> Any:
    for body in ISSUE_EXAMPLES:
        test = example(body)(test)
    return test


def check(body: dict[str, Any], seen: Counter) -> None:
    errors = rejection(body)
    if errors:
        seen["rejected"] += 1
        unclear = [e for e in errors if not any(f in e for f in FIELDS)]
        assert not unclear, f"rejections that name no field: {unclear}"
        return
    seen["accepted"] += 1
    for manifest in children_for_spec(body):
        for version in K8S_VERSIONS:
            kubernetes_validate.validate(manifest, version, strict=True)
        assert server_side_errors(manifest) == [], (manifest["kind"], json.dumps(body["spec"])[:2000])

