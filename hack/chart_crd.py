"""Write charts/rtj-operator/templates/crd.yaml from operator/rtj_operator/api.py, with the copied types'
upstream descriptions (rtj_operator.crd), as `make crds` writes crds/."""

from __future__ import annotations

from pathlib import Path

import yaml

from rtj_operator.crd import manifest as crd_manifest

TARGET = Path(__file__).resolve().parents[1] / "charts" / "rtj-operator" / "templates" / "crd.yaml"


def render() -> str:
    crd = crd_manifest()
    body = yaml.safe_dump({"spec": crd["spec"]}, sort_keys=False, width=120)
    return (
        "{{- if .Values.crds.install }}\n"
        "# Generated from operator/rtj_operator/api.py by `make crds`. Do not edit.\n"
        f"apiVersion: {crd['apiVersion']}\n"
        f"kind: {crd['kind']}\n"
        "metadata:\n"
        f"  name: {crd['metadata']['name']}\n"
        "  labels:\n"
        '    {{- include "rtj-operator.labels" . | nindent 4 }}\n'
        "  {{- if .Values.crds.keep }}\n"
        "  annotations:\n"
        "    helm.sh/resource-policy: keep\n"
        "  {{- end }}\n"
        f"{body}"
        "{{- end }}\n"
    )


if __name__ == "__main__":
    TARGET.write_text(render())
