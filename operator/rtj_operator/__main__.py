"""`rtj-operator` / `python -m rtj_operator`: run the operator against a cluster."""

from __future__ import annotations

import argparse
import logging
import os

import kopf
import prometheus_client

from . import handlers, kube
from .metrics import API_CALLS
from .spec import allowed_service_accounts_from_env


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="rtj-operator", description=__doc__)
    scope = parser.add_mutually_exclusive_group()
    scope.add_argument("--namespace", "-n", action="append", default=[],
                       help="Watch only this namespace (repeatable). Default: all namespaces.")
    scope.add_argument("--all-namespaces", "-A", action="store_true", help="Watch all namespaces.")
    parser.add_argument("--metrics-port", type=int, default=9090, help="Prometheus metrics port (0: off).")
    parser.add_argument("--liveness", default="http://0.0.0.0:8080/healthz",
                        help="kopf liveness endpoint for the Deployment's probes.")
    parser.add_argument("--server", default=None, help="API server URL (default: in-cluster or kubeconfig).")
    parser.add_argument("--check-fsx", action="store_true",
                        help="Before creating pods, check with boto3 that spec.storage.fileSystemId is an "
                             "AVAILABLE FSx for Lustre file system in the node group's Availability Zone.")
    parser.add_argument("--verbose", "-v", action="store_true")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not args.verbose:
        # kopf logs every watch event's handler at INFO ("Handler ... succeeded"): with 1000 jobs that
        # is thousands of lines a minute and a share of the operator's CPU. Warnings and errors stay.
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    client = kube.configure(args.server)
    storage_check = None
    if args.check_fsx:
        from .fsx import FsxCheck
        storage_check = FsxCheck.from_environment(kube.Kube(client))
    context = handlers.Context(kube=kube.Kube(client, on_call=_count_call), storage_check=storage_check,
                               allowed_service_accounts=allowed_service_accounts_from_env(os.environ))
    login = None
    if args.server:
        def login(**_: object) -> kopf.ConnectionInfo:
            return kopf.ConnectionInfo(server=args.server, insecure=True)
    else:
        def login(**kwargs: object) -> kopf.ConnectionInfo | None:
            return kopf.login_via_client(**kwargs)
    registry = handlers.register(kopf.OperatorRegistry(), login=login)
    if args.metrics_port:
        prometheus_client.start_http_server(args.metrics_port)
    kopf.run(registry=registry, memo=context, standalone=True, clusterwide=not args.namespace,
             namespaces=args.namespace, liveness_endpoint=args.liveness or None)


def _count_call(verb: str, kind: str) -> None:
    API_CALLS.labels(verb, kind).inc()


if __name__ == "__main__":
    main()
