"""The ResilientTrainingJob API: group/version/kind and the structural OpenAPI schema.

This module is the single source of truth for the CRD (like kubebuilder's types.go):
`crds/` and the Helm chart's CRD are generated from it (`make crds`) and a test
fails when they drift. Defaults live here too, so the operator applies exactly the
defaults the API server would (see `spec.py`).
"""

from __future__ import annotations

from typing import Any

from rtj_worker import progress as worker_progress

GROUP = "training.rtj.dev"
VERSION = "v1alpha1"
KIND = "ResilientTrainingJob"
PLURAL = "resilienttrainingjobs"
SINGULAR = "resilienttrainingjob"
SHORT_NAMES = ["rtj"]
API_VERSION = f"{GROUP}/{VERSION}"

# Labels and annotations the operator puts on its children.
LABEL_NAME = f"{GROUP}/name"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
LABEL_COMPONENT = "app.kubernetes.io/component"
MANAGER = "rtj-operator"
# Hash of the pod template a Job was built from (builders.job.template_hash).
ANNOTATION_TEMPLATE_HASH = f"{GROUP}/template-hash"
# What operators before template-hash wrote (a hash of the whole Job spec): such a Job is adopted as it
# is, its template-hash annotation added (policies/children.ensure_job).
ANNOTATION_LEGACY_SPEC_HASH = f"{GROUP}/spec-hash"
LABEL_ATTEMPT = f"{GROUP}/attempt"
# On the Job: how many of its pods train (the rest are spares).
ANNOTATION_NODES = f"{GROUP}/nodes"
# The checkpoint interval a Job's pods were built with when not checkpoint.intervalSteps (policies/interval.py).
ANNOTATION_CHECKPOINT_INTERVAL = f"{GROUP}/checkpoint-interval"
# The grace period a Job's pods were built with when measured, not the spec's (policies/grace.py).
ANNOTATION_GRACE = f"{GROUP}/grace-seconds"
# On a Job this operator suspended (spec.suspend, or for capacity), set in the same write as the suspend: the
# Job itself says the suspend is the operator's to lift, even where the status write after it was lost (a
# leader that lost its Lease while that write was in flight, a crash). A Job suspended without it is
# someone else's (a queue, a person) and waited for (policies/children.ensure_job).
ANNOTATION_SUSPENDED_BY = f"{GROUP}/suspended-by"
# The pods' grace period when neither the spec nor a measurement says otherwise: a spot reclaim's notice.
DEFAULT_GRACE_SECONDS = 120
# On worker pods: held back from the scheduler until the operator has applied the job's node exclusions
# (status.excludedNodes) to the pod's node affinity; only this gate is the operator's.
SCHEDULING_GATE = f"{GROUP}/placement"
# Kueue (sigs.k8s.io/kueue pkg/controller/constants): the queue and priority of a Job, and the label
# of the Workload Kueue makes for it.
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
KUEUE_PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
KUEUE_JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"
KUEUE_REQUIRED_TOPOLOGY = "kueue.x-k8s.io/podset-required-topology"
KUEUE_PREFERRED_TOPOLOGY = "kueue.x-k8s.io/podset-preferred-topology"

# p5.48xlarge: 8x H100, 32 EFA interfaces.
DEFAULT_INSTANCE_TYPE = "p5.48xlarge"

# Syntax of Kubernetes names and values (k8s.io/apimachinery/pkg/util/validation), as patterns that
# mean the same in Go's RE2 (kube-apiserver) and Python's re (spec.schema_errors; see spec._re2).
DNS1123_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DNS1123_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
DNS1035_LABEL = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
LABEL_VALUE = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
# A label key (qualified name): optional DNS-subdomain prefix and '/', then a name of at most 63.
LABEL_KEY = (r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
             r"([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9]$")
# resource.Quantity, non-negative (what ParseQuantity accepts, less the sign).
QUANTITY = (r"^\+?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
            r"(([KMGTPE]i)|[numkMGTPE]|([eE][+-]?[0-9]+))?$")
# Container resources a spec may name: the standard ones, or extended resources (domain/name).
RESOURCE_NAME = r"^(cpu|memory|ephemeral-storage|[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)+/" \
                r"([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])$"
# Env var names: since Kubernetes 1.34 (RelaxedEnvironmentVariableValidation, GA) any printable
# ASCII character but '='.
ENV_NAME = r"^[ -<>-~]+$"
_QUANTITY = QUANTITY

# The RTJ name is the Service name (a DNS-1035 label), and each gang attempt's Job name (at most this long:
# builders/names.job_name, '<name>-a<attempt>') is, as '<job>-<index>', every pod's hostname (a DNS-1123
# label of at most 63 characters, index < 1024).
MAX_NAME_LENGTH = 63 - len("-1023")
# Ports a gang uses: rendezvousPort (c10d), +1 (the training script's store) and +2 (the in-process
# wrapper's store); see worker/rtj_worker/ranks.py.
RENDEZVOUS_PORTS = 3
# The worker container's name (builders/job.py), the only container an env resourceFieldRef may name.
CONTAINER_NAME = "worker"


def _obj(props: dict[str, Any], required: list[str] | None = None, **extra: Any) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "object", "properties": props, **extra}
    if required:
        schema["required"] = required
    return schema


# From this many ranks (nodes x processes per node) the in-process timeouts default to NVRx's own (60/90 s)
# instead of 45/55 s: their watchdog also covers process-group setup, which takes far longer at that scale.
LARGE_WORLD = 512
IN_PROCESS_TIMEOUTS = {False: (45, 55), True: (60, 90)}  # by world >= LARGE_WORLD: (soft, hard)
# checkpoint.memoryCopies.maxBytesPerNode's default: the worker's own, so that the pods of a default spec
# carry no variable for it. Where a restored step's state came from, fastest first.
STATE_COPIES_BYTES_PER_NODE = f"{worker_progress.DEFAULT_COPIES_BYTES_PER_NODE >> 30}Gi"
STATE_SOURCES = worker_progress.SOURCES
CHECKPOINT_INTERVAL_POLICIES = ("Fixed", "YoungDaly")  # policies/interval.py


def _int(default: int | None = None, minimum: int | None = None, maximum: int | None = None,
         description: str = "") -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "integer"}
    if description:
        schema["description"] = description
    if default is not None:
        schema["default"] = default
    if minimum is not None:
        schema["minimum"] = minimum
    if maximum is not None:
        schema["maximum"] = maximum
    return schema


def _str(description: str = "", **extra: Any) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string", **extra}
    if description:
        schema["description"] = description
    return schema




def _cel(rule: str, message: str) -> dict[str, str]:
    return {"rule": rule, "message": message}


def _strmap(value: dict[str, Any], key_rule: str, message: str, max_properties: int) -> dict[str, Any]:
    """A map[string]X whose keys follow `key_rule` (CEL on each key `k`)."""
    return {"type": "object", "additionalProperties": value, "maxProperties": max_properties,
            "x-kubernetes-validations": [_cel(f"self.all(k, {key_rule})", message)]}


def _list(items: dict[str, Any], max_items: int, *map_keys: str, **extra: Any) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "array", "items": items, "maxItems": max_items, **extra}
    if map_keys:
        schema.update({"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": list(map_keys)})
    else:
        schema["x-kubernetes-list-type"] = "atomic"
    return schema


_LABEL_KEY_RULE = f"k.matches(r'{LABEL_KEY}') && (!k.contains('/') || k.indexOf('/') <= 253)"
# A Quantity as Kubernetes types embed it in CRDs: an integer or a string in quantity syntax.
_QUANTITY_INT_OR_STRING = {"anyOf": [{"type": "integer"}, {"type": "string"}],
                           "x-kubernetes-int-or-string": True, "pattern": QUANTITY}
_RESOURCE_LIST = _strmap(_QUANTITY_INT_OR_STRING, f"k.matches(r'{RESOURCE_NAME}') && !k.contains('kubernetes.io/')",
                         "resource names are cpu, memory, ephemeral-storage or an extended resource "
                         "such as example.com/device", 32)

# core/v1 ResourceRequirements (claims are not supported: the pod has no resource claims).
RESOURCE_REQUIREMENTS = _obj({"limits": _RESOURCE_LIST, "requests": _RESOURCE_LIST})

_SELECTOR_NAME = {**_str(pattern=DNS1123_SUBDOMAIN, maxLength=253), "minLength": 1}
_KEY_SELECTOR = _obj({"name": _SELECTOR_NAME,
                      "key": _str(pattern=r"^[-._a-zA-Z0-9]+$", maxLength=253),
                      "optional": {"type": "boolean"}},
                     required=["name", "key"], **{"x-kubernetes-map-type": "atomic"})
