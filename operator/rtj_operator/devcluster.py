"""An embedded, emulated Kubernetes API for the local demo, the tests and the benchmarks.

Built on kmock's KubernetesEmulator (an in-memory API server over HTTP on loopback), with the
API-server behaviour the operator relies on: uid/generation/resourceVersion, CRD schema
defaulting and validation (422 at create, like `kubectl apply`), the status subresource,
owner-reference garbage collection, and a minimal kubelet and Job controller (`JobSimulator`)
so that pods appear, run, fail and get replaced. No container ever runs.
"""

from __future__ import annotations

import asyncio
import copy
import datetime
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import aiohttp.web
import kmock

from . import api
from .kube import Kube, configure
from .spec import schema_errors, with_defaults

CLIENT_AGENT = "rtj-devcluster-client"
REQUEST_LOG = 16
RTJ_RESOURCE = kmock.resource(api.GROUP, api.VERSION, api.PLURAL)
_core = {"pods": "Pod", "services": "Service", "persistentvolumeclaims": "PersistentVolumeClaim",
         "nodes": "Node", "events": "Event", "namespaces": "Namespace"}


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Emulator(kmock.KubernetesEmulator):
    """kmock's emulator plus the API-server semantics listed in the module docstring."""

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self._rv = 0
        self.calls: list[kmock.Request] = []  # every request, for assertions (e.g. RBAC coverage)
        info = kmock.ResourceInfo
        self.resources[RTJ_RESOURCE] = info(kind=api.KIND, singular=api.SINGULAR, namespaced=True,
                                            shortnames=api.SHORT_NAMES, subresources={"status"},
                                            verbs={"get", "list", "watch", "create", "patch", "delete"})
        self.resources[kmock.resource("batch", "v1", "jobs")] = info(kind="Job", namespaced=True,
                                                                     verbs={"get", "list", "watch"})
        for plural, kind in _core.items():
            self.resources[kmock.resource("", "v1", plural)] = info(
                kind=kind, namespaced=plural not in ("nodes", "namespaces"), verbs={"get", "list", "watch"})

    def _stored(self, request: kmock.Request) -> dict[str, Any] | None:
        key = (request.resource, request.namespace, request.name)
        if key in self.objects and not self.objects[key].deleted:
            return self.objects[key].raw
        return None

    async def _handle(self, request: kmock.Request) -> Any:
        self.calls.append(request)
        # kmock keeps every request for assertions and matches each new one by scanning them all;
        # bounded here, a long run (bench/reconcile_500.py) stays linear. `calls` keeps ours.
        if len(self._requests) > REQUEST_LOG:
            del self._requests[:-REQUEST_LOG]
            for payload in self._payloads:  # each reaction keeps its own log too
                del payload._requests[:-REQUEST_LOG]
        if request.resource is not None and isinstance(request.data, dict):
            self._admit(request)
        deleting = None
        if request.resource is not None and request.action == kmock.action.DELETE and request.name:
            deleting = self._stored(request)
            if deleting is not None and self._kubelet_holds(request, deleting):
                # A dead kubelet never confirms deletion: the pod stays Terminating.
                stamp = {"metadata": {"deletionTimestamp": _now(), "deletionGracePeriodSeconds": 30}}
                key = (request.resource, request.namespace, request.name)
                if not deleting["metadata"].get("deletionTimestamp"):
                    self.objects[key].patch(stamp)
                    await self._buses[request.resource].put({"type": "MODIFIED", "object": self.objects[key].raw})
                return await self._respond(self.objects[key].raw)
        response = await super()._handle(request)
        if deleting is not None and not deleting["metadata"].get("finalizers"):
            await self._collect(deleting["metadata"].get("uid"))
        return response

    async def _respond(self, body: dict[str, Any]) -> Any:
        return aiohttp.web.json_response(body)

    def _admit(self, request: kmock.Request) -> None:
        """Defaulting, validation and bookkeeping fields, applied to the request body in place."""
        data: dict[str, Any] = request.data
        self._rv += 1
        meta = data.setdefault("metadata", {}) if request.action == kmock.action.CREATE else None
        if request.action == kmock.action.CREATE and meta is not None:
            meta.setdefault("uid", str(uuid.uuid4()))
            meta.setdefault("creationTimestamp", _now())
            if request.namespace:
                meta.setdefault("namespace", request.namespace)
            meta["generation"] = 1
            meta["resourceVersion"] = str(self._rv)
            if request.resource == RTJ_RESOURCE:
                _validate(data)
                data["spec"] = with_defaults(data["spec"])
                data.pop("status", None)
        elif request.action == kmock.action.UPDATE:
            stored = self._stored(request)
            if stored is None:
                return
            if request.subresource == "status":
                for key in list(data):
                    if key != "status":
                        del data[key]
            elif request.resource == RTJ_RESOURCE:
                data.pop("status", None)
                if "spec" in data:
                    merged = _merge(copy.deepcopy(stored), data)
                    _validate(merged)
                    if merged["spec"] != stored.get("spec"):
                        data.setdefault("metadata", {})["generation"] = stored["metadata"].get("generation", 1) + 1
                    data["spec"] = with_defaults(merged["spec"])
            data.setdefault("metadata", {})["resourceVersion"] = str(self._rv)

    def _kubelet_holds(self, request: kmock.Request, pod: dict[str, Any]) -> bool:
        if request.resource != kmock.resource("", "v1", "pods"):
            return False
        if (request.data or {}).get("gracePeriodSeconds") == 0:
            return False
        node_name = pod.get("spec", {}).get("nodeName")
        if not node_name:
            return False
        key = (kmock.resource("", "v1", "nodes"), None, node_name)
        if key not in self.objects or self.objects[key].deleted:
            return True
        return any(c.get("type") == "Ready" and c.get("status") != "True"
                   for c in self.objects[key].raw.get("status", {}).get("conditions", []))

    async def _collect(self, owner_uid: str | None) -> None:
        """Background cascading deletion, as the garbage collector does it."""
        if not owner_uid:
            return
        dependents = [(key, obj.raw) for key, obj in list(self.objects.items()) if not obj.deleted
                      and any(ref.get("uid") == owner_uid for ref in obj.raw["metadata"].get("ownerReferences", []))]
        for key, raw in dependents:
            self.objects[key].delete()
            await self._buses[key[0]].put({"type": "DELETED", "object": raw})
            await self._collect(raw["metadata"].get("uid"))


