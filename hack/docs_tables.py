"""Write the tables the docs repeat from the code, between `<!-- BEGIN name -->` and `<!-- END name -->`:

- docs/recovery.md `exit-codes`: each exit code of the worker's entrypoint, what it means (its comment
  in worker/rtj_worker/exit_codes.py) and what the operator makes of it (rtj_operator.ladder: the
  finding classify() returns for a pod that ended so, and that finding's tier and payer in FINDINGS);
- docs/security.md `rbac`: every rule of the chart's Roles and ClusterRoles (bound, or aggregated to the
  built-in user roles), as `helm template` renders them with the default values and with each value
  that changes them, with the comment above the rule in its template (why it is granted).

    python hack/docs_tables.py            # rewrite the tables
    python hack/docs_tables.py --check    # fail if a table is out of date (tests/unit/test_docs_tables.py)

helm: .tools/bin/helm (`make tools`).
"""

from __future__ import annotations

import datetime
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "operator"), str(ROOT / "worker")]

from rtj_operator import ladder  # noqa: E402
from rtj_worker import exit_codes  # noqa: E402

EXIT_CODES_PY = ROOT / "worker" / "rtj_worker" / "exit_codes.py"
CHART = ROOT / "charts" / "rtj-operator"


def replace_block(text: str, name: str, table: str) -> str:
    """`text` with what lies between the markers of `name` replaced by `table`."""
    begin, end = f"<!-- BEGIN {name}", f"<!-- END {name} -->"
    start = text.index(begin)
    start = text.index("\n", start) + 1
    return text[:start] + table + text[text.index(end, start):]


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


# --- exit codes -------------------------------------------------------------------------------------
CONSTANT = re.compile(r"^([A-Z][A-Z0-9_]*) = (\d+)$")
# Who pays, as the budget it counts against (ladder's payers; their counters are BUDGETS').
PAYS = {ladder.JOB: "job (`jobRestarts`)", ladder.PLATFORM: "platform (`disruptions`)", ladder.NOBODY: "nobody",
        ladder.PEERS: "decided per fault: the lost peer's node, the fault being recovered, or the job (below)"}
KINDS = {ladder.JOB_FAILURE: "job failure", ladder.PLATFORM_FAULT: "platform", ladder.PERMANENT: "permanent",
         ladder.RENDEZVOUS: "rendezvous", ladder.PEER: "peer", ladder.UNRESOLVED: "unresolved host",
         ladder.RDZV_CLOSED: "closed rendezvous"}


def exit_code_meanings(source: str) -> list[tuple[int, str, str]]:
    """(code, name, meaning) of each of the entrypoint's exit codes: an int constant of exit_codes.py and
    the comment block above it (NVRX_*: ft_launcher's own codes, not the entrypoint's)."""
    lines = source.splitlines()
    rows = []
    for i, line in enumerate(lines):
        match = CONSTANT.match(line)
        if not match or match.group(1).startswith("NVRX_"):
            continue
        block: list[str] = []
        for prev in reversed(lines[:i]):
            if not prev.startswith("#"):
                break
            block.insert(0, prev[1:].strip())
        if not block:
            raise ValueError(f"exit_codes.py: {match.group(1)} has no comment saying what it means")
        name, code = match.group(1), int(match.group(2))
        if getattr(exit_codes, name) != code:
            raise ValueError(f"exit_codes.py: {name} is not {code}")
        rows.append((code, name, " ".join(block)))
    return sorted(rows)


def outcome(code: int) -> tuple[str, str, str]:
    """(finding, tier, who pays) of a worker pod that ended with `code` and was not deleted, on a healthy
    node: what ladder.classify() makes of it."""
    now = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
    pod = {"metadata": {"name": "w-0", "uid": "u"},
           "status": {"phase": "Succeeded" if code == 0 else "Failed",
                      "containerStatuses": [{"state": {"terminated": {
                          "exitCode": code, "finishedAt": now.strftime("%Y-%m-%dT%H:%M:%SZ")}}}]}}
    found = ladder.classify(pod, None, now, ladder.Timing())
    if found is None:
        return "none (the pod Succeeded)", "none", PAYS[ladder.NOBODY]
    meaning = found.meaning
    tier = "Failed" if meaning.fails else meaning.tier or "none"
    if meaning.once_per == ladder.ATTEMPT:
        tier += ", once per attempt"
    return f"{KINDS[found.kind]} (`{found.reason}`)", tier, PAYS[meaning.payer]


