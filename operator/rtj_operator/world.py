"""What one pass sees of an RTJ's world: the RTJ, its Service, Job and PVC, the current Job's pods and
their nodes. Read from the watch-fed stores (the operator) or from the API server (tools and tests:
`World.read`); either way a pass gets its own copies, so nothing it does reaches a store.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import kopf

from . import api, ladder
from .actions import rejected
from .builders import build_job, build_pvc, coordinator_name, job_name, network_policy_name, pvc_name, service_name
from .builders.coordinator import COMPONENT as COORDINATOR_COMPONENT
from .builders.job import template_hash, template_pod
from .builders.names import selector_labels
from .builders.probe import COMPONENT as PROBE_COMPONENT
from .copies import clone
from .kube import Kube, KubeError
from .policies import grace, interval
from .policies.pods import addressed_coordinator, attempt_job_name, coordinator_attempt, gated, job_attempt
from .spec import RTJ
from .stores import Stores

# A pre-flight check of the storage (fsx.py): (ok, reason, message). It runs only before the Job exists.
StorageCheck = Callable[[RTJ], tuple[bool, str, str]]
# A cloud check of a lost node (fencing.py): evidence that it runs nothing any more, or ''.
CloudFencing = Callable[[dict[str, Any]], str]
ZONE_LABEL = "topology.kubernetes.io/zone"
SERVICE_NAME_LABEL = "kubernetes.io/service-name"  # an EndpointSlice's Service (the EndpointSlice controller's)


def owned_by(obj: dict[str, Any] | None, uid: str) -> bool:
    return obj is not None and any(ref.get("uid") == uid for ref in obj.get("metadata", {}).get("ownerReferences")
                                   or [])


@dataclass
class World:
    rtj: dict[str, Any]
    service: dict[str, Any] | None = None
    job: dict[str, Any] | None = None
    pvc: dict[str, Any] | None = None
    # Pods of the newest Job: our labels select, the Job's owner reference decides (a pod that only
    # carries our labels, made by anyone who may create pods here, is not ours to count).
    pods: list[dict[str, Any]] = field(default_factory=list)
    nodes: dict[str, dict[str, Any] | None] = field(default_factory=dict)  # None: the node is gone
    coordinator: dict[str, Any] | None = None  # this attempt's coordinator pod (builders/coordinator.py), if any
    # Earlier gang attempts still going away (each attempt has its own Job and coordinator: builders/names.py):
    # their Jobs (deleted, Foreground), their workers, and their coordinators.
    old_jobs: list[dict[str, Any]] = field(default_factory=list)
    old_pods: list[dict[str, Any]] = field(default_factory=list)
    old_coordinators: list[dict[str, Any]] = field(default_factory=list)
    # Their nodes, apart from the gang's (`nodes`): an old pod's lost node is no loss of this gang's, and
    # counts in none of its charges or brakes.
    old_nodes: dict[str, dict[str, Any] | None] = field(default_factory=dict)
    network_policy: dict[str, Any] | None = None  # the gang's (builders/network.py), if any
    # Answers from outside, asked for before the pass decides (probe()): (ok, reason, message) of the
    # storage check, when it ran; (accepted, message) of a server-side dry run of a changed Job.
    storage: tuple[bool, str, str] | None = None
    template: tuple[bool, str] | None = None
    # Of the gang's lost nodes: evidence from a cloud check that one runs nothing any more (fencing.py),
    # and (nodes, lost nodes) of their zones, for the mass-loss brake.
    cloud_fencing: dict[str, str] = field(default_factory=dict)
    zones: dict[str, tuple[int, int]] = field(default_factory=dict)
    # The gang's capacity probes (builders/probe.py: pods the RTJ owns), while it is suspended for capacity.
    capacity_probes: list[dict[str, Any]] = field(default_factory=list)
    # Kueue's Workload for the Job (queued jobs, read while it matters: see probe), or why it could not be.
    workload: dict[str, Any] | None = None
    workload_error: str = ""
    # Whether this pass read the Workload (a running, admitted gang's is not read: status keeps it).
    workload_read: bool = False
    # Whether the Service's EndpointSlices list the coordinator's address (cluster DNS serves its name from
    # them), read only while the gang's pods wait for it (see probe); None: not read, or not readable.
    coordinator_published: bool | None = None
    # Pods of the current Job deleted moments ago, as last seen (stores.py `departed`): only their
    # termination reports are read (the final checkpoint step of a gang stopped by a suspend).
    departed: list[dict[str, Any]] = field(default_factory=list)
    # `rtj` parsed (spec defaulted) once, by assemble: probe, reconcile and settle share it.
    parsed: RTJ | None = field(default=None, compare=False, repr=False)

    def typed(self) -> RTJ:
        """The RTJ, parsed: assemble's parse (a World built by hand, e.g. in a test, is parsed here)."""
        return self.parsed if self.parsed is not None else RTJ.from_body(self.rtj)

    @classmethod
    def assemble(cls, rtj_body: dict[str, Any], service: dict[str, Any] | None, jobs: Iterable[dict[str, Any]],
                 pvc: dict[str, Any] | None, pods: list[dict[str, Any]],
                 node: Callable[[str], dict[str, Any] | None], departed: Iterable[dict[str, Any]] = (),
                 rtj: RTJ | None = None, network_policy: dict[str, Any] | None = None) -> World:
        """`jobs`: the Jobs labelled as the RTJ's children, and whatever holds the current attempt's Job name;
        `pods`: the pods labelled as its children (workers of every attempt, coordinators, capacity probes);
        `rtj`: rtj_body parsed, if the caller has it."""
        rtj = rtj or RTJ.from_body(rtj_body)
        attempt = attempt_of(rtj_body)
        job, old_jobs = current_job(list(jobs), rtj, attempt)
        job_uid = (job or {}).get("metadata", {}).get("uid")
        old_uids = {j["metadata"].get("uid") for j in old_jobs} - {None, ""}
        mine = [p for p in pods if job_uid and owned_by(p, job_uid)]
        old_pods = [p for p in pods if any(owned_by(p, uid) for uid in old_uids)]
        ours = [p for p in pods if owned_by(p, rtj.uid)]  # labelled like ours, made by someone else: not counted
        probes = [p for p in ours if component(p) == PROBE_COMPONENT]
        coordinators = sorted((p for p in ours if component(p) == COORDINATOR_COMPONENT),
                              key=lambda p: bool(p["metadata"].get("deletionTimestamp")))
        # This attempt's coordinator: of its attempt, and named after its Job (an earlier operator's gang
        # keeps '<name>-rdzv'); any other is an older gang's, retired.
        this_job = attempt_job_name(job, rtj, attempt)
        coordinator = next((p for p in coordinators if coordinator_attempt(p) == attempt
                            and p["metadata"]["name"] == coordinator_name(this_job)), None)
        old_coordinators = [p for p in coordinators if p is not coordinator]
        names = sorted({p.get("spec", {}).get("nodeName") for p in [*mine, *([coordinator] if coordinator else [])]}
                       - {None, ""})
        old_names = sorted({p.get("spec", {}).get("nodeName") for p in [*old_pods, *old_coordinators]}
                           - {None, ""})
        if build_pvc(rtj) is None:
            pvc = None  # an existing claim is the user's: not read, not checked
        if network_policy is not None and not owned_by(network_policy, rtj.uid):
            network_policy = None  # labelled like ours, made by someone else: never patched or deleted
        # The pods and nodes (one each per node of the job: the bulk of a pass's reading) are the stores' own
        # objects, shared, not copied: a pass only reads them (tests/unit/test_reconcile_table.py's W.run
        # checks every table's pass leaves them as they were). The few objects a pass may patch are copied.
        return cls(clone(rtj_body), clone(service), clone(job), clone(pvc), network_policy=clone(network_policy),
                   pods=mine, nodes={n: node(n) for n in names}, old_nodes={n: node(n) for n in old_names},
                   coordinator=clone(coordinator),
                   capacity_probes=probes, old_jobs=[clone(j) for j in old_jobs], old_pods=old_pods,
                   old_coordinators=[clone(p) for p in old_coordinators],
                   departed=[p for p in departed if job_uid and owned_by(p, job_uid)], parsed=rtj)

    @classmethod
    def from_stores(cls, stores: Stores, rtj_body: dict[str, Any],
                    node: Callable[[str], dict[str, Any] | None] | None = None) -> World:
        rtj = RTJ.from_body(rtj_body)
        ns, key = rtj.namespace, (rtj.namespace, rtj.name)
        jobs = [*stores.jobs.indexed("rtj", key), stores.jobs.get(ns, job_name(rtj, attempt_of(rtj_body)))]
        return cls.assemble(rtj_body, stores.services.get(ns, service_name(rtj)), [j for j in jobs if j is not None],
                            stores.pvcs.get(ns, pvc_name(rtj)), stores.pods.indexed("rtj", key),
                            node or (lambda n: stores.nodes.get("", n)), stores.pods.departed("rtj", key),
                            rtj, stores.network_policies.get(ns, network_policy_name(rtj)))

    def probe(self, kube: Kube, storage_check: StorageCheck | None = None,
              cloud_fencing: CloudFencing | None = None,
              zone_health: Callable[[str], tuple[int, int]] | None = None) -> World:
        """Ask what the pass needs to know from outside: the storage check before the Job exists;
        whether the server takes a Job whose pod template changed (a rejected edit must not take the
        running gang down); for lost nodes, a cloud check of fencing and the health of their zones.
        Each only when its answer can change what the pass does."""
        rtj = self.typed()
        now = datetime.datetime.now(datetime.UTC)
        lost = {name: node for name, node in self.nodes.items() if node is not None and ladder.node_lost(node, now)}
        if cloud_fencing is not None:
            self.cloud_fencing = {name: evidence for name, node in {**self.old_nodes, **lost}.items()
                                  if node is not None and ladder.node_lost(node, now)
                                  and (evidence := cloud_fencing(node))}
        if zone_health is not None:
            for node in lost.values():
                zone = (node["metadata"].get("labels") or {}).get(ZONE_LABEL)
                if zone and zone not in self.zones:
                    self.zones[zone] = zone_health(zone)
        self.workload, self.workload_error, self.workload_read = read_workload(kube, self, rtj)
        self.coordinator_published = read_published(kube, self, rtj)
        if storage_check is not None and self.job is None and not self.rtj["metadata"].get("deletionTimestamp"):
            self.storage = storage_check(rtj)
        desired = changed_template(self, rtj)
        if desired is not None:
            kopf.adopt(desired, owner=rtj.owner)
            self.template = dry_run_template(kube, desired)
        return self

    @classmethod
    def read(cls, kube: Kube, rtj_body: dict[str, Any]) -> World:
        """The world as the API server has it now (GETs and LISTs): tools and tests."""
        rtj = RTJ.from_body(rtj_body)
        ns = rtj.namespace
        pvc = kube.get("PersistentVolumeClaim", pvc_name(rtj), ns) if build_pvc(rtj) is not None else None
        jobs = [*kube.list("Job", ns, selector_labels(rtj)), kube.get("Job", job_name(rtj, attempt_of(rtj_body)), ns)]
        return cls.assemble(rtj_body, kube.get("Service", service_name(rtj), ns), [j for j in jobs if j is not None],
                            pvc, kube.list("Pod", ns, selector_labels(rtj)), lambda n: kube.get("Node", n), rtj=rtj,
                            network_policy=kube.get("NetworkPolicy", network_policy_name(rtj), ns))