# Pod fields the downward API offers to env (pods/validation.go validEnvDownwardAPIFieldPathExpressions).
FIELD_PATH = (r"^(metadata\.(name|namespace|uid)|metadata\.(labels|annotations)\['[^']+'\]"
              r"|spec\.(nodeName|serviceAccountName)|status\.(hostIP|hostIPs|podIP|podIPs))$")

# core/v1 EnvVar.
ENV_VAR = _obj(
    {
        "name": _str("Environment variable name (printable ASCII but '=').", pattern=ENV_NAME,
                     maxLength=1024, minLength=1),
        "value": _str(),
        "valueFrom": _obj(
            {
                "fieldRef": _obj({"apiVersion": _str(enum=["v1"]),
                                  "fieldPath": _str(pattern=FIELD_PATH, maxLength=512)},
                                 required=["fieldPath"], **{"x-kubernetes-map-type": "atomic"}),
                "resourceFieldRef": _obj(
                    {"containerName": _str(enum=[CONTAINER_NAME]),
                     "resource": _str(pattern=r"^(limits|requests)\.(cpu|memory|ephemeral-storage)$"),
                     "divisor": _QUANTITY_INT_OR_STRING},
                    required=["resource"], **{"x-kubernetes-map-type": "atomic"}),
                "configMapKeyRef": _KEY_SELECTOR,
                "secretKeyRef": _KEY_SELECTOR,
            },
            minProperties=1, maxProperties=1,
            description="Exactly one of fieldRef, resourceFieldRef, configMapKeyRef, secretKeyRef.",
        ),
    },
    required=["name"],
    **{"x-kubernetes-validations": [
        _cel("!has(self.valueFrom) || !has(self.value) || self.value == ''",
             "env: set value or valueFrom, not both")]},
)

# core/v1 Toleration.
TOLERATION = _obj(
    {
        "key": _str(pattern=f"^$|{LABEL_KEY}", maxLength=317),
        "operator": _str(enum=["Equal", "Exists"]),
        "value": _str(pattern=LABEL_VALUE, maxLength=63),
        "effect": _str(enum=["NoSchedule", "PreferNoSchedule", "NoExecute"]),
        "tolerationSeconds": {"type": "integer", "format": "int64"},
    },
    **{"x-kubernetes-validations": [
        _cel("(has(self.key) && self.key != '') || (has(self.operator) && self.operator == 'Exists')",
             "a toleration without a key must use operator Exists"),
        _cel("!(has(self.operator) && self.operator == 'Exists') || !has(self.value) || self.value == ''",
             "a toleration with operator Exists must not set a value"),
        _cel("!has(self.tolerationSeconds) || (has(self.effect) && self.effect == 'NoExecute')",
             "tolerationSeconds requires effect NoExecute"),
    ]},
)

def _strings(pattern: str, max_length: int) -> dict[str, Any]:
    return _list(_str(pattern=pattern, maxLength=max_length), 64)


def _requirement(key: dict[str, Any], operators: list[str], values: dict[str, Any],
                 rules: list[dict[str, str]]) -> dict[str, Any]:
    """A {key, operator, values} selector requirement."""
    return _obj({"key": key, "operator": _str(enum=operators), "values": values}, required=["key", "operator"],
                **{"x-kubernetes-validations": rules})


_HAS_VALUES = "has(self.values) && size(self.values) > 0"
_VALUES_FOR_SET_OPERATORS = [
    _cel(f"!(self.operator in ['In', 'NotIn']) || ({_HAS_VALUES})", "operator In and NotIn need values"),
    _cel(f"!(self.operator in ['Exists', 'DoesNotExist']) || !({_HAS_VALUES})",
         "operator Exists and DoesNotExist take no values"),
]
_LABEL_KEY_STR = _str(pattern=LABEL_KEY, maxLength=317)
_LABEL_SELECTOR = _obj(
    {"matchLabels": _strmap(_str(pattern=LABEL_VALUE, maxLength=63), _LABEL_KEY_RULE,
                            "matchLabels keys must be label keys", 64),
     "matchExpressions": _list(_requirement(_LABEL_KEY_STR, ["In", "NotIn", "Exists", "DoesNotExist"],
                                            _strings(LABEL_VALUE, 63), _VALUES_FOR_SET_OPERATORS), 32)},
    **{"x-kubernetes-map-type": "atomic"},
)
# networking/v1 NetworkPolicyPeer: pods, namespaces or an IP block that may reach the job's pods.
_NETWORK_POLICY_PEER = _obj(
    {"podSelector": {**_LABEL_SELECTOR, "description": "Pods (in the RTJ's namespace, or those namespaceSelector "
                                                       "selects)."},
     "namespaceSelector": {**_LABEL_SELECTOR, "description": "Namespaces (all their pods, or podSelector's)."},
     "ipBlock": _obj({"cidr": _str("A CIDR, e.g. 10.0.0.0/16.", maxLength=64),
                      "except": _strings(r"^[0-9a-fA-F.:/]+$", 64)}, required=["cidr"],
                     description="An IP block (outside the cluster's pods).")},
    description="A networking/v1 NetworkPolicyPeer.")
_NODE_SELECTOR_TERM = _obj(
    {"matchExpressions": _list(_requirement(
        _LABEL_KEY_STR, ["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"], _strings(LABEL_VALUE, 63),
        [*_VALUES_FOR_SET_OPERATORS,
         _cel("!(self.operator in ['Gt', 'Lt']) || (has(self.values) && size(self.values) == 1 "
              "&& self.values[0].matches(r'^-?[0-9]+$'))", "operator Gt and Lt need one integer value")]), 32),
     "matchFields": _list(_requirement(
         _str(enum=["metadata.name"]), ["In", "NotIn"], _strings(DNS1123_SUBDOMAIN, 253),
         [_cel("has(self.values) && size(self.values) == 1", "matchFields need exactly one value")]), 32)},
    **{"x-kubernetes-map-type": "atomic"},
)
_WEIGHT = _int(minimum=1, maximum=100)
_POD_AFFINITY_TERM = _obj(
    {"labelSelector": _LABEL_SELECTOR, "namespaceSelector": _LABEL_SELECTOR,
     "namespaces": _strings(DNS1123_LABEL, 63),
     "topologyKey": _LABEL_KEY_STR},
    required=["topologyKey"],
)
_POD_AFFINITY = _obj({
    "requiredDuringSchedulingIgnoredDuringExecution": _list(_POD_AFFINITY_TERM, 32),
    "preferredDuringSchedulingIgnoredDuringExecution": _list(
        _obj({"weight": _WEIGHT, "podAffinityTerm": _POD_AFFINITY_TERM}, required=["weight", "podAffinityTerm"]),
        32),
})

# core/v1 Affinity (matchLabelKeys/mismatchLabelKeys of pod affinity terms are not supported).
AFFINITY = _obj({
    "nodeAffinity": _obj({
        "requiredDuringSchedulingIgnoredDuringExecution": _obj(
            {"nodeSelectorTerms": {**_list(_NODE_SELECTOR_TERM, 32), "minItems": 1}},
            required=["nodeSelectorTerms"], **{"x-kubernetes-map-type": "atomic"}),
        "preferredDuringSchedulingIgnoredDuringExecution": _list(
            _obj({"weight": _WEIGHT, "preference": _NODE_SELECTOR_TERM}, required=["weight", "preference"]), 32),
    }),
    "podAffinity": _POD_AFFINITY,
    "podAntiAffinity": _POD_AFFINITY,
})

# --- spec.pod: what a spec adds to the operator's pod template ---------------------------------------
# Typed subsets of the core/v1 types (not free-form pod specs): a field the schema does not name is
# rejected by `kubectl apply` (strict field validation), so nothing here can replace what recovery
# depends on (restartPolicy, the worker's command, its completion index, hostname, grace period).

# The volumes and mount paths the operator puts in every worker pod (builders/job.py).
RESERVED_VOLUMES = ("dshm", "checkpoints")
SHM_PATH = "/dev/shm"
# Label keys the operator, or the Job controller, sets on the pods: the Service's and the gang's
# selectors, the attempt, the Job's own (batch.kubernetes.io/job-completion-index is NODE_RANK).
RESERVED_LABEL_PREFIXES = (f"{GROUP}/", "batch.kubernetes.io/")
RESERVED_LABELS = (LABEL_MANAGED_BY, LABEL_COMPONENT, "controller-uid", "job-name")
# Pod annotations are checked by key the same way; kubectl.kubernetes.io/ and kwok's are not ours.
RESERVED_ANNOTATION_PREFIXES = RESERVED_LABEL_PREFIXES
MAX_ANNOTATION_VALUE = 4096
IANA_SVC_NAME = r"^[a-z0-9]([-a-z0-9]{0,13}[a-z0-9])?$"
CSI_DRIVER = r"^[A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?(\.[A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?)*$"
CONFIG_KEY = r"^[-._a-zA-Z0-9]+$"
_NO_BACKSTEPS = _cel(r"!self.matches(r'(^|/)\.\.(/|$)')", "must not contain '..' components")
_RELATIVE = [_cel("!self.startsWith('/')", "must be a relative path"), _NO_BACKSTEPS]
_ABSOLUTE = {**_str(pattern=r"^/", maxLength=1024, minLength=1)}


