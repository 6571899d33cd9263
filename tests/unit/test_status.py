"""The typed status (status.py) against the CRD's status schema (api.STATUS_SCHEMA): every field the
operator writes is declared (the API server would prune it otherwise), and a status round-trips."""

from __future__ import annotations

import dataclasses

from rtj_operator import api, ladder
from rtj_operator.status import Ledger, Status, _camel, status_patch


def test_every_status_field_is_in_the_crd_and_back():
    declared = set(api.STATUS_SCHEMA["properties"])
    assert {_camel(f.name) for f in dataclasses.fields(Status)} == declared
    ledger = api.STATUS_SCHEMA["properties"]["recovery"]["properties"]
    assert {_camel(f.name) for f in dataclasses.fields(Ledger)} == set(ledger)
    assert set(ledger["charged"]["properties"]) == {f.name for f in dataclasses.fields(ladder.Fault)}


def test_a_status_round_trips_and_unset_fields_stay_out():
    written = {"phase": "Restarting", "attempt": 2, "restarts": 3,
               "restartsByTier": {"InProcess": 4, "Launcher": 1, "ReplacePod": 2, "GangRestart": 1},
               "restartCounts": [{"tier": "InProcess", "reason": "RuntimeError", "charged": "job", "count": 4}],
               "lastRecovery": {"tier": "ReplacePod", "reason": "NodeLost", "seconds": 40.5,
                                "time": "2026-12-03T10:00:00Z"},
               "progress": {"step": 42, "checkpointStep": 40, "updateTime": "2026-12-03T10:00:05Z"},
               "goodput": {"training": 0.5, "infrastructure": 0.6, "inLoopSeconds": 12.5},
               "jobRestarts": 1, "disruptions": 2, "restartsWithoutProgress": 1, "stepAtLastRestart": 40,
               "lastCheckpointStep": 40, "restartStartedTime": "2026-12-03T10:00:00Z",
               "conditions": [{"type": "Running", "status": "False", "reason": "Restarting", "message": "",
                               "lastTransitionTime": "2026-12-03T10:00:00Z", "observedGeneration": 1}],
               "recovery": {"seenPods": ["u1"],
                            "charged": {"attempt": 2, "nodes": ["n1"], "faults": 1, "platform": True},
                            "pendingGangRestart": "RendezvousFailed",
                            "reports": {"u1": {"inProcess": 4, "launcher": 1, "inLoopSeconds": 12.5,
                                               "causes": {"InProcess/RuntimeError": 4}}},
                            "events": {"InProcess": {"count": 4, "time": "2026-12-03T10:00:00Z"}},
                            "stepAtFault": 42}}
    status = Status.from_dict(written)
    assert status.recovery.charged == ladder.Fault(2, ("n1",), 1, True)
    assert status.to_dict() == written
    status.restart_started_time = None
    status.recovery = Ledger()
    assert "restartStartedTime" not in status.to_dict() and "recovery" not in status.to_dict()


def test_a_new_status_has_the_counters_at_zero():
    assert Status.from_dict({}).to_dict() == {"attempt": 1, "restarts": 0, "jobRestarts": 0, "disruptions": 0,
                                             "restartsWithoutProgress": 0,
                                             "restartsByTier": {"InProcess": 0, "Launcher": 0, "ReplacePod": 0,
                                                                "GangRestart": 0},
                                             "conditions": []}


def test_status_patch_sets_changes_and_removes_keys():
    old = {"phase": "Running", "restartStartedTime": "t", "restarts": 1}
    assert status_patch(old, {"phase": "Running", "restarts": 2}) == {"restarts": 2, "restartStartedTime": None}
    assert status_patch(old, dict(old)) is None


def test_a_key_gone_from_a_nested_object_is_removed_by_the_merge_patch():
    old = {"recovery": {"seenPods": ["u"], "pendingGangRestart": "SpecChanged"}, "attempt": 2}
    new = {"recovery": {"seenPods": ["u", "v"]}, "attempt": 2}
    assert status_patch(old, new) == {"recovery": {"seenPods": ["u", "v"], "pendingGangRestart": None}}


def test_the_nested_fields_of_issue_31_are_declared():
    """Pruned by the API server otherwise: the status would differ from what the pass wrote on every pass."""
    from rtj_operator import progress
    from rtj_operator.policies import interval

    props = api.STATUS_SCHEMA["properties"]
    written = {**interval.suggest(100, 1.0, 1, 600.0, 0.5, 10.0), "policy": "YoungDaly", "appliedSteps": 100}
    assert set(written) == set(props["checkpointInterval"]["properties"])
    copies = progress._copies({"memoryBytes": 1, "nodeBytes": 2, "peerBytes": 3, "skipped": "x"})
    assert set(copies or {}) == set(props["progress"]["properties"]["stateCopies"]["properties"])
    assert {"restoredFrom", "restoreSeconds"} <= set(props["lastRecovery"]["properties"])
