"""The real kopf operator (rtj_operator.handlers.register) in a thread of the test or demo process.

It authenticates with whatever token it is given; the tests give it a token of the chart's
ServiceAccount, so the real kube-apiserver enforces the chart's RBAC on every call it makes.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import kopf

from rtj_operator import handlers
from rtj_operator.kube import Kube, configure


class OperatorThread:
    def __init__(self, server: str, token: str, ca_file: str, namespaces: list[str] | None = None,
                 storage_check: Any = None, max_requeue: float = 1.0, **context: Any):
        self.server, self.namespaces = server, namespaces or []
        self.context = handlers.Context(kube=Kube(configure(server, token=token, ca_file=ca_file)),
                                        storage_check=storage_check, max_requeue=max_requeue, **context)

        def login(**_: Any) -> kopf.ConnectionInfo:
            return kopf.ConnectionInfo(server=server, ca_path=ca_file, token=token, scheme="Bearer")

        self.registry = handlers.register(kopf.OperatorRegistry(), login=login)
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rtj-operator", daemon=True)
        self.error: BaseException | None = None

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(kopf.operator(
                registry=self.registry, memo=self.context, standalone=True,
                clusterwide=not self.namespaces, namespaces=self.namespaces,
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
