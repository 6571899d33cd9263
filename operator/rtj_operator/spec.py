"""Reading an RTJ: schema defaults, schema validation and the checks a schema cannot express."""

from __future__ import annotations

import copy
import functools
import itertools
import json
import posixpath
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any

import jsonschema

from . import api

# Pod hostnames are "<job>-<index>" and must be DNS labels (63 chars): leave room for the index (a Job
# name, '<name>-a<attempt>', keeps to this length: builders/names.job_name).
MAX_NAME_LENGTH = api.MAX_NAME_LENGTH


@dataclass(frozen=True)
class RTJ:
    """One ResilientTrainingJob, with its spec defaulted as the API server would."""

    name: str
    namespace: str
    uid: str
    generation: int
    spec: dict[str, Any]
    labels: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> RTJ:
        meta = body.get("metadata", {})
        return cls(
            name=meta["name"],
            namespace=meta.get("namespace", "default"),
            uid=meta.get("uid", ""),
            generation=int(meta.get("generation", 1)),
            spec=with_defaults(body.get("spec") or {}),
            labels=dict(meta.get("labels") or {}),
        )

    @property
    def queue_name(self) -> str:
        """The Kueue LocalQueue the gang is submitted to ('' : none, the operator runs it by itself)."""
        return str(self.spec.get("queueName") or self.labels.get(api.KUEUE_QUEUE_LABEL) or "")

    @property
    def queue_labels(self) -> dict[str, str]:
        """The Kueue labels the Job carries: its queue and, if the RTJ names one, its WorkloadPriorityClass."""
        if not self.queue_name:
            return {}
        out = {api.KUEUE_QUEUE_LABEL: self.queue_name}
        if self.labels.get(api.KUEUE_PRIORITY_LABEL):
            out[api.KUEUE_PRIORITY_LABEL] = self.labels[api.KUEUE_PRIORITY_LABEL]
        return out

    @property
    def owner(self) -> dict[str, Any]:
        """A minimal owner body, as `kopf.adopt` expects."""
        return {"apiVersion": api.API_VERSION, "kind": api.KIND,
                "metadata": {"name": self.name, "namespace": self.namespace, "uid": self.uid}}

    # Derived values used by several builders; kept here so they agree.
    @property
    def nodes(self) -> int:
        return int(self.spec["nodes"]["count"])

    @property
    def spares(self) -> int:
        return int(self.spec["nodes"].get("spares", 0))

    @property
    def pods(self) -> int:
        """Worker pods: the training nodes and the spares."""
        return self.nodes + self.spares

    @property
    def procs_per_node(self) -> int:
        gpus = int(self.spec["gpusPerNode"])
        return gpus if gpus > 0 else int(self.spec.get("procsPerNode", 1))

    @property
    def checkpoint_dir(self) -> str:
        """checkpoint.dir relative to the mount (or absolute, inside it; see semantic_errors)."""
        sub = self.spec["checkpoint"].get("dir") or self.name
        return posixpath.normpath(posixpath.join(self.spec["storage"]["mountPath"], sub))


def apply_defaults(schema: dict[str, Any], value: Any) -> Any:
    """Structural defaulting, as kube-apiserver does it: fill missing fields, then recurse."""
    if schema.get("type") == "object" and isinstance(value, dict):
        for key, sub in schema.get("properties", {}).items():
            if key not in value and "default" in sub:
                value[key] = copy.deepcopy(sub["default"])
            if key in value:
                value[key] = apply_defaults(sub, value[key])
    elif schema.get("type") == "array" and isinstance(value, list) and "items" in schema:
        value = [apply_defaults(schema["items"], item) for item in value]
    return value


def prune(schema: dict[str, Any], value: Any) -> Any:
    """Drop fields the schema does not declare, and nulls (no field is nullable), as kube-apiserver
    does before defaulting."""
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return value
    if isinstance(value, dict) and "properties" in schema:
        props = schema["properties"]
        return {k: prune(props[k], v) for k, v in value.items() if k in props and v is not None}
    if isinstance(value, dict) and isinstance(schema.get("additionalProperties"), dict):
        return {k: prune(schema["additionalProperties"], v) for k, v in value.items()}
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [prune(schema["items"], item) for item in value]
    return value


def with_defaults(spec: dict[str, Any]) -> dict[str, Any]:
    """The spec as kube-apiserver stores it (unknown fields pruned, then defaults applied), and the
    defaults that depend on other fields (the in-process timeouts, by world size)."""
    spec = apply_defaults(api.SPEC_SCHEMA, prune(api.SPEC_SCHEMA, copy.deepcopy(spec)))
    ipr = (spec.get("resiliency") or {}).get("inProcessRestart")
    if not isinstance(ipr, dict):
        return spec  # not a spec the schema takes: its errors say so
    try:
        gpus = int(spec.get("gpusPerNode") or 0)
        ranks = int((spec.get("nodes") or {}).get("count") or 1) * (gpus if gpus > 0 else
                                                                      int(spec.get("procsPerNode") or 1))
    except (TypeError, ValueError):
        ranks = 1
    soft, hard = api.IN_PROCESS_TIMEOUTS[ranks >= api.LARGE_WORLD]
    ipr.setdefault("softTimeoutSeconds", soft)
    ipr.setdefault("hardTimeoutSeconds", hard)
    return spec


