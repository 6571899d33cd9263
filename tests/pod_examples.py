"""Shared test data: a spec.pod using every field (tests/unit and the fuzz test)."""

from __future__ import annotations

# spec.pod with every field: a dataset claim, Mountpoint for S3 as an inline CSI volume, a native
# sidecar that uploads checkpoints (mounting the operator's volume), an init container.
FULL_POD = {
    "labels": {"team": "ml", "example.com/cost-center": "42"},
    "annotations": {"karpenter.sh/do-not-disrupt": "true", "Example.com/Note": "x" * 100},
    "imagePullSecrets": [{"name": "regcred"}],
    "schedulerName": "my-scheduler",
    "volumes": [
        {"name": "dataset", "persistentVolumeClaim": {"claimName": "imagenet", "readOnly": True}},
        {"name": "s3", "csi": {"driver": "s3.csi.aws.com", "volumeAttributes": {"bucketName": "b"}}},
        {"name": "tokens", "secret": {"secretName": "hf", "items": [{"key": "token", "path": "hf/token", "mode": 256}],
                                      "defaultMode": 0o440}},
        {"name": "config", "configMap": {"name": "cfg", "optional": True}},
        {"name": "scratch", "emptyDir": {"medium": "", "sizeLimit": "10Gi"}},
        {"name": "fsx", "nfs": {"server": "fs-1.fsx.us-west-2.amazonaws.com", "path": "/export", "readOnly": True}},
        {"name": "host", "hostPath": {"path": "/opt/lib", "type": "Directory"}},
    ],
    "volumeMounts": [{"name": "dataset", "mountPath": "/data", "readOnly": True},
                     {"name": "tokens", "mountPath": "/secrets", "subPath": "hf"}],
    "initContainers": [
        {"name": "fetch", "image": "busybox:1", "command": ["sh", "-c", "true"],
         "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}],
         "resources": {"requests": {"cpu": "1"}, "limits": {"memory": "1Gi"}}},
        {"name": "uploader", "image": "amazon/aws-cli:2", "restartPolicy": "Always", "args": ["s3", "sync"],
         "workingDir": "/tmp", "env": [{"name": "BUCKET", "value": "b"}],
         "ports": [{"containerPort": 8080, "name": "metrics"}],
         "volumeMounts": [{"name": "checkpoints", "mountPath": "/checkpoints", "readOnly": True}],
         "securityContext": {"runAsNonRoot": True, "runAsUser": 1000, "allowPrivilegeEscalation": False,
                             "readOnlyRootFilesystem": True, "capabilities": {"drop": ["ALL"]},
                             "seccompProfile": {"type": "RuntimeDefault"}}},
    ],
}