def _reserved_key_rule(prefixes: tuple[str, ...], exact: tuple[str, ...], lower: bool = False) -> str:
    key = "k.lowerAscii()" if lower else "k"
    clauses = [f"!{key}.startsWith('{p}')" for p in prefixes] + [f"{key} != '{e}'" for e in exact]
    return f"self.all(k, {' && '.join(clauses)})"


_POD_LABELS = _strmap(_str(pattern=LABEL_VALUE, maxLength=63), _LABEL_KEY_RULE, "labels keys must be label keys", 64)
_POD_LABELS["x-kubernetes-validations"].append(_cel(
    _reserved_key_rule(RESERVED_LABEL_PREFIXES, RESERVED_LABELS),
    f"labels must not use the operator's or the Job controller's keys ({', '.join(RESERVED_LABELS)}, "
    f"{', '.join(p + '*' for p in RESERVED_LABEL_PREFIXES)})"))
# Annotation keys are qualified names checked in lower case (apimachinery ValidateAnnotations).
_POD_ANNOTATIONS = _strmap(_str(maxLength=MAX_ANNOTATION_VALUE),
                           f"k.lowerAscii().matches(r'{LABEL_KEY}') && (!k.contains('/') || k.indexOf('/') <= 253)",
                           "annotations keys must be qualified names (an optional DNS prefix and '/', then a name)", 32)
_POD_ANNOTATIONS["x-kubernetes-validations"].append(_cel(
    _reserved_key_rule(RESERVED_ANNOTATION_PREFIXES, (), lower=True),
    f"annotations must not use the operator's or the Job controller's prefixes "
    f"({', '.join(p + '*' for p in RESERVED_ANNOTATION_PREFIXES)}): the completion index is NODE_RANK"))

_LOCAL_REF = _obj({"name": {**_SELECTOR_NAME}}, required=["name"], **{"x-kubernetes-map-type": "atomic"})
_KEY_TO_PATH = _obj(
    {"key": _str(pattern=CONFIG_KEY, maxLength=253),
     "path": _str(maxLength=1024, minLength=1, **{"x-kubernetes-validations": [
         *_RELATIVE, _cel("!self.startsWith('..')", "must not start with '..'")]}),
     "mode": _int(minimum=0, maximum=0o777)},
    required=["key", "path"])
_ITEMS = _list(_KEY_TO_PATH, 64)
_VOLUME_SOURCES: dict[str, dict[str, Any]] = {
    "persistentVolumeClaim": _obj({"claimName": {**_SELECTOR_NAME}, "readOnly": {"type": "boolean"}},
                                  required=["claimName"]),
    "configMap": _obj({"name": {**_SELECTOR_NAME}, "items": _ITEMS, "defaultMode": _int(minimum=0, maximum=0o777),
                       "optional": {"type": "boolean"}}, required=["name"]),
    "secret": _obj({"secretName": {**_SELECTOR_NAME}, "items": _ITEMS, "defaultMode": _int(minimum=0, maximum=0o777),
                    "optional": {"type": "boolean"}}, required=["secretName"]),
    "emptyDir": _obj({"medium": _str(enum=["", "Memory"]), "sizeLimit": _QUANTITY_INT_OR_STRING}),
    "hostPath": _obj({"path": {**_ABSOLUTE, "x-kubernetes-validations": [_NO_BACKSTEPS]},
                      "type": _str(enum=["", "DirectoryOrCreate", "Directory", "FileOrCreate", "File", "Socket",
                                         "CharDevice", "BlockDevice"])}, required=["path"]),
    "nfs": _obj({"server": _str(minLength=1, maxLength=253, pattern=r"^\S+$"), "path": _ABSOLUTE,
                 "readOnly": {"type": "boolean"}}, required=["server", "path"]),
    "csi": _obj({"driver": _str(pattern=CSI_DRIVER, maxLength=63), "readOnly": {"type": "boolean"},
                 "fsType": _str(maxLength=63),
                 "volumeAttributes": {"type": "object", "additionalProperties": _str(maxLength=4096),
                                      "maxProperties": 64},
                 "nodePublishSecretRef": _LOCAL_REF}, required=["driver"]),
}
# core/v1 Volume with the sources a training pod uses: datasets on claims (FSx, EFS, Mountpoint for S3
# as a static PV), inline CSI volumes, NFS, ConfigMaps, Secrets, scratch emptyDirs, host paths.
VOLUME = _obj(
    {"name": _str(pattern=DNS1123_LABEL, maxLength=63, minLength=1), **_VOLUME_SOURCES},
    required=["name"],
    **{"x-kubernetes-validations": [
        _cel(f"[{', '.join(f'has(self.{s})' for s in _VOLUME_SOURCES)}].exists_one(x, x)",
             f"a volume has exactly one source: {', '.join(_VOLUME_SOURCES)}"),
        _cel(f"!(self.name in {list(RESERVED_VOLUMES)})",
             f"volume names {', '.join(RESERVED_VOLUMES)} are the operator's"),
    ]},
)
# core/v1 VolumeMount.
VOLUME_MOUNT = _obj(
    {"name": _str(pattern=DNS1123_LABEL, maxLength=63, minLength=1),
     "mountPath": _ABSOLUTE,
     "readOnly": {"type": "boolean"},
     "subPath": _str(maxLength=1024, **{"x-kubernetes-validations": _RELATIVE})},
    required=["name", "mountPath"],
)
_UNIQUE_MOUNT_PATHS = _cel("self.all(m, self.exists_one(n, n.mountPath == m.mountPath))",
                           "mountPath must be unique within a container")


def _mounts(description: str) -> dict[str, Any]:
    return {**_list(VOLUME_MOUNT, 32), "description": description,
            "x-kubernetes-validations": [_UNIQUE_MOUNT_PATHS]}


_CAPABILITIES = _list(_str(pattern=r"^[A-Za-z_0-9]+$", maxLength=64), 64)
# core/v1 SecurityContext (the fields a sidecar needs: users, privileges, capabilities, seccomp).
SECURITY_CONTEXT = _obj(
    {"runAsUser": {"type": "integer", "format": "int64", "minimum": 0},
     "runAsGroup": {"type": "integer", "format": "int64", "minimum": 0},
     "runAsNonRoot": {"type": "boolean"},
     "readOnlyRootFilesystem": {"type": "boolean"},
     "allowPrivilegeEscalation": {"type": "boolean"},
     "privileged": {"type": "boolean"},
     "capabilities": _obj({"add": _CAPABILITIES, "drop": _CAPABILITIES}),
     "seccompProfile": _obj({"type": _str(enum=["RuntimeDefault", "Unconfined", "Localhost"]),
                             "localhostProfile": _str(maxLength=1024)}, required=["type"],
                            **{"x-kubernetes-validations": [_cel(
                                # The server refuses localhostProfile (even "") with another type.
                                "self.type == 'Localhost' ? (has(self.localhostProfile) && "
                                "self.localhostProfile != '') : !has(self.localhostProfile)",
                                "seccompProfile.localhostProfile is set exactly when type is Localhost")]})},
    **{"x-kubernetes-validations": [_cel(
        "!(has(self.privileged) && self.privileged && has(self.allowPrivilegeEscalation) "
        "&& !self.allowPrivilegeEscalation)",
        "allowPrivilegeEscalation cannot be false when privileged is true")]},
)
CONTAINER_PORT = _obj(
    {"containerPort": _int(minimum=1, maximum=65535),
     "name": _str(pattern=IANA_SVC_NAME, maxLength=15, **{"x-kubernetes-validations": [
         _cel("self.matches('[a-z]') && !self.contains('--')",
              "a port name has a letter and no '--' (IANA service name)")]}),
     "protocol": _str(enum=["TCP", "UDP", "SCTP"], default="TCP")},
    required=["containerPort"],
)
# core/v1 Container for init containers and native sidecars (restartPolicy: Always). No probes,
# lifecycle hooks or host ports.
INIT_CONTAINER = _obj(
    {"name": _str("Container name (a DNS label; not 'worker').", pattern=DNS1123_LABEL, maxLength=63, minLength=1),
     "image": _str(minLength=1, pattern=r"^\S+$", maxLength=1024),
     "imagePullPolicy": _str(enum=["Always", "IfNotPresent", "Never"]),
     "command": _list(_str(), 256),
     "args": _list(_str(), 256),
     "workingDir": _str(maxLength=1024),
     "env": _list(ENV_VAR, 256, "name"),
     "ports": {**_list(CONTAINER_PORT, 32, "containerPort", "protocol"), "x-kubernetes-validations": [_cel(
         "self.all(p, !has(p.name) || self.exists_one(q, has(q.name) && q.name == p.name))",
         "port names must be unique within a container")]},
     "resources": RESOURCE_REQUIREMENTS,
     "volumeMounts": _mounts("Mounts of spec.pod.volumes, or of the operator's checkpoints and dshm."),
     "securityContext": SECURITY_CONTEXT,
     "restartPolicy": _str("Always: a native sidecar, started before the worker and stopped after it, so the pod "
                           "still ends when the worker does. Unset: an init container, run to completion before "
                           "the worker starts.", enum=["Always"])},
    required=["name", "image"],
    **{"x-kubernetes-validations": [_cel(f"self.name != '{CONTAINER_NAME}'",
                                         f"the container name {CONTAINER_NAME!r} is the operator's")]},
)
_MOUNTED_VOLUME = (f"m.name in {list(RESERVED_VOLUMES)} || (has(self.volumes) "
                   "&& self.volumes.exists(v, v.name == m.name))")
