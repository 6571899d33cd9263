"""The side effects a pass decided on, and the one place they are carried out.

reconcile() returns Actions (pure data); execute() performs them in order against the API and
returns a Result for each; reconcile.settle() folds the results (a create the server rejected, a
name held by someone else's object) into the status before the pass writes it. Every action is
either idempotent or derived from what status already records, so a pass that dies half-way and
runs again performs each effect once (see reconcile's module doc).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .kube import Kube, KubeError

CREATE = "create"
DRY_RUN = "dry-run"  # server-side dry-run create: would the server take this object?
PATCH = "patch"
DELETE = "delete"
EVICT = "evict"
FAIL_POD = "fail-pod"  # as PodGC: status Failed + DisruptionTarget, then delete now (both UID-guarded)
# A merge patch of a pod that carries its uid and resourceVersion: it applies to the pod as the pass saw
# it or not at all (gone, or changed since: the next pass looks again).
UNGATE = "ungate"

# Client errors of a create or dry run that mean the spec produces an object the server rejects:
# validation (400, 422), an admission webhook or policy that denied it (403 "denied"), or a built-in
# pod admission plugin refusing what the spec names (403 with the plugin's own words, from
# plugin/pkg/admission/{priority,serviceaccount} and pod-security-admission). Other 403s (RBAC, a
# namespace being deleted, a full ResourceQuota) are not the spec's fault.
REJECTED = (400, 422)
FORBIDDEN_BY_SPEC = (
    "denied",
    "no PriorityClass with name",  # spec.priorityClassName names none
    "error looking up service account",  # spec.serviceAccountName names none in the namespace
    "violates PodSecurity",  # the namespace's Pod Security level
)


def rejected(exc: KubeError) -> bool:
    return exc.status in REJECTED or (exc.status == 403 and any(f in str(exc) for f in FORBIDDEN_BY_SPEC))


@dataclass(frozen=True)
class Action:
    verb: str
    kind: str
    name: str
    namespace: str
    body: dict[str, Any] | None = None  # the object (create, dry run) or the patch
    # DELETE: propagation and grace; FAIL_POD/DELETE/PATCH: the uid the target must still have.
    propagation: str = "Background"
    grace_seconds: int | None = None
    uid: str = ""
    # Posted once the action succeeded (it reports a side effect, so even if the status write fails).
    event: tuple[str, str, str] | None = None
    # A child the later actions need (Service, PVC, Job): if it fails, the rest of this pass waits.
    gates: bool = False
    # CREATE: a 409 is fine when the existing object is ours (owner uid, or these labels on a retained PVC).
    owner_uid: str = ""
    retained_labels: dict[str, str] = field(default_factory=dict)
    # CREATE of a helper the job does without (a capacity probe): any refusal (a full ResourceQuota, a
    # PriorityClass missing) is a Result to report, never a failed pass.
    best_effort: bool = False


@dataclass
class Result:
    action: Action
    ok: bool = True
    rejected: str = ""  # the server rejects what the spec produced
    conflict: str = ""  # an object we do not own holds the name
    refused: str = ""  # a PodDisruptionBudget said not now (429)
    failed: str = ""  # a best-effort create the server refused, in its words
    skipped: bool = False  # not tried: an earlier gating action failed
    obj: dict[str, Any] | None = None


def execute(kube: Kube, actions: list[Action]) -> list[Result]:
    """Carry out `actions` in order; errors other than the ones a Result describes propagate."""
    results: list[Result] = []
    blocked = False
    for action in actions:
        if blocked and action.gates:
            results.append(Result(action, ok=False, skipped=True))
            continue
        result = _one(kube, action)
        results.append(result)
        if action.gates and not result.ok:
            blocked = True
    return results


def _one(kube: Kube, a: Action) -> Result:
    if a.verb in (CREATE, DRY_RUN):
        try:
            return Result(a, obj=kube.create(a.body or {}, dry_run=a.verb == DRY_RUN))
        except KubeError as exc:
            if exc.status == 409:
                if a.verb == DRY_RUN:
                    return Result(a)  # validation runs before the name clash: 409 means the server takes it
                return _existing(kube, a)
            if a.best_effort:
                return Result(a, ok=False, failed=str(exc))
            if rejected(exc):
                return Result(a, ok=False, rejected=str(exc))
            raise
    if a.verb == PATCH:
        try:
            return Result(a, obj=kube.patch(a.kind, a.name, a.namespace, a.body or {}))
        except KubeError as exc:
            if rejected(exc):
                return Result(a, ok=False, rejected=str(exc))
            raise
    if a.verb == UNGATE:
        try:
            return Result(a, obj=kube.patch(a.kind, a.name, a.namespace, a.body or {}))
        except KubeError as exc:
            if exc.status in (404, 409):
                return Result(a, ok=False)
            raise
    if a.verb == DELETE:
        kube.delete(a.kind, a.name, a.namespace, grace_seconds=a.grace_seconds, propagation=a.propagation,
                    uid=a.uid or None)
        return Result(a)
    if a.verb == EVICT:
        outcome = kube.evict(a.name, a.namespace, uid=a.uid or None)
        return Result(a, ok=outcome == "evicted", refused=outcome if outcome == "refused" else "")
    if a.verb == FAIL_POD:
        if a.body:
            try:
                kube.patch("Pod", a.name, a.namespace, a.body, subresource="status", strategic=True)
            except KubeError as exc:
                if exc.status in (404, 409):  # gone, or another pod of that name now: nothing to do
                    return Result(a, ok=False)
                raise
        kube.delete("Pod", a.name, a.namespace, grace_seconds=0, uid=a.uid or None)
        return Result(a)
    raise ValueError(f"unknown action {a.verb}")


def _existing(kube: Kube, a: Action) -> Result:
    """A create found the name taken: ours (a previous pass, or a crash right after it) or a conflict."""
    have = kube.get(a.kind, a.name, a.namespace)
    if have is None:
        raise KubeError(409, f"{a.kind} {a.namespace}/{a.name} exists and vanished: try again")
    meta = have.get("metadata") or {}
    if any(ref.get("uid") == a.owner_uid for ref in meta.get("ownerReferences") or []):
        return Result(a, obj=have)
    labels = meta.get("labels") or {}
    if a.retained_labels and not meta.get("ownerReferences") and all(
            labels.get(k) == v for k, v in a.retained_labels.items()):
        return Result(a, obj=have)
    return Result(a, ok=False, conflict=f"{a.kind} {a.namespace}/{a.name} already exists and is not owned by "
                                         f"this ResilientTrainingJob", obj=have)
