"""`rtj-operator` / `python -m rtj_operator`: run the operator against a cluster."""

from __future__ import annotations

import argparse
import logging
import os

import kopf
import prometheus_client

from . import handlers, health, kube, leader
from .draft import Config
from .metrics import API_CALLS
from .runtime import Runtime
from .spec import allowed_service_accounts_from_env


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="rtj-operator", description=__doc__)
    scope = parser.add_mutually_exclusive_group()
    scope.add_argument("--namespace", "-n", action="append", default=[],
                       help="Watch only this namespace (repeatable). Default: all namespaces.")
    scope.add_argument("--all-namespaces", "-A", action="store_true", help="Watch all namespaces.")
    parser.add_argument("--metrics-port", type=int, default=9090, help="Prometheus metrics port (0: off).")
    parser.add_argument("--metrics-secure", action=argparse.BooleanOptionalAction, default=True,
                        help="Serve metrics over HTTPS, each scrape's bearer token reviewed by the API server "
                             "(TokenReview, then SubjectAccessReview for get on /metrics). --no-metrics-secure: "
                             "plain HTTP, open to whoever reaches the port.")
    parser.add_argument("--metrics-cert-dir", default="",
                        help="Folder with tls.crt and tls.key for the metrics endpoint (read again when they change). "
                             "Default: a self-signed certificate made at start.")
    parser.add_argument("--liveness", default="http://0.0.0.0:8080/healthz",
                        help="kopf liveness endpoint for the Deployment's probes.")
    parser.add_argument("--server", default=None, help="API server URL (default: in-cluster or kubeconfig).")
    parser.add_argument("--check-fsx", action="store_true",
                        help="Before creating pods, check with boto3 that spec.storage.fileSystemId is an "
                             "AVAILABLE FSx for Lustre file system in the node group's Availability Zone.")
    parser.add_argument("--check-ec2", action="store_true",
                        help="Fencing evidence for lost nodes from EC2 (ec2:DescribeInstances): a pod stuck on a lost "
                             "node is force-deleted once its instance is stopped or terminated, not only once the "
                             "Node is deleted or tainted node.kubernetes.io/out-of-service.")
    parser.add_argument("--unhealthy-node-condition", action="append", metavar="TYPE=STATUS",
                        help="A node condition that means a Ready node cannot train (repeatable), e.g. "
                             "AcceleratedHardwareReady=False. Default: the EKS node monitoring agent's "
                             f"{', '.join(health.EKS_CONDITIONS)} =False.")
    parser.add_argument("--unhealthy-node-label", action="append", metavar="KEY=V1,V2",
                        help="A node label whose values mean a node cannot train (repeatable). Default: "
                             f"{health.HYPERPOD_LABEL}={','.join(health.HYPERPOD_UNHEALTHY)} (SageMaker HyperPod).")
    parser.add_argument("--workload-node-reason", action="append", metavar="REASON",
                        help="A reason of those conditions that the workload causes, not the node (repeatable): "
                             "such a condition is not a node fault. Default: "
                             f"{', '.join(health.WORKLOAD_REASONS)} (the EKS node monitoring agent's).")
    parser.add_argument("--no-default-node-health", action="store_true",
                        help="Only the --unhealthy-node-condition/-label given count (none: node health is not read).")
    parser.add_argument("--capacity-probe-priority-class", default="", metavar="NAME",
                        help="PriorityClass of the capacity probes a gang suspended for capacity keeps pending "
                             "(see docs/recovery.md); the chart makes one of value -1 that preempts nobody. "
                             "Default: none (the namespace's default priority).")
    parser.add_argument("--leader-elect", action="store_true",
                        help="Run passes only while holding a coordination.k8s.io Lease (for more than one replica).")
    parser.add_argument("--leader-election-namespace", default=os.environ.get("POD_NAMESPACE", ""),
                        help="Namespace of the Lease (default: $POD_NAMESPACE).")
    parser.add_argument("--leader-election-id", default="rtj-operator", help="Name of the Lease.")
    parser.add_argument("--lease-duration", type=float, default=leader.LEASE_SECONDS,
                        help="Seconds a follower waits, after the Lease last changed, before it takes it.")
    parser.add_argument("--renew-deadline", type=float, default=leader.RENEW_DEADLINE,
                        help="Seconds after its last renewal at which a leader stops acting.")
    parser.add_argument("--retry-period", type=float, default=leader.RETRY_SECONDS,
                        help="Seconds between tries to take or renew the Lease.")
    parser.add_argument("--verbose", "-v", action="store_true")
    return parser.parse_args(argv)


def elector_from_args(args: argparse.Namespace, client: leader.LeaseClient) -> leader.LeaderElector | None:
    if not args.leader_elect:
        return None
    if not args.leader_election_namespace:
        raise SystemExit("--leader-elect needs --leader-election-namespace (or $POD_NAMESPACE)")
    try:
        timing = leader.Timing(args.lease_duration, args.renew_deadline, args.retry_period)
    except ValueError as exc:
        raise SystemExit(f"leader election: {exc}") from None
    return leader.LeaderElector(client, args.leader_election_namespace, args.leader_election_id, timing=timing)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not args.verbose:
        # kopf logs every watch event's handler at INFO ("Handler ... succeeded"): with 1000 jobs that
        # is thousands of lines a minute and a share of the operator's CPU. Warnings and errors stay.
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    default = None if not args.no_default_node_health else []
    node_health = health.NodeHealth.parse(
        args.unhealthy_node_condition if args.unhealthy_node_condition is not None else default,
        args.unhealthy_node_label if args.unhealthy_node_label is not None else default,
        args.workload_node_reason if args.workload_node_reason is not None else default)
    client = kube.configure(args.server)
    storage_check = None
    if args.check_fsx:
        from .fsx import FsxCheck
        storage_check = FsxCheck.from_environment(kube.Kube(client))

    cloud_fencing = None
    if args.check_ec2:
        from .fencing import Ec2Fencing
        cloud_fencing = Ec2Fencing.from_environment()

    elector = elector_from_args(args, kube.Kube(client, on_call=_count_call))

    def runtime() -> Runtime:
        return Runtime(kube.Kube(client, on_call=_count_call), namespaces=args.namespace,
                       config=Config(allowed_service_accounts=allowed_service_accounts_from_env(os.environ),
                                     node_health=node_health,
                                     capacity_probe_priority_class=args.capacity_probe_priority_class),
                       storage_check=storage_check, cloud_fencing=cloud_fencing, elector=elector)

    login = None
    if args.server:
        def login(**_: object) -> kopf.ConnectionInfo:
            return kopf.ConnectionInfo(server=args.server, insecure=True)
    else:
        def login(**kwargs: object) -> kopf.ConnectionInfo | None:
            return kopf.login_via_client(**kwargs)
    registry = handlers.register(kopf.OperatorRegistry(), runtime, login=login)
    if args.metrics_port and args.metrics_secure:
        from . import metrics_server
        metrics_server.serve(args.metrics_port, metrics_server.Reviewer(kube.Kube(client, on_call=_count_call)),
                             metrics_server.Certificates(args.metrics_cert_dir or None))
    elif args.metrics_port:
        prometheus_client.start_http_server(args.metrics_port)
    kopf.run(registry=registry, standalone=True, clusterwide=not args.namespace,
             namespaces=args.namespace, liveness_endpoint=args.liveness or None)


def _count_call(verb: str, kind: str) -> None:
    API_CALLS.labels(verb, kind).inc()


if __name__ == "__main__":
    main()