def _merge(base: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    for key, value in patch.items():
        if value is None:
            base.pop(key, None)
        elif isinstance(value, dict) and isinstance(base.get(key), dict):
            _merge(base[key], value)
        else:
            base[key] = value
    return base


def _validate(body: dict[str, Any]) -> None:
    errors = schema_errors(body)
    if errors:
        name = body.get("metadata", {}).get("name")
        raise kmock.KubernetesError(
            status=422, reason="Invalid",
            message=f'{api.KIND}.{api.GROUP} "{name}" is invalid: ' + "; ".join(errors))


class JobSimulator:
    """The Job controller and kubelets of a pretend cluster, driven one `step()` at a time.

    Indexed Jobs get one pod per index named '<job>-<index>-<n>' on a free node; pods start
    Running; a failed or deleted pod is replaced (podReplacementPolicy: Failed) unless the
    Job is suspended or its backoffLimit is spent; suspended Jobs lose their pods.
    """

    def __init__(self, kube: Kube, nodes: list[str]):
        self.kube = kube
        self.node_names = list(nodes)
        self._serial = 0

    def add_nodes(self) -> None:
        for name in self.node_names:
            if self.kube.get("Node", name) is None:
                self.kube.create(node_manifest(name))

    def healthy_nodes(self) -> list[str]:
        result = []
        for node in self.kube.list("Node"):
            if not node.get("spec", {}).get("unschedulable") and all(
                    c.get("status") == "True" for c in node.get("status", {}).get("conditions", [])
                    if c.get("type") == "Ready"):
                result.append(node["metadata"]["name"])
        return sorted(result)

    def step(self) -> None:
        nodes = self.healthy_nodes()
        for job in self.kube.list("Job"):
            self._sync(job, nodes)

    def _sync(self, job: dict[str, Any], nodes: list[str]) -> None:
        meta, spec = job["metadata"], job["spec"]
        if meta.get("deletionTimestamp"):
            return
        ns = meta["namespace"]
        pods = [p for p in self.kube.list("Pod", ns)
                if any(r.get("uid") == meta["uid"] for r in p["metadata"].get("ownerReferences", []))]
        status = job.get("status") or {}
        if any(c.get("status") == "True" for c in status.get("conditions", [])):
            return  # finished
        if spec.get("suspend"):
            for pod in pods:
                self.kube.delete("Pod", pod["metadata"]["name"], ns)
            self._status(job, {"active": 0, "ready": 0})
            return
        failed = int(status.get("failed", 0))
        by_index: dict[int, list[dict[str, Any]]] = {}
        for pod in pods:
            by_index.setdefault(int(pod["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"]),
                                []).append(pod)
        counted = set(status.get("countedFailedUids") or [])
        used = {p["spec"].get("nodeName") for p in pods if p.get("status", {}).get("phase") in ("Pending", "Running")}
        for pod in pods:
            if pod["status"].get("phase") == "Failed" and pod["metadata"]["uid"] not in counted:
                counted.add(pod["metadata"]["uid"])
                if not _ignored(pod):
                    failed += 1
        if failed > int(spec.get("backoffLimit", 6)):
            self._status(job, {"failed": failed, "countedFailedUids": sorted(counted), "conditions": [
                {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded",
                 "message": "Job has reached the specified backoff limit"}]})
            return
        succeeded = 0
        for index in range(int(spec["completions"])):
            mine = by_index.get(index, [])
            if any(p["status"].get("phase") == "Succeeded" for p in mine):
                succeeded += 1
                continue
            if any(p["status"].get("phase") in ("Pending", "Running") or p["metadata"].get("deletionTimestamp")
                   for p in mine):
                continue
            free = [n for n in nodes if n not in used]
            if free:
                used.add(free[0])
                self.kube.create(self._pod(job, index, free[0]))
        active = sum(1 for p in pods if p["status"].get("phase") == "Running")
        conds = []
        if succeeded == int(spec["completions"]):
            conds = [{"type": "Complete", "status": "True", "reason": "CompletionsReached", "message": ""}]
        self._status(job, {"active": active, "ready": active, "failed": failed, "succeeded": succeeded,
                           "countedFailedUids": sorted(counted), **({"conditions": conds} if conds else {})})

    def _status(self, job: dict[str, Any], status: dict[str, Any]) -> None:
        if {k: (job.get("status") or {}).get(k) for k in status} != status:
            self.kube.patch("Job", job["metadata"]["name"], job["metadata"]["namespace"], {"status": status},
                            subresource="status")

    def _pod(self, job: dict[str, Any], index: int, node: str) -> dict[str, Any]:
        self._serial += 1
        template = copy.deepcopy(job["spec"]["template"])
        name = f"{job['metadata']['name']}-{index}-{self._serial:05d}"
        meta = template.get("metadata", {})
        return {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {
                "name": name, "namespace": job["metadata"]["namespace"],
                "labels": {**meta.get("labels", {}), "batch.kubernetes.io/job-completion-index": str(index)},
                "annotations": {"batch.kubernetes.io/job-completion-index": str(index)},
                "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": job["metadata"]["name"],
                                     "uid": job["metadata"]["uid"], "controller": True}],
            },
            "spec": {**template["spec"], "nodeName": node,
                     "hostname": f"{job['metadata']['name']}-{index}"},
            "status": {"phase": "Running", "startTime": _now(),
                       "conditions": [{"type": "Ready", "status": "True"}],
                       "containerStatuses": [{"name": "worker", "ready": True,
                                              "state": {"running": {"startedAt": _now()}}}]},
        }


