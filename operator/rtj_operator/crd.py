"""`python -m rtj_operator.crd`: print the CRD generated from api.py (see `make crds`).

The fields inside the copied Kubernetes types (a field whose description names `core/v1 <Type>` or
`networking/v1 <Type>`: tolerations, affinity, env, volumes, init containers, ...) get their upstream
descriptions here, from the Kubernetes OpenAPI definitions that `kubernetes-validate` ships for the
cluster version the project tests (a dev dependency: generating the CRD needs it, the operator does
not). api.py keeps only what differs: its own descriptions are never replaced.
"""

from __future__ import annotations

import copy
import json
import re
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from .api import crd_manifest

HEADER = "# Generated from operator/rtj_operator/api.py by `make crds`. Do not edit.\n"
KUBERNETES = "v1.37.0"  # the API's version whose descriptions are copied (the local control plane's)
COPIED = re.compile(r"\b(core|networking)/v1 ([A-Z][A-Za-z]+)")


@cache
def upstream_definitions() -> dict[str, Any]:
    import kubernetes_validate

    path = Path(kubernetes_validate.__file__).parent / "kubernetes-json-schema" / f"{KUBERNETES}-local" / \
        "_definitions.json"
    return json.loads(path.read_text())["$defs"]


def _resolve(node: dict[str, Any]) -> dict[str, Any]:
    ref = node.get("$ref", "")
    return upstream_definitions()[ref.rsplit("/", 1)[-1]] if ref else node


def describe(ours: dict[str, Any], theirs: dict[str, Any]) -> None:
    """Give each field under `ours` without a description the one of the same field of `theirs` (an
    upstream definition), recursively through objects, list items and map values."""
    theirs = _resolve(theirs)
    upstream = theirs.get("properties") or {}
    for key, sub in (ours.get("properties") or {}).items():
        if key not in upstream:
            continue
        if not sub.get("description") and upstream[key].get("description"):
            sub["description"] = upstream[key]["description"]
        describe(sub, upstream[key])
    if isinstance(ours.get("items"), dict) and isinstance(theirs.get("items"), dict):
        describe(ours["items"], theirs["items"])
    if isinstance(ours.get("additionalProperties"), dict) and isinstance(theirs.get("additionalProperties"), dict):
        describe(ours["additionalProperties"], theirs["additionalProperties"])


def with_upstream_descriptions(schema: dict[str, Any]) -> dict[str, Any]:
    """`schema` (an openAPIV3Schema) with the copied types' fields described; the input is not changed."""
    schema = copy.deepcopy(schema)

    def walk(node: dict[str, Any]) -> None:
        if match := COPIED.search(node.get("description", "")):
            definition = {"$ref": f"io.k8s.api.{match.group(1)}.v1.{match.group(2)}"}
            describe(node["items"] if node.get("type") == "array" else node, definition)
            return
        for sub in (node.get("properties") or {}).values():
            walk(sub)
        for key in ("items", "additionalProperties"):
            if isinstance(node.get(key), dict):
                walk(node[key])

    walk(schema)
    return schema


def manifest() -> dict[str, Any]:
    crd = crd_manifest()
    for version in crd["spec"]["versions"]:
        version["schema"]["openAPIV3Schema"] = with_upstream_descriptions(version["schema"]["openAPIV3Schema"])
    return crd


def render() -> str:
    return HEADER + yaml.safe_dump(manifest(), sort_keys=False, width=120)


if __name__ == "__main__":
    print(render(), end="")
