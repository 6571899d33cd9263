"""Every generated manifest, the CRD and the examples, validated against Kubernetes schemas."""

from __future__ import annotations

import re

import kubernetes_validate
import pytest
import yaml
from pod_examples import FULL_POD

from rtj_operator import api, crd
from rtj_operator.builders import build_job, build_pvc, build_service
from rtj_operator.spec import (
    ALLOWED_SERVICE_ACCOUNTS_ENV,
    RTJ,
    allowed_service_accounts_from_env,
    schema_errors,
    semantic_errors,
    with_defaults,
)
from testkit import EXAMPLES, ROOT, load_yaml, rtj_body

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
    columns = version["additionalPrinterColumns"]
    assert [c["name"] for c in columns if not c.get("priority")] == [
        "Phase", "Ready", "Desired", "Restarts", "Step", "Ckpt-Step", "Ckpt-Age", "Age"]
    assert [c["name"] for c in columns if c.get("priority")] == [  # kubectl get rtj -o wide
        "Spares", "Attempt", "Disruptions", "All-Restarts", "In-Process", "Launcher", "Last-Recovery"]
    # Each column's field is one the status declares, and a count says what it counts.
    status = version["schema"]["openAPIV3Schema"]["properties"]["status"]
    for column in columns:
        path = column["jsonPath"].lstrip(".").split(".")
        node = version["schema"]["openAPIV3Schema"] if path[0] == "status" else None
        for key in path if node is not None else []:
            node = node["properties"][key] if "properties" in node else node["additionalProperties"]
        assert path[0] == "metadata" or node is not None, column
        assert column["name"] in ("Phase", "Step", "Ckpt-Step", "Age", "Attempt", "Last-Recovery", "Ready",
                                  "Desired", "In-Process", "Launcher") or column.get("description"), column
    assert "standbys" in status["properties"]
    # The README's example of `kubectl get rtj` has the same columns.
    readme = (ROOT / "README.md").read_text()
    header = next(line.split() for line in readme.splitlines() if line.strip().startswith("NAME ") and "PHASE" in line)
    assert header == ["NAME", *[c["name"].upper() for c in columns if not c.get("priority")]]
    assert manifest["spec"]["names"]["shortNames"] == ["rtj"]

    def walk(schema, path="spec"):
        # Structural: every node has a type unless it preserves unknown fields or is int-or-string.
        assert "type" in schema or schema.get("x-kubernetes-preserve-unknown-fields") \
            or schema.get("x-kubernetes-int-or-string"), path
        for key, sub in (schema.get("properties") or {}).items():
            walk(sub, f"{path}.{key}")
        if isinstance(schema.get("items"), dict):
            walk(schema["items"], f"{path}[]")
        if isinstance(schema.get("additionalProperties"), dict):
            walk(schema["additionalProperties"], f"{path}{{}}")
    walk(version["schema"]["openAPIV3Schema"])


def test_crd_file_is_generated_from_api_py():
    assert CRD_FILE.read_text() == crd.render(), "run `make crds`"


def copied(node: dict) -> bool:
    """A field that holds a copied upstream type, core/v1 or networking/v1 (its description names it)."""
    return bool(crd.COPIED.search(node.get("description", "")))


def test_every_field_of_the_crd_is_described():
    """`kubectl explain rtj.<field>` has something to say for every field: the RTJ's own (api.py), and
    those inside the copied core/v1 and networking/v1 types (their upstream descriptions, crd.py)."""
    schema = load_yaml(CRD_FILE)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]
    found = [(path, node) for part in ("spec", "status") for path, node in nodes(schema[part], part)]
    fields = [(path, node) for path, node in found if path not in ("spec", "status") and path[-1] not in "]}"]
    assert [path for path, node in fields if not node.get("description")] == []
    holders = {path for path, node in fields if copied(node)}
    assert {"spec.placement.affinity", "spec.pod.initContainers", "spec.isolation.allowFrom"} <= holders
    inside = [path for path, _ in fields if any(path.startswith(f"{h}.") or path.startswith(f"{h}[]") for h in holders)]
    assert len(inside) > 200, len(inside)  # the copied types' own fields are checked too
    by_path = dict(fields)
    # Upstream's words, where api.py says nothing of its own ...
    assert by_path["spec.placement.tolerations[].tolerationSeconds"]["description"].startswith(
        "TolerationSeconds represents the period of time the toleration")
    # ... and api.py's own where it does.
    assert by_path["spec.env[].name"]["description"] == "Environment variable name (printable ASCII but '=')."


