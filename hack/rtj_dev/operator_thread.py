"""The real operator (kopf watches feeding rtj_operator.runtime) in a thread of the test or demo process.

It authenticates with whatever token it is given; the tests give it a token of the chart's
ServiceAccount, so the real kube-apiserver enforces the chart's RBAC on every call it makes.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

import kopf

from rtj_operator import handlers
from rtj_operator.draft import Config
from rtj_operator.kube import Kube, configure
from rtj_operator.runtime import Runtime


class OperatorThread:
    def __init__(self, server: str, token: str, ca_file: str, namespaces: list[str] | None = None,
                 storage_check: Any = None, max_requeue: float = 1.0,
                 allowed_service_accounts: frozenset[str] | None = None, capacity_probe_priority_class: str = "",
                 on_call: Callable[[str, str], None] | None = None, **runtime: Any):
        self.server, self.namespaces = server, namespaces or []
        self.runtime = Runtime(Kube(configure(server, token=token, ca_file=ca_file), on_call=on_call),
                               namespaces=self.namespaces,
                               config=Config(allowed_service_accounts=allowed_service_accounts,
                                             capacity_probe_priority_class=capacity_probe_priority_class),
                               storage_check=storage_check, max_requeue=max_requeue, **runtime)

        def login(**_: Any) -> kopf.ConnectionInfo:
            return kopf.ConnectionInfo(server=server, ca_path=ca_file, token=token, scheme="Bearer")

        self.registry = handlers.register(kopf.OperatorRegistry(), self.runtime, login=login)
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rtj-operator", daemon=True)
        self.error: BaseException | None = None

    @property
    def kube(self) -> Kube:
        return self.runtime.kube

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(kopf.operator(
                registry=self.registry, standalone=True,
                clusterwide=not self.namespaces, namespaces=self.namespaces,
                stop_flag=self._stop, ready_flag=self._ready))
        except BaseException as exc:  # surfaced to the test or demo that started us
            self.error = exc
        finally:
            loop.close()

    def start(self) -> OperatorThread:
        self._thread.start()
        if not self._ready.wait(30) or not self.runtime.wait_synced(30):
            raise RuntimeError(f"the operator did not start: {self.error!r}")
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)
        self.runtime.stop()  # in case kopf's cleanup did not run (it failed to start)
        if self.error is None and self.runtime.error is not None:
            self.error = self.runtime.error
