"""Reading an RTJ: schema defaults, schema validation and the checks a schema cannot express."""

from __future__ import annotations

import copy
import functools
import itertools
import re
from dataclasses import dataclass
from typing import Any

import jsonschema

from . import api

# Pod hostnames are "<job>-<index>" and must be DNS labels (63 chars): leave room for the index.
MAX_NAME_LENGTH = 63 - len("-1023")


@dataclass(frozen=True)
class RTJ:
    """One ResilientTrainingJob, with its spec defaulted as the API server would."""

    name: str
    namespace: str
    uid: str
    generation: int
    spec: dict[str, Any]

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> RTJ:
        meta = body.get("metadata", {})
        return cls(
            name=meta["name"],
            namespace=meta.get("namespace", "default"),
            uid=meta.get("uid", ""),
            generation=int(meta.get("generation", 1)),
            spec=with_defaults(body.get("spec") or {}),
        )

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
    def nodes_min(self) -> int:
        return int(self.spec["nodes"].get("min", self.nodes))

    @property
    def nodes_max(self) -> int:
        return int(self.spec["nodes"].get("max", self.nodes))

    @property
    def procs_per_node(self) -> int:
        gpus = int(self.spec["gpusPerNode"])
        return gpus if gpus > 0 else int(self.spec.get("procsPerNode", 1))

    @property
    def checkpoint_dir(self) -> str:
        sub = self.spec["checkpoint"].get("dir") or self.name
        return f"{self.spec['storage']['mountPath'].rstrip('/')}/{sub.strip('/')}"


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


def with_defaults(spec: dict[str, Any]) -> dict[str, Any]:
    return apply_defaults(api.SPEC_SCHEMA, copy.deepcopy(spec))


@functools.cache
def _validator() -> jsonschema.Draft7Validator:
    return jsonschema.Draft7Validator(api.openapi_schema())


def schema_errors(body: dict[str, Any]) -> list[str]:
    """What kube-apiserver would reject at `kubectl apply` (defaults applied first, as it does)."""
    body = copy.deepcopy(body)
    if isinstance(body.get("spec"), dict):
        body["spec"] = with_defaults(body["spec"])
    errors = sorted(_validator().iter_errors(body), key=lambda e: list(e.absolute_path))
    return [f"{'.'.join(str(p) for p in e.absolute_path) or '<root>'}: {e.message}" for e in errors]


_QUANTITY_RE = re.compile(r"^([0-9]+(\.[0-9]+)?)(Ki|Mi|Gi|Ti|Pi|k|M|G|T|P)?$")


def semantic_errors(rtj: RTJ) -> list[str]:
    """Checks the schema cannot express. Any error here blocks creating or changing children."""
    spec, errors = rtj.spec, []
    if len(rtj.name) > MAX_NAME_LENGTH:
        errors.append(f"metadata.name must be at most {MAX_NAME_LENGTH} characters so that pod "
                      f"hostnames '<name>-<index>' stay DNS labels (got {len(rtj.name)})")
    count, lo, hi = rtj.nodes, rtj.nodes_min, rtj.nodes_max
    if lo > hi:
        errors.append(f"nodes.min ({lo}) must not exceed nodes.max ({hi})")
    if not lo <= count <= hi:
        errors.append(f"nodes.count ({count}) must lie within nodes.min..nodes.max ({lo}..{hi})")
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
    errors += _timeout_order_errors(res)
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
    if sc and rtj.nodes_max > 1 and storage["accessMode"] != "ReadWriteMany":
        errors.append(f"storage.accessMode must be ReadWriteMany for a shared checkpoint volume across "
                      f"{rtj.nodes_max} nodes (got {storage['accessMode']})")
    if sc and not _QUANTITY_RE.match(storage["size"]):
        errors.append(f"storage.size {storage['size']!r} is not a valid size such as 1200Gi")
    if not _QUANTITY_RE.match(spec["shmSize"]):
        errors.append(f"shmSize {spec['shmSize']!r} is not a valid size such as 64Gi")
    if spec["gpusPerNode"] == 0 and spec["efaPerNode"] > 0:
        errors.append("efaPerNode requires gpusPerNode > 0 (EFA is only used for GPU collectives)")
    names = [e.get("name") for e in spec.get("env") or []]
    reserved = sorted({n for n in names if n in RESERVED_ENV})
    if reserved:
        errors.append(f"env must not set {', '.join(reserved)}: the operator sets them")
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


def _timeout_order_errors(res: dict[str, Any]) -> list[str]:
    """NCCL < in-process soft < hard < heartbeat < initial heartbeat: each layer must give up before
    the one above it steps in, or the cheaper recovery never gets its chance."""
    ipr = res["inProcessRestart"]
    chain = [("resiliency.ncclTimeoutSeconds", res["ncclTimeoutSeconds"])]
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
    return errors


# Environment the operator sets in every worker pod; see builders/job.py and worker/.
RESERVED_ENV = frozenset({
    "MASTER_ADDR", "MASTER_PORT", "NNODES", "NODE_RANK", "NPROC_PER_NODE", "POD_NAME", "POD_NAMESPACE",
    "RTJ_NAME", "RTJ_NNODES", "RTJ_ATTEMPT", "RTJ_RDZV_ENDPOINT", "RTJ_RDZV_ID", "RTJ_RDZV_TIMEOUT",
    "RTJ_CHECKPOINT_DIR", "RTJ_CHECKPOINT_INTERVAL", "RTJ_CHECKPOINT_ASYNC", "RTJ_CHECKPOINT_KEEP",
    "RTJ_FT_HEARTBEAT_TIMEOUT", "RTJ_FT_INITIAL_HEARTBEAT_TIMEOUT", "RTJ_FT_MONITOR_INTERVAL",
    "RTJ_FT_MAX_RESTARTS", "RTJ_INPROCESS_ENABLED", "RTJ_INPROCESS_MAX_ITERATIONS",
    "RTJ_INPROCESS_SOFT_TIMEOUT", "RTJ_INPROCESS_HARD_TIMEOUT", "RTJ_UID", "RTJ_NCCL_TIMEOUT",
    "RTJ_FT_MAX_NO_PROGRESS_CYCLES",
})