def exit_codes_table() -> str:
    out = ["| exit | name | what it means (the worker) | finding | tier | charged to |", "|---|---|---|---|---|---|"]
    for code, name, meaning in exit_code_meanings(EXIT_CODES_PY.read_text()):
        finding, tier, pays = outcome(code)
        out.append(f"| {code} | `{name}` | {_cell(meaning)} | {finding} | {tier} | {pays} |")
    return "\n".join(out) + "\n"


# --- RBAC -------------------------------------------------------------------------------------------
RELEASE, RELEASE_NS = "rtj", "rtj-system"
# (the values' description, helm arguments, the scope of a Role in a namespace other than the release's)
VALUE_SETS = [
    ("", [], ""),
    ("`watch.clusterWide=false`", ["--set", "watch.clusterWide=false", "--set", "watch.namespaces={team-a}"],
     "each of `watch.namespaces`"),
    ("`leaderElection.enabled=false`", ["--set", "leaderElection.enabled=false", "--set", "replicaCount=1"], ""),
    ("`workerRBAC.namespaces`", ["--set", "workerRBAC.namespaces={team-a}"], "each of `workerRBAC.namespaces`"),
    ("`userRoles.enabled=false`", ["--set", "userRoles.enabled=false"], ""),
    ("`metrics.secure=false`", ["--set", "metrics.secure=false"], ""),
]
AGGREGATE = "rbac.authorization.k8s.io/aggregate-to-"
RULE = re.compile(r"^(\s*)- (apiGroups|nonResourceURLs):")
HOOK = "helm.sh/hook"


HELM = ROOT / ".tools" / "bin" / "helm"  # `make tools`


def render(args: list[str]) -> str:
    return subprocess.run([str(HELM), "template", RELEASE, str(CHART), "--namespace", RELEASE_NS, *args],
                          check=True, capture_output=True, text=True).stdout


def rule_comments(doc_text: str) -> list[str]:
    """The comment block above each rule of a rendered Role, in order."""
    lines = doc_text.splitlines()
    comments = []
    for i, line in enumerate(lines):
        if match := RULE.match(line):
            block: list[str] = []
            for prev in reversed(lines[:i]):
                if not prev.startswith(f"{match.group(1)}#"):
                    break
                block.insert(0, prev.strip()[1:].strip())
            comments.append(" ".join(block))
    return comments