def attempt_of(rtj_body: dict[str, Any]) -> int:
    """The gang attempt status says runs now (status.attempt; 1 before the first status write)."""
    return int((rtj_body.get("status") or {}).get("attempt") or 1)


def component(pod: dict[str, Any]) -> str:
    return (pod["metadata"].get("labels") or {}).get(api.LABEL_COMPONENT, "")


def current_job(jobs: list[dict[str, Any]], rtj: RTJ,
                attempt: int) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """(the Job a pass converges, the older gangs' Jobs still going away). The Job is the newest of ours
    (an earlier operator's, named '<name>', is found by its labels and attempt annotation, so an upgrade
    restarts no gang), or an object of someone else's holding this attempt's name (a ChildConflict)."""
    unique = {j["metadata"].get("uid") or j["metadata"]["name"]: j for j in jobs}.values()
    ours = [j for j in unique if owned_by(j, rtj.uid)]
    stranger = next((j for j in unique if j["metadata"]["name"] == job_name(rtj, attempt)
                     and not owned_by(j, rtj.uid)), None)
    if stranger is not None and not any(job_attempt(j) == attempt for j in ours):
        return stranger, ours  # in the way of the Job this attempt needs
    if not ours:
        return None, []
    newest = max(ours, key=lambda j: (job_attempt(j), not j["metadata"].get("deletionTimestamp")))
    return newest, [j for j in ours if j is not newest]