POD = _obj(
    {
        "labels": {**_POD_LABELS, "description": "Labels of every pod of the job (workers and coordinator), "
                                                "added to the operator's own (which may not be set here)."},
        "annotations": {**_POD_ANNOTATIONS, "description": "Annotations of every pod of the job (workers and "
                                                          "coordinator), e.g. karpenter.sh/do-not-disrupt."},
        "imagePullSecrets": {**_list(_LOCAL_REF, 16, "name"),
                             "description": "Secrets for pulling spec.image and the init containers' images "
                                            "(workers and coordinator; core/v1 LocalObjectReference)."},
        "schedulerName": _str("Scheduler of the worker pods (default: the default scheduler; the coordinator "
                              "always uses it).", pattern=DNS1123_SUBDOMAIN, maxLength=253),
        "volumes": {**_list(VOLUME, 32, "name"),
                    "description": "Extra volumes of the worker pods (core/v1 Volume, one source each); "
                                   "dshm and checkpoints are the operator's."},
        "volumeMounts": _mounts("Extra mounts of the worker container (core/v1 VolumeMount; not /dev/shm or "
                                "storage.mountPath)."),
        "initContainers": {**_list(INIT_CONTAINER, 8, "name"),
                           "description": "Init containers and native sidecars (restartPolicy: Always) of the "
                                          "worker pods (a subset of core/v1 Container), in this order, before the "
                                          "worker container (which stays the pod's only regular container: the "
                                          "pod ends with it)."},
    },
    description="What every pod of the job gets beyond what the operator sets; merged, never replacing: "
                "the operator's labels, volumes, mounts and the worker container stay as they are. Like "
                "any pod template edit, changing it starts a new gang.",
    **{"x-kubernetes-validations": [
        _cel(f"!has(self.volumeMounts) || self.volumeMounts.all(m, {_MOUNTED_VOLUME})",
             "volumeMounts must name a volume of spec.pod.volumes (or dshm, checkpoints)"),
        _cel(f"!has(self.initContainers) || self.initContainers.all(c, !has(c.volumeMounts) || "
             f"c.volumeMounts.all(m, {_MOUNTED_VOLUME}))",
             "initContainers' volumeMounts must name a volume of spec.pod.volumes (or dshm, checkpoints)"),
    ]},
)