def _re2(pattern: str) -> str:
    """An OpenAPI `pattern` as Go's RE2 reads it: '$' is the end of the text (Python's '\\Z')."""
    return re.sub(r"(?<!\\)\$", r"\\Z", pattern)


def _pattern(validator: Any, pattern: str, instance: Any, schema: dict[str, Any]) -> Iterable[Any]:
    if validator.is_type(instance, "string") and not re.search(_re2(pattern), instance):
        yield jsonschema.ValidationError(f"{instance!r} does not match {pattern!r}")


_Validator = jsonschema.validators.extend(jsonschema.Draft7Validator, {"pattern": _pattern})


@functools.cache
def _validator() -> Any:
    return _Validator(api.openapi_schema())


def schema_errors(body: dict[str, Any], strict: bool = True) -> list[str]:
    """What kube-apiserver would reject at `kubectl apply`: with `strict` (kubectl's default field
    validation) fields the schema does not declare; then the schema's rules, with defaults applied
    first, as the server does. Without strict validation (other clients) undeclared fields are pruned
    (with_defaults)."""
    unknown = _unknown_fields(api.openapi_schema(), body, "") if strict else []
    if unknown:
        return unknown
    body = copy.deepcopy(body)
    if isinstance(body.get("spec"), dict):
        body["spec"] = with_defaults(body["spec"])
    errors = sorted(_validator().iter_errors(body), key=lambda e: list(e.absolute_path))
    messages = [f"{'.'.join(str(p) for p in e.absolute_path) or '<root>'}: {e.message}" for e in errors]
    return messages or _list_map_errors(api.openapi_schema(), body, "")


def _unknown_fields(schema: dict[str, Any], value: Any, path: str) -> list[str]:
    """kube-apiserver's strict decoding: 'unknown field "spec.pod.containers[0].foo"'."""
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return []
    errors: list[str] = []
    if isinstance(value, dict) and "properties" in schema:
        for key, item in value.items():
            where = f"{path}.{key}" if path else str(key)
            if key in schema["properties"]:
                errors += _unknown_fields(schema["properties"][key], item, where)
            else:
                errors.append(f'unknown field "{where}"')
    elif isinstance(value, dict) and isinstance(schema.get("additionalProperties"), dict):
        for key, item in value.items():
            errors += _unknown_fields(schema["additionalProperties"], item, f"{path}.{key}" if path else str(key))
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            errors += _unknown_fields(schema["items"], item, f"{path}[{i}]")
    return errors


def _list_map_errors(schema: dict[str, Any], value: Any, path: str) -> list[str]:
    """Duplicate keys in x-kubernetes-list-type map (or set) lists, which kube-apiserver rejects
    ("Duplicate value") and JSON Schema cannot express."""
    errors: list[str] = []
    if isinstance(value, dict):
        props = schema.get("properties") or {}
        extra = schema.get("additionalProperties")
        for key, item in value.items():
            sub = props.get(key) or (extra if isinstance(extra, dict) else None)
            if sub is not None:
                errors += _list_map_errors(sub, item, f"{path}.{key}" if path else str(key))
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        kind, keys = schema.get("x-kubernetes-list-type"), schema.get("x-kubernetes-list-map-keys") or []
        if kind in ("map", "set"):
            seen = [json.dumps([v.get(k) for k in keys] if kind == "map" and isinstance(v, dict) else v,
                               sort_keys=True) for v in value]
            errors += [f"{path}[{i}]: Duplicate value: {seen[i]}" for i in range(len(value)) if seen[i] in seen[:i]]
        for i, item in enumerate(value):
            errors += _list_map_errors(schema["items"], item, f"{path}[{i}]")
    return errors


_QUANTITY_RE = re.compile(r"([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))(?:([KMGTPE]i|[numkMGTPE])|[eE]([+-]?[0-9]+))?")
_QUANTITY_SUFFIXES: dict[str, Decimal] = {
    "": Decimal(1), "n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"),
    **{s: Decimal(1000) ** (i + 1) for i, s in enumerate("kMGTPE")},
    **{f"{s}i": Decimal(1024) ** (i + 1) for i, s in enumerate("KMGTPE")},
}