def dry_run_template(kube: Kube, job: dict[str, Any]) -> tuple[bool, str]:
    """Would the server take the Job, and a pod of its template? (accepted, the server's words)"""
    for obj in (job, template_pod(job)):
        try:
            kube.create(obj, dry_run=True)
        except KubeError as exc:
            if exc.status == 409:  # validation runs before the name clash: the server takes it
                continue
            if rejected(exc):
                return False, str(exc)
            if obj is job:
                raise
            # A pod refused for another reason (a full ResourceQuota the running gang holds, RBAC): not
            # the spec's fault, and the Job controller retries its pods.
    return True, ""


def read_published(kube: Kube, world: World, rtj: RTJ) -> bool | None:
    """Whether the coordinator's address is in its Service's EndpointSlices, the source cluster DNS serves
    its name from: read only while the gang's pods are held for the coordinator, once it has an address.
    An address is not yet a name: the EndpointSlice controller publishes it after its own queue, which
    backs off (1 s, 2 s, 4 s, ...) whenever its cache lags its writes, as on a busy control plane; a worker
    released meanwhile spends its rendezvous timeout waiting for DNS. None: not read (not waiting), or
    not readable (RBAC): the gate then goes by the address alone."""
    coordinator = addressed_coordinator(world.coordinator, attempt_of(world.rtj))
    if world.job is None or coordinator is None or not any(gated(p) for p in world.pods):
        return None
    try:
        slices = kube.list("EndpointSlice", rtj.namespace, {SERVICE_NAME_LABEL: service_name(rtj)})
    except KubeError as exc:
        if exc.status in (403, 404):
            return None
        raise
    return published(slices, coordinator)