SPEC_SCHEMA: dict[str, Any] = _obj(
    {
        "image": _str("Worker container image (runs ft_launcher, see worker/).", minLength=1,
                      pattern=r"^\S+$"),
        "imagePullPolicy": _str("Image pull policy.", enum=["Always", "IfNotPresent", "Never"],
                                default="IfNotPresent"),
        "command": {"type": "array", "items": {"type": "string"}, "minItems": 1,
                    "description": "Training script and its interpreter, run by ft_launcher on each "
                                   "node, e.g. [python, -m, rtj_worker.train].",
                    "default": ["python", "-m", "rtj_worker.train"]},
        "args": {"type": "array", "items": {"type": "string"},
                 "description": "Arguments appended to the training command."},
        "nodes": _obj(
            {
                "count": _int(minimum=1, maximum=1024, description="Nodes that train (the world size in nodes), "
                                                                   "one pod per node."),
                "spares": _int(0, 0, 64, "Hot spares: this many more pods wait, warm, on nodes of their own; when "
                                         "a training node is lost its ranks move to a spare in the next rendezvous "
                                         "round (ft_launcher, no pod on the critical path) and the lost pod is "
                                         "replaced in the background as a new spare. Needs NVRx 0.6 in the image "
                                         "(its barrier rendezvous) and the coordinator."),
            },
            required=["count"],
            description="How many nodes train, and the hot spares beside them. The world size is fixed: a gang "
                        "never shrinks or grows (there is no min/max; spares stand by instead).",
        ),
        "coordinator": _obj(
            {
                "enabled": {"type": "boolean", "default": True,
                            "description": "Run the rendezvous and the ranks' stores in a small CPU pod of their "
                                           "own (<name>-a<attempt>-rdzv, one per gang attempt), so that no "
                                           "training node hosts them: losing node "
                                           "0 is then like losing any node. Off: node 0's pod hosts them, and "
                                           "its loss ends every other pod too (charged once)."},
                "nodeSelector": {**_strmap(_str(pattern=LABEL_VALUE, maxLength=63), _LABEL_KEY_RULE,
                                           "nodeSelector keys must be label keys", 64),
                                 "description": "Where the coordinator may run (default: anywhere; nodes of "
                                                "another instance type than the training nodes are preferred)."},
                "tolerations": {**_list(TOLERATION, 64),
                                "description": "Its tolerations (core/v1 Toleration; default: the GPU taint, so it "
                                               "can run anywhere)."},
            },
            default={},
            description="The coordinator pod, which hosts the gang's rendezvous and the ranks' stores.",
        ),
        "isolation": _obj(
            {
                "enabled": {"type": "boolean", "default": True,
                            "description": "A NetworkPolicy (<name>) lets only the job's own pods reach its pods: "
                                           "the rendezvous, the ranks' stores and the process groups answer "
                                           "anyone who can connect (no authentication), so on a shared cluster a "
                                           "neighbour could join a round or stall a collective. Enforced by the "
                                           "cluster's network policy engine (the EKS VPC CNI's once enabled, "
                                           "Calico, Cilium); without one it changes nothing. Off: no policy "
                                           "(an existing one of this RTJ is deleted)."},
                "allowFrom": {**_list(_NETWORK_POLICY_PEER, 16),
                              "description": "Others that may reach the job's pods too (networking/v1 "
                                             "NetworkPolicyPeer: a profiler, a metrics scraper)."},
            },
            default={},
            description="Who may open connections to the job's pods.",
        ),
        "gpusPerNode": _int(8, 0, 16, "nvidia.com/gpu per node (8 on p5.48xlarge); also the number of "
                                       "ranks per node. 0 runs ranks on CPU with gloo."),
        "procsPerNode": _int(None, 1, 64, "Ranks per node when gpusPerNode is 0; defaults to 1."),
        "efaPerNode": _int(32, 0, 32, "vpc.amazonaws.com/efa interfaces per node (32 on p5.48xlarge)."),
        "shmSize": _str("Size of the /dev/shm memory volume.", pattern=_QUANTITY, default="64Gi"),
        "placement": _obj(
            {
                "instanceType": _str("node.kubernetes.io/instance-type to schedule on.",
                                     default=DEFAULT_INSTANCE_TYPE, pattern=LABEL_VALUE, minLength=1, maxLength=63),
                "nodeSelector": {**_strmap(_str(pattern=LABEL_VALUE, maxLength=63), _LABEL_KEY_RULE,
                                          "nodeSelector keys must be label keys", 64),
                                 "description": "Extra node labels, e.g. eks.amazonaws.com/nodegroup."},
                "tolerations": {**_list(TOLERATION, 64), "description": "Pod tolerations (core/v1 Toleration)."},
                "affinity": {**AFFINITY, "description": "Pod affinity (core/v1 Affinity)."},
                "topology": _obj(
                    {"key": {**_LABEL_KEY_STR, "description": "A node label whose value names a network domain, "
                                                               "e.g. topology.k8s.aws/network-node-layer-3 (p5 "
                                                               "nodes carry layers 1-3) or "
                                                               "topology.kubernetes.io/zone."},
                     "mode": _str("Required: every training pod in one domain (a gang that does not fit one "
                                  "stays Pending, WaitingForCapacity); Preferred: as close as the scheduler can.",
                                  enum=["Required", "Preferred"], default="Required")},
                    required=["key"],
                    description="Place the gang in one topology domain. With a queue (queueName), rendered as "
                                "Kueue Topology Aware Scheduling annotations (kueue.x-k8s.io/podset-required-"
                                "topology or -preferred-topology), so Kueue admits the gang only where it fits; "
                                "without one, as pod affinity to the gang's other pods on that key."),
            },
            default={},
            description="Where the worker pods may run: instance type, node labels, tolerations, affinity, topology.",
        ),
        "storage": _obj(
            {
                "existingClaim": _str("Use this existing PVC (e.g. a static FSx for Lustre volume).",
                                     pattern=DNS1123_SUBDOMAIN, maxLength=253),
                "storageClassName": _str("Create a PVC from this StorageClass, e.g. fsx-sc "
                                         "(provisioner fsx.csi.aws.com).", pattern=DNS1123_SUBDOMAIN, maxLength=253),
                "size": _str("Size of the created PVC (FSx for Lustre starts at 1200Gi).",
                             pattern=_QUANTITY, default="1200Gi", maxLength=64,
                             **{"x-kubernetes-validations": [
                                 _cel(r"self.matches(r'^\+?[0-9.]*[1-9]')", "storage.size must be greater than 0")]}),
                "accessMode": _str("Access mode of the created PVC.",
                                   enum=["ReadWriteMany", "ReadWriteOnce", "ReadWriteOncePod"],
                                   default="ReadWriteMany"),
                "retention": _str("What happens to a created PVC when the job is deleted.",
                                  enum=["Retain", "Delete"], default="Retain"),
                "mountPath": _str("Where the volume is mounted in every pod (not /dev/shm).", pattern=r"^/.*",
                                  default="/checkpoints", maxLength=1024),
                "fileSystemId": _str("FSx for Lustre file system id (fs-...) to check before start.",
                                     pattern=r"^fs-[0-9a-f]{8,17}$"),
            },
            default={},
            description="The shared volume every pod mounts for checkpoints: an existing PVC (existingClaim), or "
                        "one the operator creates from a StorageClass (storageClassName).",
        ),
        "resiliency": _obj(
            {
                "inProcessRestart": _obj(
                    {
                        "enabled": {"type": "boolean", "default": True,
                                    "description": "Wrap the step function in inprocess.Wrapper."},
                        "maxIterations": _int(5, 0, 100, "Faults a rank may cause itself (exceptions raised by "
                                                         "its own code) before it exits and ft_launcher takes "
                                                         "over. A healthy rank whose collective timed out "
                                                         "because a peer failed is not charged. 5 as in the "
                                                         "NVRx reference (FaultCounter(max_rank_faults=5)), "
                                                         "so its 5-fault schedule is recovered in process."),
                        "softTimeoutSeconds": _int(None, 2, 3600, "Progress watchdog soft timeout: a rank that "
                                                                  "made no progress for this long is aborted and "
                                                                  "restarts in process (at least 2 s: NVRx's 1 s "
                                                                  "monitor intervals must be shorter). It also "
                                                                  "covers process-group setup, which takes far "
                                                                  "longer with many ranks: default 45 below "
                                                                  f"{LARGE_WORLD} ranks (nodes x procs), NVRx's own "
                                                                  "60 from there."),
                        "hardTimeoutSeconds": _int(None, 1, 7200, "Progress watchdog hard timeout: a rank still "
                                                                  "stuck is terminated (ft_launcher takes over). "
                                                                  "Must be below resiliency.heartbeatTimeoutSeconds. "
                                                                  f"Default 55 below {LARGE_WORLD} ranks, NVRx's "
                                                                  "own 90 from there."),
                    },
                    default={},
                    description="The first layer: inprocess.Wrapper restarts the training loop in the same "
                                "processes.",
                ),
                "maxLauncherRestarts": _int(20, 0, 100, "ft_launcher worker-group restarts per pod. 20 as in "
                                                        "the NVRx reference (ft_launcher --max-restarts=20): "
                                                        "every hard fault (a rank killed, hung or over its "
                                                        "in-process fault count) on any node restarts the "
                                                        "worker group of every node, so each pod spends one "
                                                        "restart per hard fault anywhere in the job."),
                "heartbeatTimeoutSeconds": _int(900, 1, 86400, "Rank heartbeat timeout (and, with NVRx 0.6, "
                                                               "the step and checkpointing section timeout). "
                                                               "Must exceed the in-process hard timeout, or "
                                                               "ft_launcher kills ranks the in-process layer "
                                                               "is still recovering."),
                "initialHeartbeatTimeoutSeconds": _int(1200, 1, 86400, "Timeout for the first heartbeat (and, "
                                                                       "with NVRx 0.6, the setup section). "
                                                                       "Must exceed heartbeatTimeoutSeconds."),
                "monitorIntervalSeconds": _int(5, 1, 3600, "Rank monitor check interval."),
                "ncclTimeoutSeconds": _int(None, 1, 3600, "Timeout of the training process group's "
                                                          "collectives. With NCCL (gpusPerNode > 0) it is the "
                                                          "NCCL watchdog's, which kills the process when it "
                                                          "fires: with in-process restart it must exceed the "
                                                          "hard timeout (NVRx usage guide), or a hang is never "
                                                          "restarted in process, and stay below the heartbeat "
                                                          "timeout; default halfway between them, at most a "
                                                          "minute past the hard timeout. With gloo "
                                                          "(CPU) a timed-out collective raises in the healthy "
                                                          "ranks, which is how they join an in-process restart: "
                                                          "it must be below the soft timeout; default 30 s "
                                                          "(less, below a shorter soft timeout)."),
                "maxNoProgressCycles": _int(3, 0, 100, "NVRx 0.6: ft_launcher stops restarting (the pod fails "
                                                       "permanently) after this many consecutive restart "
                                                       "cycles without a newer committed checkpoint; 0 "
                                                       "disables. Ignored by NVRx 0.4."),
                "rendezvousPort": _int(29400, 1024, 65536 - RENDEZVOUS_PORTS,
                                       "c10d rendezvous port P on node 0; the training store uses P+1 and "
                                       "inprocess.Wrapper's store P+2, so all three must be free."),
                "rendezvousTimeoutSeconds": _int(
                    600, 10, 7200, "How long the gang's pods wait for each other, in each wait: the "
                    "rendezvous host's name to resolve, ft_launcher's rendezvous join (join_timeout) and an "
                    "in-process restart's barrier. A pod that gives up exits and the gang is restarted. The "
                    "operator also bounds by it how long a new gang's pods stay gated for their coordinator's "
                    "address, and restarts the gang instead of waiting when the Job controller would replace "
                    "a lost pod only after half of it."),
                "terminationGracePeriodSeconds": _int(
                    None, 30, 86400, "The pods' grace period: what a stop (a drain, a spot reclaim, a suspend, "
                    "a deletion) gives the ranks to save the step they reached and exit (less 30 s for the "
                    "launcher's margins). Unset (the default): 120 s until the pods have reported a checkpoint's "
                    "write time, then each new gang gets what the newest write and a step need, with a quarter "
                    "more (96 GB at 300 MB/s: about 320 s to write, a grace of about 430 s); status.stopGrace "
                    "shows it. Set: used as it is, and a Warning event StopGraceTooShort says when the measured "
                    "write no longer fits. A spot reclaim gives 120 s whatever this says. A change applies to a "
                    "new gang (the Job is replaced)."),
            },
            default={},
            description="The timeouts and budgets of the layers inside the job (in-process restart, ft_launcher).",
        ),
        "checkpoint": _obj(
            {
                "intervalSteps": _int(100, 1, 10_000_000, "Save every N steps."),
                "dir": _str("Directory relative to the storage mountPath, or an absolute path inside it; "
                            "defaults to the job name. No '..' components.", maxLength=1024,
                            **{"x-kubernetes-validations": [
                                _cel(r"!self.matches(r'(^|/)\.\.(/|$)')", "checkpoint.dir must not contain '..'")]}),
                "async": {"type": "boolean", "default": True,
                          "description": "Save sharded state asynchronously (torch.distributed.checkpoint "
                                         "async_save: staged to host memory, written in the background; "
                                         "off: written in the training loop)."},
                "keep": _int(3, 1, 1000, "Complete checkpoints to keep."),
                "intervalPolicy": _str("Fixed: save every intervalSteps. YoungDaly: a new gang (after a gang "
                                       "restart) saves at the interval status.checkpointInterval.suggestedSteps "
                                       "measured so far (sqrt(2 x save stall x mean time between failures)), "
                                       "intervalSteps until there is one; a running gang keeps its own.",
                                       enum=list(CHECKPOINT_INTERVAL_POLICIES), default="Fixed"),
                "memoryCopies": _obj(
                    {"enabled": {"type": "boolean", "default": True,
                                 "description": "Keep each rank's part of the newest committed step off the "
                                                "volume: in the rank's memory (an in-process restart restores "
                                                "from it), in the node's /dev/shm (an ft_launcher respawn does) "
                                                "and in the next node's /dev/shm (a spare or a replaced pod "
                                                "fetches it from there), each with a checksum checked before "
                                                "it loads; the volume stays the durable copy and the fallback. "
                                                "Needs the reference trainer (rtj_worker.train)."},
                     "maxBytesPerNode": _str("Host memory the ranks of a node may hold for their copies in "
                                             "process (two per rank at most: the committed step's and the one "
                                             "being saved); a step that does not fit is not copied, and "
                                             "status.progress.stateCopies.skipped says so. The /dev/shm copies "
                                             "(this node's and its peer's, about twice a node's share of the "
                                             "state) must fit in shmSize.", pattern=_QUANTITY,
                                             default=STATE_COPIES_BYTES_PER_NODE)},
                    default={},
                    description="Copies of committed state that let a recovery skip reading the volume."),
            },
            default={},
            description="How often and where the ranks save checkpoints, and how many are kept.",
        ),
        "restartBudget": _obj(
            {
                "maxRestarts": _int(3, 0, 1000, "Pod/Job restarts by the operator caused by the job "
                                                "itself before it is marked Failed."),
                "maxDisruptions": _int(10, 0, 1000, "Restarts caused by the platform (node loss, "
                                                    "preemption, maintenance) before Failed."),
                "maxRestartsWithoutProgress": _int(2, 1, 1000, "Consecutive restarts without the "
                                                               "checkpoint step advancing before Failed."),
                "windowSeconds": _int(0, 0, 31536000, "Count maxRestarts and maxDisruptions over the last this "
                                                      "many seconds instead of the job's whole life: a long job on "
                                                      "many nodes meets ordinary attrition (a lost node every few "
                                                      "hours at 1000 nodes) that a lifetime count would spend. "
                                                      "Charges older than the window no longer count; "
                                                      "status.jobRestarts and status.disruptions still count every "
                                                      "charge. maxRestartsWithoutProgress counts restarts in a row "
                                                      "and is never windowed. 0: the job's life."),
                "nodeLossGraceSeconds": _int(300, 0, 3600, "How long a node must stay NotReady or "
                                                           "unreachable (since its Ready condition changed) before "
                                                           "its pod is evicted (and charged as a disruption): a "
                                                           "kubelet or network blip must not kill a healthy rank, "
                                                           "and a replacement waits for fencing anyway. 300: "
                                                           "upstream's taint eviction. A fenced node's pod (Node "
                                                           "deleted, out-of-service, instance stopped) is failed at "
                                                           "once."),
                "capacitySuspendSeconds": _int(600, 1, 86400, "How long the gang may lack a node (WaitingForCapacity: "
                                                              "from the first pod the scheduler found no node for "
                                                              "until every index has one) before it is suspended, so "
                                                              "that the nodes it holds are released; it resumes by "
                                                              "itself once the scheduler placed a capacity probe "
                                                              "(a sleeping pod shaped like the gang's) for each of "
                                                              "its nodes. With a queue (Kueue) the gang is not "
                                                              "suspended for capacity: it waits, said so."),
                "capacityTimeoutSeconds": _int(86400, 0, 31536000, "How long the job may wait for capacity in all "
                                                                   "before it ends Failed (InsufficientCapacity, the "
                                                                   "platform's reason); 0: for ever."),
                "terminatingTimeoutSeconds": _int(60, 1, 86400, "How long a pod may stay Terminating past its "
                                                                "grace period on a node that is not lost before "
                                                                "it is reported stuck (WaitingForPodTermination). "
                                                                "On a lost node nothing is timed: its pod is "
                                                                "replaced once the node is fenced "
                                                                "(WaitingForFencing)."),
                "nodeExclusionSeconds": _int(3600, 0, 604800, "How long a node the job left for ill health (a "
                                                              "health agent's condition or label), or on which its "
                                                              "pods failed twice in a row, is kept out of its "
                                                              "placement: no "
                                                              "replacement or spare pod lands there meanwhile "
                                                              "(status.excludedNodes, at most 16). 0: never."),
            },
            default={},
            description="The operator's budgets and timings: restarts and disruptions before Failed, node loss, "
                        "capacity waits, stuck pods, node exclusion.",
        ),
        "env": {**_list(ENV_VAR, 256, "name"), "description": "Extra environment variables (core/v1 EnvVar)."},
        "resources": {**RESOURCE_REQUIREMENTS,
                      "description": "Container resources (core/v1 ResourceRequirements); "
                                     "GPU and EFA are added from gpusPerNode/efaPerNode."},
        "serviceAccountName": _str("ServiceAccount of the worker pods.", pattern=DNS1123_SUBDOMAIN, maxLength=253),
        "priorityClassName": _str("PriorityClass of the worker pods and the coordinator (preempting the "
                                  "coordinator would restart the gang).", pattern=DNS1123_SUBDOMAIN,
                                  maxLength=253),
        "pod": POD,
        "suspend": {"type": "boolean", "default": False,
                    "description": "Suspend the job: pods are removed, status and budgets are kept."},
        "queueName": _str("Kueue LocalQueue to submit the gang to (the Job's kueue.x-k8s.io/queue-name; the RTJ's "
                          "own label of that name works too). Kueue then decides when the gang runs: the Job is "
                          "created suspended and admitted, preempted or re-queued by Kueue, never charged to a "
                          "budget; a gang restart re-queues it.", pattern=DNS1123_SUBDOMAIN, maxLength=63),
    },
    required=["image", "nodes"],
    **{"x-kubernetes-validations": [
        # checkpoint, storage and mountPath have defaults: present whenever the rules run.
        _cel("!has(self.checkpoint.dir) || !self.checkpoint.dir.startsWith('/') "
             "|| (self.checkpoint.dir + '/').startsWith(self.storage.mountPath.endsWith('/') "
             "? self.storage.mountPath : self.storage.mountPath + '/')",
             "an absolute checkpoint.dir must lie inside storage.mountPath"),
        _cel("self.storage.mountPath != '/dev/shm' && !self.storage.mountPath.startsWith('/dev/shm/')",
             "storage.mountPath must not be /dev/shm: the shared-memory volume is mounted there"),
        _cel("!has(self.pod) || !has(self.pod.volumeMounts) || self.pod.volumeMounts.all(m, "
             f"m.mountPath != '{SHM_PATH}' && m.mountPath != self.storage.mountPath)",
             "pod.volumeMounts must not use /dev/shm or storage.mountPath: the operator mounts them"),
    ]},
)