def parse_quantity(value: Any) -> Decimal | None:
    """A resource.Quantity (string or integer) as a number, or None if Kubernetes would reject it."""
    if isinstance(value, bool) or not isinstance(value, int | str):
        return None
    if isinstance(value, int):
        return Decimal(value)
    match = _QUANTITY_RE.fullmatch(value)
    if not match or (match[3] and abs(int(match[3])) > 1000):
        return None
    number = Decimal(match[1])
    try:
        return number.scaleb(int(match[3])) if match[3] else number * _QUANTITY_SUFFIXES[match[2] or ""]
    except InvalidOperation:
        return None


def semantic_errors(rtj: RTJ, allowed_service_accounts: frozenset[str] | None = None) -> list[str]:
    """Checks the schema cannot express. Any error here blocks creating or changing children.

    With an allow-list (see allowed_service_accounts_from_env), spec.serviceAccountName must be in it.
    """
    shape = _spec_shape_errors(rtj.spec)
    if shape:  # the checks below assume the schema's types
        return [f"spec.{e}" for e in shape]
    spec, errors = rtj.spec, []
    errors += _name_errors(rtj.name)
    label_queue = rtj.labels.get(api.KUEUE_QUEUE_LABEL)
    if spec.get("queueName") and label_queue and label_queue != spec["queueName"]:
        errors.append(f"spec.queueName ({spec['queueName']}) and the label {api.KUEUE_QUEUE_LABEL} ({label_queue}) "
                      "name different queues: set one")
    if spec["nodes"]["spares"] and not spec["coordinator"]["enabled"]:
        errors.append("nodes.spares needs coordinator.enabled: a spare may be node 0, so node 0's pod cannot host "
                      "the rendezvous")
    res = spec["resiliency"]
    if res["heartbeatTimeoutSeconds"] <= res["monitorIntervalSeconds"]:
        errors.append(f"resiliency.heartbeatTimeoutSeconds ({res['heartbeatTimeoutSeconds']}) must be "
                      f"greater than resiliency.monitorIntervalSeconds ({res['monitorIntervalSeconds']})")
    if res["initialHeartbeatTimeoutSeconds"] <= res["monitorIntervalSeconds"]:
        errors.append(f"resiliency.initialHeartbeatTimeoutSeconds ({res['initialHeartbeatTimeoutSeconds']})"
                      f" must be greater than resiliency.monitorIntervalSeconds "
                      f"({res['monitorIntervalSeconds']})")
    ipr = res["inProcessRestart"]
    if ipr["softTimeoutSeconds"] >= ipr["hardTimeoutSeconds"]:
        errors.append(f"resiliency.inProcessRestart.softTimeoutSeconds ({ipr['softTimeoutSeconds']}) must "
                      f"be less than hardTimeoutSeconds ({ipr['hardTimeoutSeconds']})")
    errors += _timeout_order_errors(spec)
    port = res["rendezvousPort"]
    if EPHEMERAL_PORTS[0] <= port + 2 and port <= EPHEMERAL_PORTS[1]:
        errors.append(f"resiliency.rendezvousPort ({port}): ports {port}..{port + 2} overlap the Linux ephemeral "
                      f"range {EPHEMERAL_PORTS[0]}-{EPHEMERAL_PORTS[1]}, where any process's outgoing connection "
                      "or the launcher's own free-port choice may take them; use one below "
                      f"{EPHEMERAL_PORTS[0] - 2}")
    storage = spec["storage"]
    claim, sc = storage.get("existingClaim"), storage.get("storageClassName")
    if bool(claim) == bool(sc):
        errors.append("storage: set exactly one of existingClaim (use a PVC) or storageClassName "
                      "(create one)")
    if sc and rtj.pods > 1 and storage["accessMode"] != "ReadWriteMany":
        errors.append(f"storage.accessMode must be ReadWriteMany for a shared checkpoint volume across "
                      f"{rtj.pods} nodes (got {storage['accessMode']})")
    size = parse_quantity(storage["size"])
    if sc and (size is None or size <= 0):
        errors.append(f"storage.size {storage['size']!r} must be a size greater than 0, such as 1200Gi")
    if parse_quantity(spec["shmSize"]) is None:
        errors.append(f"shmSize {spec['shmSize']!r} is not a valid size such as 64Gi")
    per_node = spec["checkpoint"]["memoryCopies"]["maxBytesPerNode"]
    if (parse_quantity(per_node) or 0) < 1:
        errors.append(f"checkpoint.memoryCopies.maxBytesPerNode {per_node!r} must be a size of at least 1 byte, "
                      "such as 512Gi")
    if spec["gpusPerNode"] == 0 and spec["efaPerNode"] > 0:
        errors.append("efaPerNode requires gpusPerNode > 0 (EFA is only used for GPU collectives)")
    names = [e.get("name") for e in spec.get("env") or []]
    reserved = sorted({n for n in names if n in RESERVED_ENV})
    if reserved:
        errors.append(f"env must not set {', '.join(reserved)}: the operator sets them")
    errors += _storage_path_errors(storage, spec["checkpoint"])
    errors += _env_errors(spec.get("env") or [])
    errors += _placement_errors(spec["placement"])
    errors += _placement_errors({"nodeSelector": spec["coordinator"].get("nodeSelector"),
                                 "tolerations": spec["coordinator"].get("tolerations")}, "coordinator")
    errors += _resources_errors(spec.get("resources") or {})
    errors += _pod_errors(spec)
    errors += _service_account_errors(rtj, allowed_service_accounts)
    if ipr["enabled"]:
        for env in spec.get("env") or []:
            required = NVRX_INPROCESS_ENV.get(env.get("name"))
            if required is not None and env.get("value") != required:
                errors.append(f"env {env.get('name')} must be {required!r} with in-process restart "
                              f"(NVRx known issue), got {env.get('value')!r}")
    return errors