def _ignored(pod: dict[str, Any]) -> bool:
    return any(c.get("type") == "DisruptionTarget" and c.get("status") == "True"
               for c in pod.get("status", {}).get("conditions", []))


def node_manifest(name: str, instance_type: str = api.DEFAULT_INSTANCE_TYPE) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {"node.kubernetes.io/instance-type": instance_type,
                                              "kubernetes.io/hostname": name}},
        "spec": {},
        "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
                   "capacity": {"nvidia.com/gpu": "8", "vpc.amazonaws.com/efa": "32"}},
    }


class EmbeddedCluster:
    """The emulated API server on a loopback port, served from a thread of its own."""

    def __init__(self) -> None:
        self.emulator: Emulator | None = None
        self.url = ""
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._serve, name="embedded-api", daemon=True)

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._main())

    async def _main(self) -> None:
        self._stop = asyncio.Event()
        async with Emulator() as emulator, kmock.Server(emulator) as server:
            self.emulator = emulator
            self.url = str(server.url).rstrip("/")
            self._ready.set()
            await self._stop.wait()

    def start(self) -> EmbeddedCluster:
        self._thread.start()
        if not self._ready.wait(30):
            raise RuntimeError("the embedded API server did not start")
        return self

    def stop(self) -> None:
        if self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    def kube(self) -> Kube:
        """A client for tests and simulators, told apart from the operator by its user agent."""
        return Kube(configure(self.url, user_agent=CLIENT_AGENT))


@contextmanager
def embedded_cluster() -> Iterator[EmbeddedCluster]:
    cluster = EmbeddedCluster().start()
    try:
        yield cluster
    finally:
        cluster.stop()


class OperatorThread:
    """The real kopf operator (handlers.register) in a thread, pointed at an API URL."""

    def __init__(self, url: str, storage_check: Any = None, max_requeue: float = 1.0):
        import kopf

        from . import handlers

        self.url = url
        self.context = handlers.Context(kube=Kube(configure(url)), storage_check=storage_check,
                                        max_requeue=max_requeue)

        def login(**_: Any) -> kopf.ConnectionInfo:
            return kopf.ConnectionInfo(server=url, insecure=True)

        self.registry = handlers.register(kopf.OperatorRegistry(), login=login)
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rtj-operator", daemon=True)
        self.error: BaseException | None = None

    def _run(self) -> None:
        import kopf

        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(kopf.operator(
                registry=self.registry, memo=self.context, standalone=True, clusterwide=True,
                stop_flag=self._stop, ready_flag=self._ready))
        except BaseException as exc:  # surfaced to the test or demo that started us
            self.error = exc
        finally:
            loop.close()

    def start(self) -> OperatorThread:
        self._thread.start()
        if not self._ready.wait(30):
            raise RuntimeError(f"the operator did not start: {self.error!r}")
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)


def serve() -> None:
    """`python -m rtj_operator.devcluster`: serve the emulated API until interrupted (for bench/)."""
    cluster = EmbeddedCluster().start()
    print(cluster.url, flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        cluster.stop()


if __name__ == "__main__":
    serve()
