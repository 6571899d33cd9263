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

_QUANTITY = r"^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$"
_DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"


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

SPEC_SCHEMA: dict[str, Any] = _obj(
    {
        "image": _str("Worker container image (runs ft_launcher, see worker/).", minLength=1),
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
                                     default=DEFAULT_INSTANCE_TYPE),
                "nodeSelector": {"type": "object", "additionalProperties": {"type": "string"},
                                 "description": "Extra node labels, e.g. eks.amazonaws.com/nodegroup."},
                "tolerations": {**_FREEFORM_LIST, "description": "Pod tolerations (core/v1 Toleration)."},
                "affinity": {**_FREEFORM, "description": "Pod affinity (core/v1 Affinity)."},
            },
            default={},
        ),
        "storage": _obj(
            {
                "existingClaim": _str("Use this existing PVC (e.g. a static FSx for Lustre volume)."),
                "storageClassName": _str("Create a PVC from this StorageClass, e.g. fsx-sc "
                                         "(provisioner fsx.csi.aws.com)."),
                "size": _str("Size of the created PVC (FSx for Lustre starts at 1200Gi).",
                             pattern=_QUANTITY, default="1200Gi"),
                "accessMode": _str("Access mode of the created PVC.",
                                   enum=["ReadWriteMany", "ReadWriteOnce", "ReadWriteOncePod"],
                                   default="ReadWriteMany"),
                "retention": _str("What happens to a created PVC when the job is deleted.",
                                  enum=["Retain", "Delete"], default="Retain"),
                "mountPath": _str("Where the volume is mounted in every pod.", pattern=r"^/.*",
                                  default="/checkpoints"),
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
                "rendezvousPort": _int(29400, 1024, 65533, "c10d rendezvous port P on node 0; the training "
                                                           "store uses P+1 and inprocess.Wrapper's store P+2, "
                                                           "so all three must be free."),
                "rendezvousTimeoutSeconds": _int(600, 10, 7200, "How long a pod waits for peer DNS."),
            },
            default={},
        ),
        "checkpoint": _obj(
            {
                "intervalSteps": _int(100, 1, 10_000_000, "Save every N steps."),
                "dir": _str("Directory under the storage mountPath; defaults to the job name."),
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
                "terminatingTimeoutSeconds": _int(300, 10, 86400, "Force-delete a pod stuck "
                                                                  "Terminating on a lost node after this."),
            },
            default={},
        ),
        "env": {**_FREEFORM_LIST, "description": "Extra environment variables (core/v1 EnvVar)."},
        "resources": {**_FREEFORM, "description": "Container resources (core/v1 ResourceRequirements); "
                                                  "GPU and EFA are added from gpusPerNode/efaPerNode."},
        "serviceAccountName": _str("ServiceAccount of the worker pods."),
        "priorityClassName": _str("PriorityClass of the worker pods."),
        "suspend": {"type": "boolean", "default": False,
                    "description": "Suspend the job: pods are removed, status and budgets are kept."},
    },
    required=["image", "nodes"],
)

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
                        )
                    },
                }
            ],
        },
    }


def openapi_schema() -> dict[str, Any]:
    return crd_manifest()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