# Linux's default net.ipv4.ip_local_port_range.
EPHEMERAL_PORTS = (32768, 60999)
# What NVRx's in-process restart requires of NCCL (see builders/job.py).
NVRX_INPROCESS_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_NCCL_RETHROW_CUDA_ERRORS": "0"}


def nccl_timeout(spec: dict[str, Any]) -> int:
    """The training process group's collective timeout (resiliency.ncclTimeoutSeconds, or its default):
    see _timeout_order_errors for why it depends on the backend."""
    res = spec["resiliency"]
    if res.get("ncclTimeoutSeconds"):
        return int(res["ncclTimeoutSeconds"])
    ipr = res["inProcessRestart"]
    if spec["gpusPerNode"] > 0:
        if not ipr["enabled"]:
            return min(600, int(res["heartbeatTimeoutSeconds"]) - 1)
        # Past the hard timeout (the Wrapper acts first), below the heartbeat timeout (the rank monitor
        # would kill a rank still waiting): halfway, at most a minute past the hard timeout.
        hard, heartbeat = int(ipr["hardTimeoutSeconds"]), int(res["heartbeatTimeoutSeconds"])
        return hard + max(1, min(60, (heartbeat - hard) // 2))
    return min(30, int(ipr["softTimeoutSeconds"]) - 1) if ipr["enabled"] else 30


def _timeout_order_errors(spec: dict[str, Any]) -> list[str]:
    """Each layer must give up before the one above it steps in, or the cheaper recovery never gets
    its chance: in-process soft < hard < heartbeat < initial heartbeat. The collective timeout sits
    where its backend needs it:
    - NCCL: its watchdog kills the process when a collective times out, which no in-process restart
      survives; so with in-process restart it must exceed the hard timeout (NVRx usage guide: "the
      PyTorch NCCL watchdog must either be disabled or configured with a timeout longer than the
      hard_timeout"), and the Wrapper's soft timeout aborts a hang first;
    - gloo: a timed-out collective raises in the healthy ranks, which is how they leave a failed
      iteration and join the in-process restart; so it must be below the soft timeout.
    Either way it stays below the heartbeat timeout, or the rank monitor kills a rank still waiting."""
    res = spec["resiliency"]
    ipr = res["inProcessRestart"]
    nccl, gpu = nccl_timeout(spec), spec["gpusPerNode"] > 0
    chain = []
    if ipr["enabled"]:
        chain += [("resiliency.inProcessRestart.softTimeoutSeconds", ipr["softTimeoutSeconds"]),
                  ("resiliency.inProcessRestart.hardTimeoutSeconds", ipr["hardTimeoutSeconds"])]
    chain += [("resiliency.heartbeatTimeoutSeconds", res["heartbeatTimeoutSeconds"]),
              ("resiliency.initialHeartbeatTimeoutSeconds", res["initialHeartbeatTimeoutSeconds"])]
    order = " < ".join(name.rsplit(".", 1)[1] for name, _ in chain)
    errors = []
    for (lower, low), (upper, high) in itertools.pairwise(chain):
        if low >= high and not (lower.endswith("softTimeoutSeconds") and upper.endswith("hardTimeoutSeconds")):
            errors.append(f"{lower} ({low}) must be less than {upper} ({high}); timeouts must grow in the "
                          f"order {order}")
    what = f"resiliency.ncclTimeoutSeconds ({nccl}{'' if res.get('ncclTimeoutSeconds') else ', its default'})"
    if ipr["enabled"] and gpu and nccl <= ipr["hardTimeoutSeconds"]:
        errors.append(f"{what} must exceed resiliency.inProcessRestart.hardTimeoutSeconds "
                      f"({ipr['hardTimeoutSeconds']}) with NCCL: the NCCL watchdog kills the process when it "
                      "fires, so a hang it catches first is never restarted in process (NVRx usage guide)")
    if ipr["enabled"] and not gpu and nccl >= ipr["softTimeoutSeconds"]:
        errors.append(f"{what} must be less than resiliency.inProcessRestart.softTimeoutSeconds "
                      f"({ipr['softTimeoutSeconds']}) with gloo (gpusPerNode 0): a timed-out collective is "
                      "how the healthy ranks leave a failed iteration and restart in process")
    if nccl >= res["heartbeatTimeoutSeconds"]:
        errors.append(f"{what} must be less than resiliency.heartbeatTimeoutSeconds "
                      f"({res['heartbeatTimeoutSeconds']}): the rank monitor would kill a rank still waiting in "
                      "a collective")
    return errors


def _spec_shape_errors(spec: Any) -> list[str]:
    """The spec against the CRD's schema (kube-apiserver has checked it already, the tests have not)."""
    errors = sorted(_spec_validator().iter_errors(spec), key=lambda e: list(e.absolute_path))
    return [f"{'.'.join(str(p) for p in e.absolute_path) or '<spec>'}: {e.message}" for e in errors]


@functools.cache
def _spec_validator() -> Any:
    return _Validator(api.SPEC_SCHEMA)


def _matches(pattern: str, value: Any) -> bool:
    return isinstance(value, str) and re.fullmatch(pattern, value) is not None


def is_label_key(key: Any) -> bool:
    """A qualified name: [DNS-1123 subdomain prefix of at most 253 /] name of at most 63."""
    return _matches(api.LABEL_KEY, key) and len(key.partition("/")[0] if "/" in key else "") <= 253


def _name_errors(name: str) -> list[str]:
    if len(name) > MAX_NAME_LENGTH:
        return [f"metadata.name must be at most {MAX_NAME_LENGTH} characters so that pod "
                f"hostnames '<name>-a<attempt>-<index>' stay DNS labels (got {len(name)})"]
    if not _matches(api.DNS1035_LABEL, name):
        return [f"metadata.name {name!r} must be a DNS-1035 label (lowercase letters, digits and '-', "
                f"starting with a letter and ending with a letter or digit, no dots): it names the "
                f"Service and, as '<name>-a<attempt>-<index>', every pod's hostname"]
    return []


def _storage_path_errors(storage: dict[str, Any], checkpoint: dict[str, Any]) -> list[str]:
    errors, mount = [], posixpath.normpath(storage["mountPath"])
    if mount == "/dev/shm" or mount.startswith("/dev/shm/"):
        errors.append(f"storage.mountPath {storage['mountPath']!r} must not be /dev/shm or under it: "
                      f"the shared-memory volume is mounted there")
    sub = checkpoint.get("dir") or ""
    if ".." in sub.split("/"):
        errors.append(f"checkpoint.dir {sub!r} must not contain '..' components")
    elif sub.startswith("/") and not (posixpath.normpath(sub) + "/").startswith(mount.rstrip("/") + "/"):
        errors.append(f"checkpoint.dir {sub!r} is absolute but not inside storage.mountPath {mount!r}: "
                      f"use a path relative to the mount")
    return errors


_CPU_DIVISORS = frozenset({"1m", "1"})
_MEMORY_DIVISORS = frozenset({"1", *(f"1{s}" for s in ("k", "M", "G", "T", "P", "E", "Ki", "Mi", "Gi", "Ti",
                                                           "Pi", "Ei"))})
_SUBSCRIPTED_FIELD = re.compile(r"metadata\.(labels|annotations)\['(.*)'\]")


def _env_errors(env: list[dict[str, Any]]) -> list[str]:
    errors, seen = [], set()
    for i, var in enumerate(env):
        where, name = f"env[{i}] ({var['name']})", var["name"]
        if name in seen:
            errors.append(f"{where}: duplicate name")
        seen.add(name)
        source = var.get("valueFrom")
        if source and var.get("value"):
            errors.append(f"{where}: set value or valueFrom, not both")
        errors += [f"{where}.valueFrom.{e}" for e in _env_source_errors(source or {})]
    return errors


def _env_source_errors(source: dict[str, Any]) -> list[str]:
    errors = []
    field = (source.get("fieldRef") or {}).get("fieldPath", "")
    sub = _SUBSCRIPTED_FIELD.fullmatch(field)
    if sub and not is_label_key(sub[2].lower() if sub[1] == "annotations" else sub[2]):
        errors.append(f"fieldRef.fieldPath {field!r}: {sub[2]!r} is not a valid {sub[1][:-1]} key")
    ref = source.get("resourceFieldRef") or {}
    divisor = ref.get("divisor")
    if divisor not in (None, 0, "0"):
        valid = _CPU_DIVISORS if ref["resource"].endswith(".cpu") else _MEMORY_DIVISORS
        if str(divisor) not in valid:
            errors.append(f"resourceFieldRef.divisor {divisor!r} must be one of {', '.join(sorted(valid))} "
                          f"for {ref['resource']}")
    for kind in ("configMapKeyRef", "secretKeyRef"):
        key = (source.get(kind) or {}).get("key")
        if key is not None and (key in (".", "..") or key.startswith("..")):
            errors.append(f"{kind}.key {key!r} must not be '.' or start with '..'")
    return errors


def _placement_errors(placement: dict[str, Any], where: str = "placement") -> list[str]:
    errors = [f"{where}.nodeSelector key {k!r} is not a valid label key"
              for k in placement.get("nodeSelector") or {} if not is_label_key(k)]
    for i, tol in enumerate(placement.get("tolerations") or []):
        errors += [f"{where}.tolerations[{i}]: {e}" for e in _toleration_errors(tol)]
    errors += [f"{where}.affinity.{e}" for e in _affinity_errors(placement.get("affinity") or {})]
    return errors


def _toleration_errors(tol: dict[str, Any]) -> list[str]:
    errors, exists = [], tol.get("operator") == "Exists"
    if not tol.get("key") and not exists:
        errors.append("a toleration without a key must use operator Exists")
    if exists and tol.get("value"):
        errors.append("a toleration with operator Exists must not set a value")
    if "tolerationSeconds" in tol and tol.get("effect") != "NoExecute":
        errors.append("tolerationSeconds requires effect NoExecute")
    return errors


def _requirement_errors(req: dict[str, Any], where: str, node: bool = False) -> list[str]:
    op, values = req["operator"], req.get("values") or []
    if op in ("In", "NotIn") and not values:
        return [f"{where}: operator {op} needs values"]
    if op in ("Exists", "DoesNotExist") and values:
        return [f"{where}: operator {op} takes no values"]
    if op in ("Gt", "Lt") and (len(values) != 1 or not re.fullmatch(r"-?[0-9]+", values[0])):
        return [f"{where}: operator {op} needs exactly one integer value"]
    if node and req["key"] == "metadata.name" and len(values) != 1:
        return [f"{where}: matchFields need exactly one value"]
    return []


def _selector_errors(selector: dict[str, Any], where: str) -> list[str]:
    errors = [f"{where}.matchLabels key {k!r} is not a valid label key"
              for k in selector.get("matchLabels") or {} if not is_label_key(k)]
    for i, req in enumerate(selector.get("matchExpressions") or []):
        errors += _requirement_errors(req, f"{where}.matchExpressions[{i}]")
    return errors


def _affinity_errors(affinity: dict[str, Any]) -> list[str]:
    errors, node = [], affinity.get("nodeAffinity") or {}
    terms = [(f"nodeAffinity.required.nodeSelectorTerms[{i}]", t) for i, t in enumerate(
        (node.get("requiredDuringSchedulingIgnoredDuringExecution") or {}).get("nodeSelectorTerms") or [])]
    terms += [(f"nodeAffinity.preferred[{i}].preference", p["preference"]) for i, p in enumerate(
        node.get("preferredDuringSchedulingIgnoredDuringExecution") or [])]
    for where, term in terms:
        for kind in ("matchExpressions", "matchFields"):
            for i, req in enumerate(term.get(kind) or []):
                errors += _requirement_errors(req, f"{where}.{kind}[{i}]", node=kind == "matchFields")
    for kind in ("podAffinity", "podAntiAffinity"):
        pod = affinity.get(kind) or {}
        pod_terms = [(f"{kind}.required[{i}]", t) for i, t in enumerate(
            pod.get("requiredDuringSchedulingIgnoredDuringExecution") or [])]
        pod_terms += [(f"{kind}.preferred[{i}].podAffinityTerm", w["podAffinityTerm"]) for i, w in enumerate(
            pod.get("preferredDuringSchedulingIgnoredDuringExecution") or [])]
        for where, term in pod_terms:
            for sel in ("labelSelector", "namespaceSelector"):
                errors += _selector_errors(term.get(sel) or {}, f"{where}.{sel}")
            if not is_label_key(term["topologyKey"]):
                errors.append(f"{where}.topologyKey {term['topologyKey']!r} is not a valid label key")
    return errors


_STANDARD_RESOURCES = frozenset({"cpu", "memory", "ephemeral-storage"})
# Set by the operator from gpusPerNode/efaPerNode (builders/job.py).
_ACCELERATORS = frozenset({"nvidia.com/gpu", "vpc.amazonaws.com/efa"})


def _resources_errors(resources: dict[str, Any], sidecar: bool = False) -> list[str]:
    errors = []
    limits, requests = resources.get("limits") or {}, resources.get("requests") or {}
    for kind, values in (("limits", limits), ("requests", requests)):
        for name, value in values.items():
            errors += [f"resources.{kind}[{name}]: {e}" for e in _resource_errors(name, value, sidecar)]
    for name, value in requests.items():
        request, limit = parse_quantity(value), parse_quantity(limits.get(name))
        extended = name not in _STANDARD_RESOURCES
        if request is None or (name in limits and limit is None):
            continue
        if extended and limit != request:
            errors.append(f"resources.requests[{name}]: an extended resource needs a limit equal to its request")
        elif limit is not None and request > limit:
            errors.append(f"resources.requests[{name}] ({value}) must not exceed the limit ({limits[name]})")
    return errors


def _resource_errors(name: str, value: Any, sidecar: bool = False) -> list[str]:
    if name in _ACCELERATORS:
        if sidecar:
            return ["the worker's GPUs and EFA devices are not an init container's"]
        return ["set by the operator from gpusPerNode/efaPerNode: set those instead"]
    if name not in _STANDARD_RESOURCES and (
            not _matches(api.RESOURCE_NAME, name) or "kubernetes.io/" in name or not is_label_key(name)):
        return ["not a container resource (cpu, memory, ephemeral-storage or an extended resource "
                "such as example.com/device)"]
    quantity = parse_quantity(value)
    if quantity is None or quantity < 0:
        return [f"{value!r} is not a non-negative quantity such as 8, 500m or 16Gi"]
    if name not in _STANDARD_RESOURCES and quantity % 1:
        return [f"{value!r}: an extended resource must be a whole number"]
    return []


def _pod_errors(spec: dict[str, Any]) -> list[str]:
    """spec.pod: what its CEL rules check (mirrored, so the operator never builds a pod the API server
    rejects), and what only the whole spec can tell (the operator's own mount paths)."""
    pod = spec.get("pod") or {}
    errors = []
    for key in pod.get("labels") or {}:
        if not is_label_key(key):
            errors.append(f"pod.labels key {key!r} is not a valid label key")
        elif _reserved(key, api.RESERVED_LABEL_PREFIXES, api.RESERVED_LABELS):
            errors.append(f"pod.labels key {key!r} is the operator's or the Job controller's")
    for key in pod.get("annotations") or {}:
        if not is_label_key(key.lower()):
            errors.append(f"pod.annotations key {key!r} is not a qualified name")
        elif _reserved(key.lower(), api.RESERVED_ANNOTATION_PREFIXES, ()):
            errors.append(f"pod.annotations key {key!r} is the operator's or the Job controller's")
    volumes = pod.get("volumes") or []
    names = {v["name"] for v in volumes}
    for i, volume in enumerate(volumes):
        errors += [f"pod.volumes[{i}] ({volume['name']}): {e}" for e in _volume_errors(volume)]
    mountable = names | set(api.RESERVED_VOLUMES)
    reserved_paths = {api.SHM_PATH: "/dev/shm", posixpath.normpath(spec["storage"]["mountPath"]): "storage.mountPath"}
    for i, mount in enumerate(pod.get("volumeMounts") or []):
        taken = reserved_paths.get(posixpath.normpath(mount["mountPath"]))
        if taken:
            errors.append(f"pod.volumeMounts[{i}].mountPath {mount['mountPath']!r} is {taken}: the operator mounts it")
    errors += [f"pod.{e}" for e in _mount_errors(pod.get("volumeMounts") or [], mountable)]
    for i, container in enumerate(pod.get("initContainers") or []):
        where = f"pod.initContainers[{i}] ({container['name']})"
        if container["name"] == api.CONTAINER_NAME:
            errors.append(f"{where}: the name {api.CONTAINER_NAME!r} is the operator's")
        errors += [f"{where}.{e}" for e in _mount_errors(container.get("volumeMounts") or [], mountable)]
        errors += [f"{where}.{e}" for e in _env_errors(container.get("env") or [])]
        errors += [f"{where}.{e}" for e in _resources_errors(container.get("resources") or {}, sidecar=True)]
        errors += [f"{where}.{e}" for e in _security_context_errors(container.get("securityContext") or {})]
        ports = [p["name"] for p in container.get("ports") or [] if p.get("name")]
        for name in sorted({n for n in ports if ports.count(n) > 1}):
            errors.append(f"{where}.ports: the name {name!r} is used twice")
        for name in ports:
            if not re.search("[a-z]", name) or "--" in name:
                errors.append(f"{where}.ports name {name!r}: an IANA service name has a letter and no '--'")
    return errors


def _reserved(key: str, prefixes: tuple[str, ...], exact: tuple[str, ...]) -> bool:
    return key.startswith(prefixes) or key in exact


def _has_backsteps(path: str) -> bool:
    return ".." in path.split("/")


def _volume_errors(volume: dict[str, Any]) -> list[str]:
    errors = []
    if volume["name"] in api.RESERVED_VOLUMES:
        errors.append(f"the name is the operator's ({', '.join(api.RESERVED_VOLUMES)} are)")
    sources = [s for s in ("persistentVolumeClaim", "configMap", "secret", "emptyDir", "hostPath", "nfs", "csi")
               if s in volume]
    if len(sources) != 1:
        errors.append(f"a volume has exactly one source (got {', '.join(sources) or 'none'})")
    if _has_backsteps((volume.get("hostPath") or {}).get("path", "")):
        errors.append("hostPath.path must not contain '..' components")
    for source in ("configMap", "secret"):
        for j, item in enumerate((volume.get(source) or {}).get("items") or []):
            path = item["path"]
            if path.startswith("/") or _has_backsteps(path) or path.startswith(".."):
                errors.append(f"{source}.items[{j}].path {path!r} must be relative, without '..'")
    return errors


def _mount_errors(mounts: list[dict[str, Any]], volumes: set[str]) -> list[str]:
    errors, paths = [], [m["mountPath"] for m in mounts]
    for i, mount in enumerate(mounts):
        if mount["name"] not in volumes:
            errors.append(f"volumeMounts[{i}] names no volume of spec.pod.volumes: {mount['name']!r}")
        if paths.count(mount["mountPath"]) > 1:
            errors.append(f"volumeMounts[{i}].mountPath {mount['mountPath']!r} is mounted twice")
        sub = mount.get("subPath") or ""
        if sub.startswith("/") or _has_backsteps(sub):
            errors.append(f"volumeMounts[{i}].subPath {sub!r} must be relative, without '..'")
    return errors


def _security_context_errors(context: dict[str, Any]) -> list[str]:
    errors = []
    if context.get("privileged") and context.get("allowPrivilegeEscalation") is False:
        errors.append("securityContext: allowPrivilegeEscalation cannot be false when privileged is true")
    seccomp = context.get("seccompProfile")
    if seccomp and not (bool(seccomp.get("localhostProfile")) if seccomp["type"] == "Localhost"
                        else "localhostProfile" not in seccomp):
        errors.append("securityContext.seccompProfile.localhostProfile is set exactly when type is Localhost")
    return errors


def _service_account_errors(rtj: RTJ, allowed: frozenset[str] | None) -> list[str]:
    if allowed is None:
        return []
    account = rtj.spec.get("serviceAccountName") or "default"
    if account in allowed or f"{rtj.namespace}/{account}" in allowed:
        return []
    return [f"serviceAccountName {account!r} is not allowed by the operator's policy "
            f"(RTJ_ALLOWED_SERVICE_ACCOUNTS: {', '.join(sorted(allowed))})"]


ALLOWED_SERVICE_ACCOUNTS_ENV = "RTJ_ALLOWED_SERVICE_ACCOUNTS"


def allowed_service_accounts_from_env(env: Mapping[str, str]) -> frozenset[str] | None:
    """The serviceAccountName allow-list: RTJ_ALLOWED_SERVICE_ACCOUNTS, comma-separated entries
    'name' (any namespace) or 'namespace/name'. Unset or empty: no restriction (None).
    An RTJ without serviceAccountName runs as 'default', which the list must then name."""
    entries = frozenset(e.strip() for e in env.get(ALLOWED_SERVICE_ACCOUNTS_ENV, "").split(",") if e.strip())
    return entries or None


# Environment the operator sets in every worker pod; see builders/job.py and worker/.
RESERVED_ENV = frozenset({
    "MASTER_ADDR", "MASTER_PORT", "NNODES", "NODE_RANK", "NPROC_PER_NODE", "POD_NAME", "POD_NAMESPACE",
    "RTJ_NAME", "RTJ_NNODES", "RTJ_ATTEMPT", "RTJ_RDZV_ENDPOINT", "RTJ_RDZV_ID", "RTJ_RDZV_TIMEOUT",
    "RTJ_CHECKPOINT_DIR", "RTJ_CHECKPOINT_INTERVAL", "RTJ_CHECKPOINT_ASYNC", "RTJ_CHECKPOINT_KEEP",
    "RTJ_FT_HEARTBEAT_TIMEOUT", "RTJ_FT_INITIAL_HEARTBEAT_TIMEOUT", "RTJ_FT_MONITOR_INTERVAL",
    "RTJ_FT_MAX_RESTARTS", "RTJ_INPROCESS_ENABLED", "RTJ_INPROCESS_MAX_ITERATIONS",
    "RTJ_INPROCESS_SOFT_TIMEOUT", "RTJ_INPROCESS_HARD_TIMEOUT", "RTJ_UID", "RTJ_NCCL_TIMEOUT",
    "RTJ_FT_MAX_NO_PROGRESS_CYCLES", "RTJ_GRACE_SECONDS", "RTJ_COORDINATOR", "RTJ_CRASH_LOOP_REPEATS",
    "RTJ_STATE_COPIES", "RTJ_STATE_COPIES_BYTES_PER_NODE",
})