def grants(rendered: str, ns_scope: str) -> list[tuple[str, str, str, str, str]]:
    """(ServiceAccount, resource, verbs, why, scope) of every rule of the rendered roles."""
    docs = [(text, yaml.safe_load(text)) for text in re.split(r"^---$", rendered, flags=re.M)]
    docs = [(text, doc) for text, doc in docs if doc]
    fullname = next(doc["metadata"]["name"] for _, doc in docs if doc["kind"] == "ClusterRoleBinding")
    rows = []
    for text, role in docs:
        if role["kind"] not in ("Role", "ClusterRole"):
            continue
        ns = role["metadata"].get("namespace")
        bindings = [doc for _, doc in docs if doc["kind"] == f"{role['kind']}Binding" and
                    doc["roleRef"]["name"] == role["metadata"]["name"] and doc["metadata"].get("namespace") == ns]
        binding = next((b for b in bindings if HOOK not in (b["metadata"].get("annotations") or {})), None)
        hooked = [s["name"].replace(fullname, "<fullname>") for b in bindings if b is not binding
                  for s in b["subjects"]]
        built_in = [k.removeprefix(AGGREGATE) for k, v in (role["metadata"].get("labels") or {}).items()
                    if k.startswith(AGGREGATE) and v == "true"]
        if binding is None and built_in:  # a user role, aggregated to built-in ones: it reaches whoever holds those
            who, scope = "users: " + ", ".join(f"`{r}`" for r in built_in), "where those roles are bound"
        elif binding is None and role["kind"] == "ClusterRole" and hooked:
            # A role for the cluster's admin to bind (e.g. scrapers to metrics-reader); the chart binds it
            # only for its own `helm test` pod.
            who = "whom you bind to it; " + ", ".join(f"`{h}` (`helm test`)" for h in hooked)
            scope = "cluster"
        elif binding is None:
            raise ValueError(f"{role['kind']} {role['metadata']['name']}: neither bound nor aggregated")
        else:
            who = ", ".join("operator" if s["name"] == fullname else f"`{s['name']}`" for s in binding["subjects"])
            scope = "cluster" if role["kind"] == "ClusterRole" else "release namespace" if ns == RELEASE_NS \
                else ns_scope
        comments = rule_comments(text)
        if len(comments) != len(role["rules"]):
            raise ValueError(f"{role['kind']} {role['metadata']['name']}: every rule must start with apiGroups")
        for rule, why in zip(role["rules"], comments, strict=True):
            if not why:
                raise ValueError(f"{role['kind']} {role['metadata']['name']}: rule {rule} has no comment above it")
            why = why.replace(fullname, "<fullname>")
            for url in rule.get("nonResourceURLs") or []:
                rows.append((who, f"`{url}` (non-resource URL)", ", ".join(rule["verbs"]), why, scope))
            for group in rule.get("apiGroups") or []:
                for resource in rule["resources"]:
                    name = f"`{resource}`" + (f" ({group})" if group else "")
                    if rule.get("resourceNames"):
                        name += " named " + ", ".join(f"`{n}`".replace(fullname, "<fullname>")
                                                      for n in rule["resourceNames"])
                    rows.append((who, name, ", ".join(rule["verbs"]), why, scope))
    return rows


def rbac_table(render: Callable[[list[str]], str] = render) -> str:
    scopes: dict[tuple[str, str, str, str], dict[str, set[str]]] = {}
    for label, args, ns_scope in VALUE_SETS:
        for who, resource, verbs, why, scope in grants(render(args), ns_scope):
            scopes.setdefault((who, resource, verbs, why), {}).setdefault(label, set()).add(scope)
    out = ["| resource | verbs | scope | for | why (the comment in the template) |", "|---|---|---|---|---|"]
    for (who, resource, verbs, why), by_set in scopes.items():
        default = " and ".join(sorted(by_set.get("", ()))) or "none"
        cell = [default] + [f"with {label}: {' and '.join(sorted(by_set.get(label, ()))) or 'none'}"
                            for label, _, _ in VALUE_SETS[1:] if by_set.get(label, set()) != by_set.get("", set())]
        out.append(f"| {resource} | {verbs} | {'; '.join(cell)} | {who} | {_cell(why)} |")
    return "\n".join(out) + "\n"


# --- the files --------------------------------------------------------------------------------------
TABLES: dict[str, tuple[Path, Callable[[], str]]] = {
    "exit-codes": (ROOT / "docs" / "recovery.md", exit_codes_table),
    "rbac": (ROOT / "docs" / "security.md", rbac_table),
}


def expected(name: str) -> tuple[Path, str]:
    """The file that holds table `name`, and its text with the table as generated now."""
    path, table = TABLES[name]
    return path, replace_block(path.read_text(), name, table())


def main(argv: list[str]) -> int:
    stale = []
    for name in TABLES:
        path, text = expected(name)
        if path.read_text() == text:
            continue
        if "--check" in argv:
            stale.append(str(path))
        else:
            path.write_text(text)
    if stale:
        print(f"out of date: {', '.join(stale)}: run `python hack/docs_tables.py`", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