def test_upstream_descriptions_fill_only_what_is_missing_and_follow_lists_and_references():
    ours = {"type": "object", "properties": {
        "tolerations": {"type": "array", "description": "Mine (core/v1 Toleration).", "items": {
            "type": "object", "properties": {"key": {"type": "string", "description": "My key."},
                                             "effect": {"type": "string"}, "mine": {"type": "string"}}}},
        "affinity": {"type": "object", "description": "(core/v1 Affinity)", "properties": {
            "nodeAffinity": {"type": "object", "properties": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "type": "object", "properties": {"nodeSelectorTerms": {"type": "array", "items": {
                    "type": "object", "properties": {"matchFields": {"type": "array"}}}}}}}}}}}}
    out = crd.with_upstream_descriptions(ours)
    toleration = out["properties"]["tolerations"]
    assert toleration["description"] == "Mine (core/v1 Toleration)."
    assert toleration["items"]["properties"]["key"]["description"] == "My key."
    assert toleration["items"]["properties"]["effect"]["description"].startswith("Effect indicates the taint effect")
    assert "description" not in toleration["items"]["properties"]["mine"]  # not upstream's: the test above fails it
    term = out["properties"]["affinity"]["properties"]["nodeAffinity"]["properties"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["properties"]["nodeSelectorTerms"]
    assert term["description"].startswith("Required. A list of node selector terms")
    assert term["items"]["properties"]["matchFields"]["description"].startswith("A list of node selector requirements")
    assert "description" not in ours["properties"]["tolerations"]["items"]["properties"]["effect"]  # a copy


def test_crd_defaults_are_valid_against_their_own_schema():
    assert yaml.safe_load(crd.render())["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["required"] == ["spec"]
    assert schema_errors(rtj_body()) == []


def nodes(schema: dict, path: str = "", stop=lambda node: False) -> list[tuple[str, dict]]:
    """Every (path, schema node) under `schema`, itself first; path uses '[]' for items and '{}' for values. A
    node for which `stop` is true is listed, what is under it is not."""
    found = [(path, schema)]
    if stop(schema):
        return found
    for key, sub in (schema.get("properties") or {}).items():
        found += nodes(sub, f"{path}.{key}", stop)
    if isinstance(schema.get("items"), dict):
        found += nodes(schema["items"], f"{path}[]", stop)
    if isinstance(schema.get("additionalProperties"), dict):
        found += nodes(schema["additionalProperties"], f"{path}{{}}", stop)
    return found


def cel_rules(schema: dict, path: str = "") -> list[tuple[str, dict]]:
    """Every (path, x-kubernetes-validations rule) of a schema."""
    return [(at, rule) for at, node in nodes(schema, path) for rule in node.get("x-kubernetes-validations", [])]


def test_cel_rules_guard_what_the_schema_alone_cannot():
    paths = {path for path, _ in cel_rules(api.openapi_schema())}
    assert {"", ".spec", ".spec.placement.nodeSelector", ".spec.placement.tolerations[]", ".spec.env[]",
            ".spec.resources.limits", ".spec.resources.requests", ".spec.storage.size",
            ".spec.checkpoint.dir"} <= paths
    root = [rule for path, rule in cel_rules(api.openapi_schema()) if path == ""]
    assert root == [api.NAME_RULE] and "self.metadata.name" in root[0]["rule"]


CEL_IDENTIFIERS = {"self", "k", "has", "size", "matches", "all", "exists", "exists_one", "startsWith", "endsWith",
                   "contains", "indexOf", "lowerAscii", "in", "true", "false", "r",
                   "m", "n", "v", "c", "x", "p", "q"}  # the macros' variables


@pytest.mark.parametrize("path, rule", cel_rules(api.openapi_schema()),
                         ids=[f"{p or '<root>'}:{i}" for i, (p, _) in enumerate(cel_rules(api.openapi_schema()))])
def test_cel_rules_are_plausible(path, rule):
    """Balanced, only Kubernetes CEL functions, a message; the API server compiles them at CRD creation."""
    text, message = rule["rule"], rule["message"]
    assert message and len(message) < 300
    literals = re.findall(r"r?'[^']*'", text)
    code = re.sub(r"r?'[^']*'", "''", text)
    for opening, closing in ("()", "[]"):
        assert code.count(opening) == code.count(closing), text
    assert set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", code)) - {p for p in re.findall(r"\.(\w+)", code)} \
        <= CEL_IDENTIFIERS, text
    for literal in literals:
        if literal.startswith("r'"):
            re.compile(literal[2:-1])  # RE2 patterns here use only syntax Python's re shares


def cel_program(rule: str):
    celpy = pytest.importorskip("celpy")
    env = celpy.Environment()
    # Kubernetes' CEL includes the strings extension; celpy lacks indexOf.
    functions = {"indexOf": lambda s, sub: celpy.celtypes.IntType(str(s).find(str(sub))),
                 "lowerAscii": lambda s: celpy.celtypes.StringType(str(s).lower())}
    return env.program(env.compile(rule), functions=functions), celpy


def cel_failures(schema: dict, value, path: str = "") -> list[str]:
    """Evaluate every rule where the object has a value, as kube-apiserver does; messages of the failed ones."""
    failures = []
    for rule in schema.get("x-kubernetes-validations", []):
        program, celpy = cel_program(rule["rule"])
        if not program.evaluate({"self": celpy.json_to_cel(value)}):
            failures.append(f"{path}: {rule['message']}")
    if isinstance(value, dict):
        for key, sub in (schema.get("properties") or {}).items():
            if key in value:
                failures += cel_failures(sub, value[key], f"{path}.{key}")
        if isinstance(schema.get("additionalProperties"), dict):
            for key, item in value.items():
                failures += cel_failures(schema["additionalProperties"], item, f"{path}[{key}]")
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            failures += cel_failures(schema["items"], item, f"{path}[{i}]")
    return failures


def defaulted(body: dict) -> dict:
    return {**body, "spec": with_defaults(body["spec"])}


@pytest.mark.parametrize("name, spec, fragment", [
    ("70b-run", {}, "metadata.name must be a DNS-1035 label"),
    ("llama.v2", {}, "metadata.name must be a DNS-1035 label"),
    ("a" * 59, {}, "metadata.name must be a DNS-1035 label"),
    ("train", {"placement": {"nodeSelector": {"bad key": "x"}}}, "nodeSelector keys must be label keys"),
    ("train", {"placement": {"nodeSelector": {"a" * 254 + "/b": "x"}}}, "nodeSelector keys must be label keys"),
    ("train", {"placement": {"tolerations": [{"operator": "Equal"}]}}, "without a key must use operator Exists"),
    ("train", {"placement": {"tolerations": [{"key": "k", "operator": "Exists", "value": "v"}]}},
     "must not set a value"),
    ("train", {"placement": {"tolerations": [{"key": "k", "tolerationSeconds": 3}]}}, "requires effect NoExecute"),
    ("train", {"env": [{"name": "A", "value": "x", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]},
     "set value or valueFrom, not both"),
    ("train", {"resources": {"limits": {"cpus": "1"}}}, "resource names are"),
    ("train", {"resources": {"requests": {"kubernetes.io/x": "1"}}}, "resource names are"),
    ("train", {"storage": {"storageClassName": "s", "size": "0Gi"}}, "storage.size must be greater than 0"),
    ("train", {"checkpoint": {"dir": "a/../.."}}, "must not contain '..'"),
    ("train", {"checkpoint": {"dir": "/etc"}}, "must lie inside storage.mountPath"),
    ("train", {"storage": {"storageClassName": "s", "mountPath": "/dev/shm"}}, "must not be /dev/shm"),
    ("train", {"placement": {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "k", "operator": "Exists", "values": ["v"]}]}]}}}}},
     "take no values"),
    ("train", {"pod": {"labels": {"bad key": "x"}}}, "labels keys must be label keys"),
    ("train", {"pod": {"labels": {"training.rtj.dev/name": "other"}}}, "labels must not use the operator's"),
    ("train", {"pod": {"labels": {"app.kubernetes.io/component": "x"}}}, "labels must not use the operator's"),
    ("train", {"pod": {"annotations": {"Batch.Kubernetes.io/job-completion-index": "0"}}},
     "annotations must not use the operator's"),
    ("train", {"pod": {"annotations": {"bad key": "x"}}}, "annotations keys must be qualified names"),
    ("train", {"pod": {"volumes": [{"name": "data"}]}}, "exactly one source"),
    ("train", {"pod": {"volumes": [{"name": "data", "emptyDir": {}, "nfs": {"server": "s", "path": "/"}}]}},
     "exactly one source"),
    ("train", {"pod": {"volumes": [{"name": "dshm", "emptyDir": {}}]}}, "are the operator's"),
    ("train", {"pod": {"volumes": [{"name": "d", "hostPath": {"path": "/a/../etc"}}]}}, "must not contain '..'"),
    ("train", {"pod": {"volumes": [{"name": "d", "secret": {"secretName": "s", "items": [
        {"key": "k", "path": "/etc/x"}]}}]}}, "must be a relative path"),
    ("train", {"pod": {"volumeMounts": [{"name": "data", "mountPath": "/data"}]}}, "must name a volume"),
    ("train", {"pod": {"volumes": [{"name": "d", "emptyDir": {}}], "volumeMounts": [
        {"name": "d", "mountPath": "/x"}, {"name": "d", "mountPath": "/x"}]}}, "mountPath must be unique"),
    ("train", {"pod": {"volumes": [{"name": "d", "emptyDir": {}}], "volumeMounts": [
        {"name": "d", "mountPath": "/checkpoints"}]}}, "must not use /dev/shm or storage.mountPath"),
    ("train", {"pod": {"volumes": [{"name": "d", "emptyDir": {}}], "volumeMounts": [
        {"name": "d", "mountPath": "/x", "subPath": "../y"}]}}, "must not contain '..'"),
    ("train", {"pod": {"initContainers": [{"name": "worker", "image": "i"}]}}, "is the operator's"),
    ("train", {"pod": {"initContainers": [{"name": "s", "image": "i", "volumeMounts": [
        {"name": "nope", "mountPath": "/x"}]}]}}, "must name a volume"),
    ("train", {"pod": {"initContainers": [{"name": "s", "image": "i", "ports": [
        {"containerPort": 1, "name": "a"}, {"containerPort": 2, "name": "a"}]}]}}, "port names must be unique"),
    ("train", {"pod": {"initContainers": [{"name": "s", "image": "i", "ports": [
        {"containerPort": 1, "name": "80"}]}]}}, "IANA service name"),
    ("train", {"pod": {"initContainers": [{"name": "s", "image": "i", "securityContext": {
        "privileged": True, "allowPrivilegeEscalation": False}}]}}, "allowPrivilegeEscalation cannot be false"),
    ("train", {"pod": {"initContainers": [{"name": "s", "image": "i", "securityContext": {
        "seccompProfile": {"type": "Localhost"}}}]}}, "localhostProfile is set exactly"),
    # The server refuses localhostProfile with any other type, even empty (found by the server dry run).
    ("train", {"pod": {"initContainers": [{"name": "s", "image": "i", "securityContext": {
        "seccompProfile": {"type": "RuntimeDefault", "localhostProfile": ""}}}]}}, "localhostProfile is set exactly"),
])
def test_cel_rules_reject_what_semantic_errors_rejects(name, spec, fragment):
    """The CRD's CEL rules (run by kube-apiserver) and spec.semantic_errors (run by the operator) agree."""
    body = defaulted(rtj_body(name=name, **spec))
    failures = cel_failures(api.openapi_schema(), body)
    assert any(fragment in f for f in failures), failures
    assert semantic_errors(RTJ.from_body(body)) != []


