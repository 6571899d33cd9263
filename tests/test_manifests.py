"""Every generated manifest, the CRD and the examples, validated against Kubernetes schemas."""

from __future__ import annotations

import kubernetes_validate
import pytest
import yaml

from conftest import EXAMPLES, ROOT, load_yaml, rtj_body
from rtj_operator import api, crd
from rtj_operator.builders import build_job, build_pvc, build_service
from rtj_operator.spec import RTJ, schema_errors, semantic_errors

K8S_VERSION = "1.33.0"  # EKS's supported range; the schemas ship inside kubernetes-validate
CRD_FILE = ROOT / "crds" / f"{api.GROUP}_{api.PLURAL}.yaml"


def validate(manifest: dict) -> None:
    kubernetes_validate.validate(manifest, K8S_VERSION, strict=True)


@pytest.mark.parametrize("example", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_examples_pass_schema_and_semantics(example):
    body = load_yaml(example)
    assert schema_errors(body) == []
    assert semantic_errors(RTJ.from_body(body)) == []


@pytest.mark.parametrize("example", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_generated_children_validate_against_kubernetes_schemas(example):
    rtj = RTJ.from_body(load_yaml(example))
    for manifest in (build_service(rtj), build_job(rtj, attempt=3), build_pvc(rtj)):
        if manifest is not None:
            validate(manifest)


def test_strict_validation_catches_a_broken_manifest():
    job = build_job(RTJ.from_body(rtj_body()))
    job["spec"]["template"]["spec"]["containers"][0]["imagePullPolicy"] = 42
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(job)


def test_crd_validates_and_is_structural():
    manifest = load_yaml(CRD_FILE)
    validate(manifest)
    version = manifest["spec"]["versions"][0]
    assert version["subresources"] == {"status": {}}
    assert [c["name"] for c in version["additionalPrinterColumns"]] == [
        "Phase", "Ready", "Desired", "Restarts", "Ckpt-Step", "Age"]
    assert manifest["spec"]["names"]["shortNames"] == ["rtj"]

    def walk(schema, path="spec"):
        # Structural: every node has a type unless it preserves unknown fields.
        assert "type" in schema or schema.get("x-kubernetes-preserve-unknown-fields"), path
        for key, sub in (schema.get("properties") or {}).items():
            walk(sub, f"{path}.{key}")
        if isinstance(schema.get("items"), dict):
            walk(schema["items"], f"{path}[]")
    walk(version["schema"]["openAPIV3Schema"])


def test_crd_file_is_generated_from_api_py():
    assert CRD_FILE.read_text() == crd.render(), "run `make crds`"


def test_crd_defaults_are_valid_against_their_own_schema():
    assert yaml.safe_load(crd.render())["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["required"] == ["spec"]
    assert schema_errors(rtj_body()) == []
