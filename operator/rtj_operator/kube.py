"""A small dict-in, dict-out Kubernetes client over the official `kubernetes` package.

The typed models of `kubernetes` would round-trip every manifest through classes; the operator
builds plain dicts (as kopf does), so it talks REST with the package's auth, TLS and retries.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from typing import Any

import kubernetes
import urllib3

from . import __version__, api

USER_AGENT = f"{api.MANAGER}/{__version__}"

# kind -> (path prefix, plural, namespaced)
RESOURCES: dict[str, tuple[str, str, bool]] = {
    "Service": ("/api/v1", "services", True),
    "PersistentVolumeClaim": ("/api/v1", "persistentvolumeclaims", True),
    "Pod": ("/api/v1", "pods", True),
    "Node": ("/api/v1", "nodes", False),
    "Event": ("/api/v1", "events", True),
    "Job": ("/apis/batch/v1", "jobs", True),
    "Lease": ("/apis/coordination.k8s.io/v1", "leases", True),  # leader election (leader.py)
    "NetworkPolicy": ("/apis/networking.k8s.io/v1", "networkpolicies", True),
    # The Service's endpoints, which cluster DNS serves (read while a gang waits for its coordinator's name).
    "EndpointSlice": ("/apis/discovery.k8s.io/v1", "endpointslices", True),
    # Each metrics scrape, authenticated and authorized by the API server (metrics_server.py; created only).
    "TokenReview": ("/apis/authentication.k8s.io/v1", "tokenreviews", False),
    "SubjectAccessReview": ("/apis/authorization.k8s.io/v1", "subjectaccessreviews", False),
    # Kueue's (optional: only read for an RTJ with a queue).
    "Workload": ("/apis/kueue.x-k8s.io/v1beta2", "workloads", True),
    api.KIND: (f"/apis/{api.GROUP}/{api.VERSION}", api.PLURAL, True),
}


REQUEST_TIMEOUT = 30.0
MIN_WRITE_TIMEOUT = 0.5
# A LIST is read in pages of this many objects (client-go's pager): the API server and the operator each
# hold one page at a time, not a whole namespace's (or cluster's) pods in one response.
PAGE_SIZE = 500
# A call the API server throttles (429, API Priority and Fairness) is sent again after the Retry-After it
# gives, as client-go does, at most this many times and never waiting longer than TOO_BUSY_MAX_WAIT a
# time; then the pass fails with the 429 and its own back-off (never sooner than Retry-After) takes over.
TOO_BUSY_RETRIES = 3
TOO_BUSY_MAX_WAIT = 10.0


class KubeError(Exception):
    """The API server's answer to a call it did not take, and which call it was (verb, kind and name of the
    object, where known: runtime.py names them in the ReconcileError condition). `retry_after`: the seconds
    its Retry-After header asked for (429, 503), else None."""

    def __init__(self, status: int, message: str, verb: str = "", kind: str = "", name: str = "",
                 retry_after: float | None = None):
        super().__init__(f"HTTP {status}: {message}")
        self.status, self.message = status, message
        self.verb, self.kind, self.name = verb, kind, name
        self.retry_after = retry_after


def retry_after(headers: Any) -> float | None:
    """Retry-After in seconds (the API server sends an integer); None when absent or not a number."""
    try:
        value = (headers or {}).get("Retry-After")
        return max(0.0, float(value)) if value is not None else None
    except (TypeError, ValueError, AttributeError):
        return None


def configure(server: str | None = None, user_agent: str = USER_AGENT, *, token: str | None = None,
              ca_file: str | None = None) -> kubernetes.client.ApiClient:
    """In-cluster config, else kubeconfig ($KUBECONFIG); or an explicit server with a bearer token."""
    config = kubernetes.client.Configuration()
    if server:
        config.host = server
        if ca_file:
            config.ssl_ca_cert = ca_file
        else:
            config.verify_ssl = False
        if token:
            config.api_key, config.api_key_prefix = {"BearerToken": token}, {"BearerToken": "Bearer"}
    else:
        try:
            kubernetes.config.load_incluster_config(client_configuration=config)
        except kubernetes.config.ConfigException:
            # $KUBECONFIG as it is now (the package reads it once, at import).
            kubernetes.config.load_kube_config(config_file=os.environ.get("KUBECONFIG"), client_configuration=config)
        _bearer_from_loader(config)
    # The 429 policy is Kube._call's alone. urllib3's default retries also resend an idempotent request (GET,
    # DELETE) answered 429 with Retry-After, three times, inside each of _call's tries: one LIST was sent 7
    # times over 6 s where TOO_BUSY_RETRIES allows 4 sends (tests/cluster/test_api_priority.py). urllib3 still
    # retries a connection that fails, as by default.
    config.retries = urllib3.Retry(total=3, respect_retry_after_header=False)
    client = kubernetes.client.ApiClient(config)
    # One connection per worker thread (runtime.WORKERS, 16 by default), not urllib3's default 10.
    client.rest_client.pool_manager.connection_pool_kw["maxsize"] = 32
    client.user_agent = user_agent  # audit logs tell the operator apart
    return client


def _bearer_from_loader(config: kubernetes.client.Configuration) -> None:
    """The config loaders store the token as api_key['authorization'] (refreshed by a hook for
    in-cluster tokens, which the kubelet rotates), but requests authenticate with 'BearerToken':
    without this, every call goes out anonymous (found on a real API server: HTTP 401)."""
    loader_hook = config.refresh_api_key_hook

    def hook(conf: kubernetes.client.Configuration) -> None:
        if loader_hook is not None:
            loader_hook(conf)
        token = conf.api_key.get("authorization")
        if token:
            conf.api_key["BearerToken"] = token  # already "Bearer <token>"

    config.refresh_api_key_hook = hook
    hook(config)


def _selector(labels: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


def _matches(obj: dict[str, Any], labels: dict[str, str]) -> bool:
    have = obj.get("metadata", {}).get("labels") or {}
    return all(have.get(k) == v for k, v in labels.items())


class Kube:
    """Every API call the operator makes goes through here (tests/cluster/test_chart_install.py checks them against the
    chart's RBAC, from the API server's audit log)."""

    def __init__(self, client: kubernetes.client.ApiClient,
                 on_call: Callable[[str, str], None] | None = None,
                 sleep: Callable[[float], None] = time.sleep):
        self._client = client
        self._on_call = on_call  # (verb, kind) observer, used for metrics and the RBAC test
        self._sleep = sleep
        # Seconds within which a write must be answered (a leader's margin: leader.LeaderElector.acting_for);
        # None: REQUEST_TIMEOUT, as for reads.
        self.write_deadline: Callable[[], float] | None = None

    def _path(self, kind: str, namespace: str | None, name: str | None = None,
              subresource: str | None = None) -> str:
        prefix, plural, namespaced = RESOURCES[kind]
        path = prefix
        if namespaced and namespace:
            path += f"/namespaces/{namespace}"
        path += f"/{plural}"
        if name:
            path += f"/{name}"
        if subresource:
            path += f"/{subresource}"
        return path

    def _call(self, verb: str, kind: str, method: str, path: str, body: Any = None,
              query: list[tuple[str, str]] | None = None, content_type: str = "application/json",
              name: str = "") -> Any:
        for attempt in range(TOO_BUSY_RETRIES + 1):
            if self._on_call:
                self._on_call(verb, kind)
            timeout = REQUEST_TIMEOUT
            if method != "GET" and self.write_deadline is not None:
                timeout = max(MIN_WRITE_TIMEOUT, min(REQUEST_TIMEOUT, self.write_deadline()))
            try:
                response = self._client.call_api(
                    path, method, query_params=query or [], body=body,
                    header_params={"Accept": "application/json", "Content-Type": content_type},
                    auth_settings=["BearerToken"], _preload_content=False, _request_timeout=timeout,
                )
            except kubernetes.client.exceptions.ApiException as exc:
                error = KubeError(exc.status or 0, _message(exc.body) or str(exc.reason), verb, kind, name,
                                  retry_after(exc.headers))
                # A 429 with Retry-After was refused before it was processed (a write too), so sending it again
                # is safe. Not the eviction API's 429: a PodDisruptionBudget's "not now", the caller's answer.
                if (error.status == 429 and error.retry_after is not None and verb != "create/eviction"
                        and attempt < TOO_BUSY_RETRIES and error.retry_after <= TOO_BUSY_MAX_WAIT):
                    self._sleep(error.retry_after)
                    continue
                raise error from None
            data = response[0].data if isinstance(response, tuple) else response.data
            return json.loads(data) if data else None
        raise AssertionError("unreachable")  # the last attempt returns or raises

    def get(self, kind: str, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        try:
            return self._call("get", kind, "GET", self._path(kind, namespace, name), name=name)
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise

    def list(self, kind: str, namespace: str | None = None,
             labels: dict[str, str] | None = None) -> list[dict[str, Any]]:
        return self.list_versioned(kind, namespace, labels)[0]

    def list_versioned(self, kind: str, namespace: str | None = None,
                       labels: dict[str, str] | None = None) -> tuple[list[dict[str, Any]], int]:
        """The items and the list's resourceVersion (0 if the server gives none a number), read in pages of
        PAGE_SIZE: every page is of the first page's snapshot, whose resourceVersion is the list's. A
        continue token that expired (410: the snapshot was compacted away) restarts the LIST unpaged, as
        client-go's pager does."""
        selector = [("labelSelector", _selector(labels))] if labels else []
        items: list[dict[str, Any]] = []
        version_text, token, page_size = None, "", PAGE_SIZE
        while True:
            query = [*selector, *([("limit", str(page_size))] if page_size else []),
                     *([("continue", token)] if token else [])]
            try:
                result = self._call("list", kind, "GET", self._path(kind, namespace), query=query) or {}
            except KubeError as exc:
                if exc.status != 410 or not token:
                    raise
                items, version_text, token, page_size = [], None, "", 0  # the whole list in one response
                continue
            items.extend(result.get("items") or [])
            meta = result.get("metadata") or {}
            if version_text is None:
                version_text = meta.get("resourceVersion")
            token = meta.get("continue") or ""
            if not token:
                break
        try:
            version = int(version_text or 0)
        except ValueError:
            version = 0
        # Filtering again keeps callers correct against servers that ignore selectors.
        return [i for i in items if not labels or _matches(i, labels)], version

    def create(self, obj: dict[str, Any], dry_run: bool = False) -> dict[str, Any]:
        """POST; `dry_run` asks the server to admit and validate without storing (?dryRun=All)."""
        kind, namespace = obj["kind"], obj["metadata"].get("namespace")
        query = [("dryRun", "All")] if dry_run else []
        return self._call("create", kind, "POST", self._path(kind, namespace), body=obj, query=query,
                          name=obj["metadata"].get("name") or obj["metadata"].get("generateName") or "")

    def patch(self, kind: str, name: str, namespace: str | None, patch: dict[str, Any],
              subresource: str | None = None, strategic: bool = False) -> dict[str, Any]:
        """A JSON merge patch, or a strategic merge patch (lists such as conditions merge by key)."""
        verb = "patch" if not subresource else f"patch/{subresource}"
        content_type = "application/strategic-merge-patch+json" if strategic else "application/merge-patch+json"
        return self._call(verb, kind, "PATCH", self._path(kind, namespace, name, subresource), body=patch,
                          content_type=content_type, name=name)

    def evict(self, name: str, namespace: str, uid: str | None = None) -> str:
        """The Eviction API: the server marks the pod DisruptionTarget and deletes it gracefully.
        'evicted'; 'gone' (404, or 409: a new pod of that name, not the one meant: `uid`); 'refused'
        when a PodDisruptionBudget says not now (429)."""
        body: dict[str, Any] = {"apiVersion": "policy/v1", "kind": "Eviction",
                                "metadata": {"name": name, "namespace": namespace}}
        if uid:
            body["deleteOptions"] = {"preconditions": {"uid": uid}}
        try:
            self._call("create/eviction", "Pod", "POST", self._path("Pod", namespace, name, "eviction"), body=body,
                       name=name)
            return "evicted"
        except KubeError as exc:
            if exc.status in (404, 409):
                return "gone"
            if exc.status == 429:
                return "refused"
            raise

    def delete(self, kind: str, name: str, namespace: str | None, *, grace_seconds: int | None = None,
               propagation: str = "Background", uid: str | None = None) -> dict[str, Any] | None:
        """DELETE; the server's answer (the object, now with a deletionTimestamp, or a Status), or
        None when it was gone (404) or is another object now (409 on the `uid` precondition)."""
        body: dict[str, Any] = {"apiVersion": "v1", "kind": "DeleteOptions",
                                "propagationPolicy": propagation}
        if grace_seconds is not None:
            body["gracePeriodSeconds"] = grace_seconds
        if uid:
            body["preconditions"] = {"uid": uid}
        try:
            return self._call("delete", kind, "DELETE", self._path(kind, namespace, name), body=body,
                              name=name) or {}
        except KubeError as exc:
            if exc.status == 404 or (uid and exc.status == 409):
                return None
            raise

    def event(self, involved: dict[str, Any], type_: str, reason: str, message: str) -> None:
        """A core/v1 Event, as `kubectl describe` shows them."""
        meta = involved["metadata"]
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        self.create({
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"name": f"{meta['name']}.{time.time_ns():x}", "namespace": meta["namespace"]},
            "involvedObject": {"apiVersion": involved["apiVersion"], "kind": involved["kind"],
                               "name": meta["name"], "namespace": meta["namespace"], "uid": meta.get("uid")},
            "type": type_, "reason": reason, "message": message[:1024],
            "source": {"component": api.MANAGER}, "reportingComponent": api.MANAGER,
            "firstTimestamp": now, "lastTimestamp": now, "count": 1,
        })


def _message(body: Any) -> str:
    try:
        return json.loads(body).get("message", "")
    except (TypeError, ValueError, AttributeError):
        return str(body or "")