@pytest.mark.parametrize("example", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_cel_rules_accept_the_examples(example):
    assert cel_failures(api.openapi_schema(), defaulted(load_yaml(example))) == []


def test_cel_rules_accept_a_spec_using_every_typed_field():
    spec = {"env": [{"name": "my.var", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
            "placement": {"nodeSelector": {"example.com/pool": "a"},
                          "tolerations": [{"operator": "Exists"},
                                          {"key": "k", "effect": "NoExecute", "tolerationSeconds": 1}],
                          "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                              "nodeSelectorTerms": [{"matchExpressions": [
                                  {"key": "gen", "operator": "Gt", "values": ["4"]}]}]}}}},
            "resources": {"limits": {"example.com/fpga": 1, "cpu": "4"}},
            "checkpoint": {"dir": "/checkpoints/x"},
            "pod": FULL_POD}
    body = defaulted(rtj_body(**spec))
    assert cel_failures(api.openapi_schema(), body) == []
    assert semantic_errors(RTJ.from_body(body)) == []


def test_chart_passes_the_service_account_allow_list_to_the_operator():
    """policy.allowedServiceAccounts reaches the operator as the env spec.allowed_service_accounts_from_env reads."""
    chart = ROOT / "charts" / "rtj-operator"
    assert yaml.safe_load((chart / "values.yaml").read_text())["policy"] == {"allowedServiceAccounts": []}
    deployment = (chart / "templates" / "deployment.yaml").read_text()
    assert f"- name: {ALLOWED_SERVICE_ACCOUNTS_ENV}\n" in deployment
    assert 'value: {{ join "," . | quote }}' in deployment
    assert allowed_service_accounts_from_env({ALLOWED_SERVICE_ACCOUNTS_ENV: "rtj-worker,team-a/trainer"}) \
        == frozenset({"rtj-worker", "team-a/trainer"})