# metadata.name is the only metadata CEL rules can read (with generateName) at the root of a CRD.
NAME_RULE = _cel(
    f"self.metadata.name.size() <= {MAX_NAME_LENGTH} && self.metadata.name.matches(r'{DNS1035_LABEL}')",
    f"metadata.name must be a DNS-1035 label of at most {MAX_NAME_LENGTH} characters (lowercase letters, "
    f"digits and '-', starting with a letter, no dots): it names the Service and, as "
    f"'<name>-a<attempt>-<index>', every pod's hostname")

_CONDITION = _obj(
    {
        "type": _str("What the condition is about, e.g. Running, WaitingForCapacity (docs/user-guide.md#status)."),
        "status": _str("True, False or Unknown.", enum=["True", "False", "Unknown"]),
        "reason": _str("Why, in CamelCase (for the Restarting condition: the tier)."),
        "message": _str("Why, for people."),
        "lastTransitionTime": _str("When the status last changed (a new reason keeps it).", format="date-time"),
        "observedGeneration": {"type": "integer", "description": "The metadata.generation the operator had seen "
                                                                 "when it set the condition."},
    },
    required=["type", "status", "reason", "lastTransitionTime"],
)

# status.phase: the CRD's enum, and the phases metrics.py exports (rtj_jobs, rtj_job_phase).
PHASES = ("Pending", "Queued", "Running", "Restarting", "Suspended", "Succeeded", "Failed", "Invalid")

