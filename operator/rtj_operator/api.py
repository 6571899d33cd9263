"""The ResilientTrainingJob API: group/version/kind and the structural OpenAPI schema.

This module is the single source of truth for the CRD (like kubebuilder's types.go):
`crds/` and the Helm chart's CRD are generated from it (`make crds`) and a test
fails when they drift. Defaults live here too, so the operator applies exactly the
defaults the API server would (see `defaults.py`).
"""

from __future__ import annotations

from typing import Any

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
ANNOTATION_SPEC_HASH = f"{GROUP}/spec-hash"
LABEL_ATTEMPT = f"{GROUP}/attempt"
# Set by the worker on its own pod: the newest complete checkpoint step it saw.
ANNOTATION_CHECKPOINT_STEP = f"{GROUP}/checkpoint-step"

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

# The RTJ name is the Service name (a DNS-1035 label) and, as '<name>-<index>', every pod's hostname
# (a DNS-1123 label of at most 63 characters, index < 1024).
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


_FREEFORM = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
_FREEFORM_LIST = {"type": "array", "items": _FREEFORM}


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
                "count": _int(minimum=1, maximum=1024, description="Nodes (pods) to run, one per node."),
                "min": _int(minimum=1, maximum=1024,
                            description="Smallest node count training may continue with (elastic); "
                                        "defaults to count."),
                "max": _int(minimum=1, maximum=1024, description="Largest node count; defaults to count."),
            },
            required=["count"],
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
            },
            default={},
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
                        "softTimeoutSeconds": _int(45, 1, 3600, "Progress watchdog soft timeout. Must exceed "
                                                                "resiliency.ncclTimeoutSeconds."),
                        "hardTimeoutSeconds": _int(55, 1, 7200, "Progress watchdog hard timeout. Must be below "
                                                                "resiliency.heartbeatTimeoutSeconds (defaults "
                                                                "leave room for heartbeat timeouts down to 60 s; "
                                                                "the NVRx reference runs 60/300/600/900/1200 for "
                                                                "NCCL/soft/hard/heartbeat/initial)."),
                    },
                    default={},
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
                "ncclTimeoutSeconds": _int(30, 1, 3600, "Collective (NCCL) timeout of the training process "
                                                        "group: how long a healthy rank blocks in a collective "
                                                        "with a failed peer. Must be below the in-process soft "
                                                        "timeout so the rank raises and restarts in process "
                                                        "before the watchdog declares it hung (order: NCCL < "
                                                        "soft < hard < heartbeat < initial heartbeat)."),
                "maxNoProgressCycles": _int(3, 0, 100, "NVRx 0.6: ft_launcher stops restarting (the pod fails "
                                                       "permanently) after this many consecutive restart "
                                                       "cycles without a newer committed checkpoint; 0 "
                                                       "disables. Ignored by NVRx 0.4."),
                "rendezvousPort": _int(29400, 1024, 65536 - RENDEZVOUS_PORTS,
                                       "c10d rendezvous port P on node 0; the training store uses P+1 and "
                                       "inprocess.Wrapper's store P+2, so all three must be free."),
                "rendezvousTimeoutSeconds": _int(600, 10, 7200, "How long a pod waits for peer DNS."),
            },
            default={},
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
            },
            default={},
        ),
        "restartBudget": _obj(
            {
                "maxRestarts": _int(3, 0, 1000, "Pod/Job restarts by the operator caused by the job "
                                                "itself before it is marked Failed."),
                "maxDisruptions": _int(10, 0, 1000, "Restarts caused by the platform (node loss, "
                                                    "preemption, maintenance) before Failed."),
                "maxRestartsWithoutProgress": _int(2, 1, 1000, "Consecutive restarts without the "
                                                               "checkpoint step advancing before Failed."),
                "nodeLossGraceSeconds": _int(30, 0, 3600, "How long a node must stay NotReady or "
                                                          "unreachable (since its Ready condition changed) before "
                                                          "its pod is evicted and replaced: a short blip must not "
                                                          "kill a healthy rank."),
                "terminatingTimeoutSeconds": _int(60, 1, 86400, "How long a pod may stay Terminating on a "
                                                                "lost node (its kubelet cannot confirm) before the "
                                                                "operator marks it Failed and deletes it, as PodGC "
                                                                "does, so the Job controller frees its index."),
            },
            default={},
        ),
        "env": {**_list(ENV_VAR, 256, "name"), "description": "Extra environment variables (core/v1 EnvVar)."},
        "resources": {**RESOURCE_REQUIREMENTS,
                      "description": "Container resources (core/v1 ResourceRequirements); "
                                     "GPU and EFA are added from gpusPerNode/efaPerNode."},
        "serviceAccountName": _str("ServiceAccount of the worker pods.", pattern=DNS1123_SUBDOMAIN, maxLength=253),
        "priorityClassName": _str("PriorityClass of the worker pods.", pattern=DNS1123_SUBDOMAIN, maxLength=253),
        "suspend": {"type": "boolean", "default": False,
                    "description": "Suspend the job: pods are removed, status and budgets are kept."},
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
    ]},
)