def published(slices: list[dict[str, Any]], pod: dict[str, Any]) -> bool:
    """Whether one of `slices` lists `pod` (by uid) at its current address."""
    uid, ip = pod["metadata"].get("uid"), (pod.get("status") or {}).get("podIP")
    return any((e.get("targetRef") or {}).get("uid") == uid and ip in (e.get("addresses") or [])
               for s in slices for e in s.get("endpoints") or [])


def read_workload(kube: Kube, world: World, rtj: RTJ) -> tuple[dict[str, Any] | None, str, bool]:
    """The Workload Kueue made for a queued Job (by its job-uid label), read only while it can change what
    the pass does: the Job is suspended (queued, preempted), the RTJ is suspended, over or suspended for
    capacity (the Workload is to be deactivated), or the last status did not see it admitted. A running,
    admitted gang costs no read."""
    job = world.job
    labels = ((job or {}).get("metadata") or {}).get("labels") or {}
    if job is None or not owned_by(job, rtj.uid) or not (rtj.queue_name or labels.get(api.KUEUE_QUEUE_LABEL)):
        return None, "", False
    status = world.rtj.get("status") or {}
    if not (job["spec"].get("suspend") or rtj.spec["suspend"] or status.get("phase") == "Failed"
            or not (status.get("queue") or {}).get("admitted")
            or bool((status.get("recovery") or {}).get("suspendedForCapacity"))):
        return None, "", False
    try:
        items = kube.list("Workload", rtj.namespace, {api.KUEUE_JOB_UID_LABEL: job["metadata"]["uid"]})
    except KubeError as exc:
        if exc.status in (403, 404):
            return None, f"Kueue's Workload API cannot be read (HTTP {exc.status})", True
        raise
    live = [w for w in items if not w["metadata"].get("deletionTimestamp")]
    live.sort(key=lambda w: w["metadata"].get("creationTimestamp") or "")
    return (live[-1] if live else None), "", True


def changed_template(world: World, rtj: RTJ) -> dict[str, Any] | None:
    """The Job that should replace the current one because the pod template changed, if so."""
    job = world.job
    if job is None or job["metadata"].get("deletionTimestamp") or not owned_by(job, rtj.uid):
        return None
    attempt = attempt_of(world.rtj)
    if job_attempt(job) != attempt:
        return None
    desired = build_job(rtj, attempt, interval.applied(rtj, job), grace.applied(rtj, job), job["metadata"]["name"])
    have = (job["metadata"].get("annotations") or {}).get(api.ANNOTATION_TEMPLATE_HASH)
    if have is None or have == template_hash(desired):
        return None  # unchanged, or an earlier operator's Job, adopted as it is (policies/children.ensure_job)
    return desired