STATUS_SCHEMA: dict[str, Any] = _obj(
    {
        "phase": _str("Where the job is: Pending, Queued (Kueue), Running, Restarting, Suspended, Succeeded, Failed, "
                      "or Invalid (its spec cannot work: see the InvalidSpec condition).", enum=list(PHASES)),
        "observedGeneration": {"type": "integer", "description": "The metadata.generation of the spec this status "
                                                                 "was written for."},
        "conditions": {"type": "array", "items": _CONDITION,
                       "description": "The job's conditions (metav1.Condition), one per type.",
                       "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
        "nodesDesired": {"type": "integer", "description": "Training nodes (nodes.count)."},
        "nodesReady": {"type": "integer", "description": "Training nodes whose pod is running and ready: at most "
                                                         "nodesDesired (ready hot spares are counted in standbys)."},
        "standbys": {"type": "integer", "description": "Ready pods beyond the training nodes: hot spares waiting "
                                                       "to take over a lost node's ranks."},
        "restarts": {"type": "integer", "description": "All restarts, every tier: the pods' own (InProcess, "
                                                       "Launcher) and the operator's (ReplacePod, GangRestart)."},
        "restartsByTier": {"type": "object", "additionalProperties": {"type": "integer"},
                           "description": "Restarts by tier. InProcess (inprocess.Wrapper) and Launcher (ft_launcher) "
                                          "are counted from the pods' reports, each by the pod whose rank caused it; "
                                          "ReplacePod and GangRestart are the operator's."},
        "restartCounts": {"type": "array", "maxItems": 32, "description": "Restarts by tier, reason and who was "
                          "charged (job or platform); the per-job metric rtj_job_restarts_total.",
                          "items": _obj({"tier": _str("InProcess, Launcher, ReplacePod or GangRestart."),
                                         "reason": _str("The cause (Other once the list is full)."),
                                         "charged": _str("Who was charged: job (maxRestarts) or platform "
                                                         "(maxDisruptions); the pods' own tiers are the job's.",
                                                         enum=["job", "platform"]),
                                         "count": {"type": "integer", "description": "Restarts so counted."}})},
        "lastRecovery": _obj(
            {"tier": _str("The tier that recovered it.", enum=["InProcess", "Launcher", "ReplacePod", "GangRestart"]),
             "reason": _str("The cause: an exception class, RankKilled, RankHung, RankExited, or the operator's "
                            "failure reason."),
             "message": _str("What happened, in words."),
             "seconds": {"type": "number", "description": "From the fault to training again (in the pods: the "
                                                           "first step after it; the operator's: all nodes running)."},
             "stepsRolledBack": {"type": "integer", "description": "Steps trained again: the step reached minus "
                                                                   "the checkpoint step resumed from."},
             "time": _str("When the fault happened.", format="date-time"),
             "pod": _str("The pod whose rank caused it (in-pod tiers)."),
             "restoredFrom": _str("Where the resumed step's state came from (its slowest rank's): memory (the "
                                  "rank's own), node (the node's /dev/shm), peer (the next node's /dev/shm) or "
                                  "volume (the checkpoint volume).", enum=list(STATE_SOURCES)),
             "restoreSeconds": {"type": "number", "description": "How long that restore took (its slowest rank)."}},
            description="The newest recovery of any tier."),
        "progress": _obj(
            {"step": {"type": "integer", "description": "The training step, from the newest pod report."},
             "stepTime": _str("When the pods reached that step.", format="date-time"),
             "stepSeconds": {"type": "number", "description": "Seconds a step takes (median of the last steps)."},
             "checkpointStep": {"type": "integer", "description": "Newest committed checkpoint step "
                                                                  "(= lastCheckpointStep)."},
             "checkpointTime": _str("When that checkpoint was committed.", format="date-time"),
             "checkpointAgeSeconds": {"type": "number", "description": "The checkpoint's age at updateTime."},
             "checkpointWriteSeconds": {"type": "number", "description": "How long that checkpoint took to write, "
                                        "from the save's start to its commit (its slowest pod's): what a stop "
                                        "must fit in terminationGracePeriodSeconds (event StopGraceTooShort)."},
             "stateCopies": _obj(
                 {"memoryBytesPerRank": {"type": "integer", "description": "A rank's copies in its own memory."},
                  "nodeBytesPerRank": {"type": "integer", "description": "A rank's copy in its node's /dev/shm."},
                  "peerBytesPerRank": {"type": "integer", "description": "The copy a rank's node holds for a "
                                                                          "rank of the previous node."},
                  "skipped": _str("Why the newest copy of some rank was not made (it did not fit, or the state "
                                  "holds what cannot be copied); empty when every copy was.")},
                 description="What the ranks hold off the volume (checkpoint.memoryCopies), from the newest "
                             "report: multiply by the ranks per node for a node's memory."),
             "reportingPods": {"type": "integer", "description": "Pods of the current Job with a report."},
             "trainingPods": {"type": "integer", "description": "Of those, pods whose ranks are training (the "
                                                                "others wait: a rendezvous, a hot spare, a recovery)."},
             "updateTime": _str("When this was last written: at most every 10 s unless a count changed.",
                                format="date-time")},
            description="Live progress from the pods' reports (the condition rtj.dev/Progress each pod's entrypoint "
                        "writes on its own status)."),
        "checkpointInterval": _obj(
            {"policy": _str("checkpoint.intervalPolicy.", enum=list(CHECKPOINT_INTERVAL_POLICIES)),
             "configuredSteps": {"type": "integer", "description": "checkpoint.intervalSteps."},
             "appliedSteps": {"type": "integer", "description": "The interval the current gang's pods save at."},
             "saveStallSeconds": {"type": "number", "description": "How long a save holds the training loop up "
                                                                   "(the slowest pod's newest)."},
             "failures": {"type": "integer", "description": "Recoveries of every tier so far (= restarts)."},
             "meanSecondsBetweenFailures": {"type": "number", "description": "Wall time over failures."},
             "suggestedSeconds": {"type": "number", "description": "Young-Daly: sqrt(2 x saveStallSeconds x "
                                                                   "meanSecondsBetweenFailures)."},
             "suggestedSteps": {"type": "integer", "description": "suggestedSeconds in steps, never below the "
                                                                 "steps a save takes to write."}},
            description="The checkpoint interval: configured, applied and measured (Young-Daly), once a save "
                        "and a failure have been seen."),
        "stopGrace": _obj(
            {"appliedSeconds": {"type": "integer", "description": "The grace period the current gang's pods have."},
             "source": _str("Where it comes from: Spec (resiliency.terminationGracePeriodSeconds), Measured (the "
                            "pods' checkpoint write time, when the spec leaves it unset) or Default (120 s).",
                            enum=["Spec", "Measured", "Default"]),
             "saveSeconds": {"type": "number", "description": "What a stop-save needs: the newest checkpoint's "
                                                              "write time and a step."},
             "suggestedSeconds": {"type": "integer", "description": "The grace that fits saveSeconds with a quarter "
                                                                    "more: what the next gang gets when the spec "
                                                                    "leaves it unset."}},
            description="The pods' grace period for a stop: applied, and what the measured write time asks for."),
        "goodput": _obj(
            {"training": {"type": "number", "description": "Steps since the job started x seconds per step / wall "
                                                           "time (bench/goodput.py's training goodput)."},
             "infrastructure": {"type": "number", "description": "Seconds the ranks were in the training loop / wall "
                                                                 "time (bench/goodput.py's infrastructure goodput)."},
             "inLoopSeconds": {"type": "number", "description": "Seconds the ranks were in the training loop, "
                                                                "summed from the pods' reports."},
             "wallSeconds": {"type": "number", "description": "From startTime to the last progress update (or "
                                                              "completionTime)."},
             "startStep": {"type": "integer", "description": "The step the job started from (a resumed checkpoint)."}},
            description="Goodput so far."),
        "jobRestarts": {"type": "integer", "description": "Restarts charged to the job's own failures."},
        "disruptions": {"type": "integer", "description": "Restarts charged to the platform."},
        "restartsWithoutProgress": {"type": "integer", "description": "Consecutive restarts charged to the job "
                                                                      "without the checkpoint step advancing "
                                                                      "(against maxRestartsWithoutProgress)."},
        "attempt": {"type": "integer", "description": "Generation of the gang (Job) now running."},
        "lastFailureReason": _str("The reason of the newest restart or of the failure that ended the job."),
        "lastFailureMessage": _str("Its message."),
        "lastCheckpointStep": {"type": "integer", "description": "Newest committed checkpoint step: from the pods' "
                                                                 "live reports and their termination messages."},
        "lastCheckpointTime": _str("When that checkpoint was committed.", format="date-time"),
        "stepAtLastRestart": {"type": "integer", "description": "The checkpoint step at the last restart charged "
                                                                "to the job (for restartsWithoutProgress)."},
        "restartStartedTime": _str("While the operator recovers: when the recovery began.", format="date-time"),
        "lastRecoverySeconds": {"type": "number", "description": "Seconds the operator's newest recovery took, "
                                                                 "until all nodes ran again."},
        "excludedNodes": {"type": "array", "maxItems": 16, "items": _obj(
            {"node": _str("The Node's name."), "reason": _str("Why it is kept out."),
             "until": _str("When it may be used again.", format="date-time")}),
            "description": "Nodes kept out of the job's placement (restartBudget.nodeExclusionSeconds): "
                           "no pod of it is placed there until then."},
        "queue": _obj({"name": _str("The LocalQueue."), "workload": _str("Kueue's Workload for the Job."),
                       "admitted": {"type": "boolean", "description": "Whether Kueue admitted it."},
                       "clusterQueue": _str("The ClusterQueue that admitted it."),
                       "activeRequested": {"type": "boolean", "description": "The Workload's spec.active the "
                                           "operator last asked for (from spec.suspend, and off while the "
                                           "gang is suspended for capacity): it acts on a change of those "
                                           "only, so a Workload Kueue or an admin deactivated stays so."},
                       "deactivatedForCapacity": {"type": "boolean", "description": "While the gang is suspended "
                                                  "for capacity: whether the operator's own request deactivated "
                                                  "its Workload (it was active), so that it re-activates it "
                                                  "once the capacity probes are placed, and only then."}},
                      description="Kueue: the LocalQueue, the Workload Kueue made for the Job, whether it is "
                                  "admitted and by which ClusterQueue."),
        "recovery": _obj(
            {
                "seenPods": {"type": "array", "items": _str(), "maxItems": 4096,
                             "description": "Pods (uids) whose failures were settled: charged, or deliberately "
                                            "not; never charged again."},
                "charged": _obj(
                    {"attempt": {"type": "integer", "description": "The attempt (status.attempt) the fault "
                                                                   "belongs to."},
                     "nodes": {"type": "array", "items": _str(), "maxItems": 1024,
                               "description": "Lost nodes whose loss is charged already."},
                     "faults": {"type": "integer", "description": "Faults charged in this recovery; their "
                                                                  "peers' failures (RendezvousHostLost) are "
                                                                  "consequences, not charged."},
                     "platform": {"type": "boolean", "description": "One of them was the platform's: the "
                                                                    "survivors' failed rendezvous while its "
                                                                    "replacement waits are not charged."}},
                    description="The fault being recovered in this attempt (one fault, one charge)."),
                "faultSettlesAt": _str("Once the gang's pods run again: until when a failed rendezvous is still a "
                                       "consequence of the fault just recovered.", format="date-time"),
                "pendingGangRestart": _str("A new gang attempt was decided; its Job is not created yet: why."),
                "gangRestartTime": _str("When the newest gang restart was decided.", format="date-time"),
                "replacementBackoffSeconds": {"type": "number", "description": "What the Job controller delays "
                                                                               "the next replacement pod by."},
                "suspendedForCapacity": _str("When the gang was suspended because a pod of it stayed "
                                             "unschedulable; empty once it resumed.", format="date-time"),
                "capacityWaitSince": _str("When the gang first lacked a node, kept across capacity suspensions "
                                          "until every index has one: what restartBudget.capacityTimeoutSeconds "
                                          "counts from.", format="date-time"),
                "evictionsRefused": {"type": "array", "items": _str(), "maxItems": 1024,
                                     "description": "Pods (uids) whose eviction a PodDisruptionBudget refused: "
                                                    "reported once, retried all the same."},
                "suspendedJob": {"type": "boolean", "description": "The operator suspended the Job (spec.suspend, "
                                                                 "capacity): it un-suspends only a Job it suspended."},
                "nodeFailures": {"type": "object", "additionalProperties": {"type": "integer"}, "maxProperties": 64,
                                 "description": "Failures charged to the job in a row on one node (a failure "
                                                "on another node ends the count): two exclude the node."},
                "reports": {"type": "object", "maxProperties": 4096, "description": "Per pod (uid) of the current "
                            "Job: what its report said that is already counted (in-pod restarts and their causes, "
                            "in-loop seconds); pods with nothing to count are left out.",
                            "additionalProperties": _obj({
                                "inProcess": {"type": "integer", "description": "In-process restarts counted."},
                                "launcher": {"type": "integer", "description": "Launcher restarts counted."},
                                "inLoopSeconds": {"type": "number", "description": "In-loop seconds counted."},
                                "leaderStepAt": {"type": "number", "description": "The leader's pod: the time "
                                                 "(Unix seconds) of the step its counted in-loop time ends at."},
                                "causes": {"type": "object", "maxProperties": 16,
                                           "additionalProperties": {"type": "integer"},
                                           "description": "Restarts counted, by cause."}})},
                "events": {"type": "object", "description": "Per in-pod tier: the restart count and time of the last "
                           "event (InProcessRestart, LauncherRestart: at most one every 30 s).",
                           "additionalProperties": _obj({
                               "count": {"type": "integer", "description": "The tier's restart count at that event."},
                               "time": _str("When it was posted.", format="date-time")})},
                "stepAtFault": {"type": "integer", "description": "The step reached when the operator charged the "
                                                                  "fault it recovers (for stepsRolledBack)."},
                "leaderGap": {"type": "number", "description": "The lost leader pod's run: the step time (Unix "
                                                               "seconds) its counted in-loop time ends at, until the "
                                                               "other pods say where that run ended."},
                "trainedAttempt": {"type": "integer", "description": "The newest attempt whose ranks were seen "
                                   "started (a pod reported Training or Started; or no pod of it reports): "
                                   "before, its gang shows Pending, RanksStarting, with all its pods ready."},
                "chargeTimes": _obj(
                    {counter: {"type": "array", "items": _str(format="date-time"), "maxItems": 1001,
                               "description": f"When each charge against {limit} that still counts was made, "
                                              f"oldest first (at most {limit} + 1)."}
                     for counter, limit in (("jobRestarts", "restartBudget.maxRestarts"),
                                            ("disruptions", "restartBudget.maxDisruptions"))},
                    description="With restartBudget.windowSeconds: the charges within the window, per budget."),
            },
            description="Bookkeeping of the recovery in progress (the operator's ledger).",
        ),
        "startTime": _str("When the job's first Job (gang) was created.", format="date-time"),
        "completionTime": _str("When the job ended, Succeeded or Failed.", format="date-time"),
    },
)

PRINTER_COLUMNS = [
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
    {"name": "Ready", "type": "integer", "jsonPath": ".status.nodesReady"},
    {"name": "Desired", "type": "integer", "jsonPath": ".status.nodesDesired"},
    {"name": "Restarts", "type": "integer", "jsonPath": ".status.jobRestarts",
     "description": "Restarts charged to the job, against restartBudget.maxRestarts (every tier's: All-Restarts)"},
    {"name": "Step", "type": "integer", "jsonPath": ".status.progress.step"},
    {"name": "Ckpt-Step", "type": "integer", "jsonPath": ".status.lastCheckpointStep"},
    {"name": "Ckpt-Age", "type": "date", "jsonPath": ".status.lastCheckpointTime",
     "description": "Since the newest committed checkpoint: what a fault now would roll back"},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    # kubectl get rtj -o wide
    {"name": "Spares", "type": "integer", "jsonPath": ".status.standbys", "priority": 1,
     "description": "Ready hot spares, beyond the training nodes"},
    {"name": "Attempt", "type": "integer", "jsonPath": ".status.attempt", "priority": 1},
    {"name": "Disruptions", "type": "integer", "jsonPath": ".status.disruptions", "priority": 1,
     "description": "Restarts charged to the platform, against restartBudget.maxDisruptions"},
    {"name": "All-Restarts", "type": "integer", "jsonPath": ".status.restarts", "priority": 1,
     "description": "Every tier's restarts, the pods' own in-process and launcher restarts included"},
    {"name": "In-Process", "type": "integer", "jsonPath": ".status.restartsByTier.InProcess", "priority": 1},
    {"name": "Launcher", "type": "integer", "jsonPath": ".status.restartsByTier.Launcher", "priority": 1},
    {"name": "Last-Recovery", "type": "string", "jsonPath": ".status.lastRecovery.reason", "priority": 1},
]


def crd_manifest() -> dict[str, Any]:
    """The CustomResourceDefinition, as applied by `kubectl apply -f crds/`."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{PLURAL}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {"kind": KIND, "plural": PLURAL, "singular": SINGULAR, "shortNames": SHORT_NAMES,
                      "listKind": f"{KIND}List", "categories": ["all"]},
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": PRINTER_COLUMNS,
                    "schema": {
                        "openAPIV3Schema": _obj(
                            {
                                "apiVersion": {"type": "string"},
                                "kind": {"type": "string"},
                                "metadata": {"type": "object"},
                                "spec": SPEC_SCHEMA,
                                "status": STATUS_SCHEMA,
                            },
                            required=["spec"],
                            **{"x-kubernetes-validations": [NAME_RULE]},
                        )
                    },
                }
            ],
        },
    }


def openapi_schema() -> dict[str, Any]:
    return crd_manifest()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