# metadata.name is the only metadata CEL rules can read (with generateName) at the root of a CRD.
NAME_RULE = _cel(
    f"self.metadata.name.size() <= {MAX_NAME_LENGTH} && self.metadata.name.matches(r'{DNS1035_LABEL}')",
    f"metadata.name must be a DNS-1035 label of at most {MAX_NAME_LENGTH} characters (lowercase letters, "
    f"digits and '-', starting with a letter, no dots): it names the Service and, as '<name>-<index>', "
    f"every pod's hostname")

_CONDITION = _obj(
    {
        "type": _str(),
        "status": _str(enum=["True", "False", "Unknown"]),
        "reason": _str(),
        "message": _str(),
        "lastTransitionTime": _str(format="date-time"),
        "observedGeneration": {"type": "integer"},
    },
    required=["type", "status", "reason", "lastTransitionTime"],
)

STATUS_SCHEMA: dict[str, Any] = _obj(
    {
        "phase": _str(enum=["Pending", "Running", "Restarting", "Suspended", "Succeeded", "Failed",
                            "Invalid"]),
        "observedGeneration": {"type": "integer"},
        "conditions": {"type": "array", "items": _CONDITION,
                       "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
        "nodesDesired": {"type": "integer"},
        "nodesReady": {"type": "integer"},
        "restarts": {"type": "integer", "description": "All restarts done by the operator."},
        "restartsByTier": {"type": "object", "additionalProperties": {"type": "integer"}},
        "jobRestarts": {"type": "integer", "description": "Restarts charged to the job's own failures."},
        "disruptions": {"type": "integer", "description": "Restarts charged to the platform."},
        "restartsWithoutProgress": {"type": "integer"},
        "attempt": {"type": "integer", "description": "Generation of the gang (Job) now running."},
        "lastFailureReason": _str(),
        "lastFailureMessage": _str(),
        "lastCheckpointStep": {"type": "integer"},
        "lastCheckpointTime": _str(format="date-time"),
        "stepAtLastRestart": {"type": "integer"},
        "restartStartedTime": _str(format="date-time"),
        "lastRecoverySeconds": {"type": "number"},
        "failedIndexes": {"type": "array", "items": {"type": "integer"}},
        "recovery": {**_FREEFORM, "description": "Bookkeeping of the recovery in progress."},
        "startTime": _str(format="date-time"),
        "completionTime": _str(format="date-time"),
    },
    **{"x-kubernetes-preserve-unknown-fields": True},  # kopf keeps its own progress here
)

PRINTER_COLUMNS = [
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
    {"name": "Ready", "type": "integer", "jsonPath": ".status.nodesReady"},
    {"name": "Desired", "type": "integer", "jsonPath": ".status.nodesDesired"},
    {"name": "Restarts", "type": "integer", "jsonPath": ".status.restarts"},
    {"name": "Ckpt-Step", "type": "integer", "jsonPath": ".status.lastCheckpointStep"},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
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
