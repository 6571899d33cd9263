"""Fixtures of a tier that needs the local control plane: tests/clusterkit.py's (one control plane per
test run, shared with the other cluster tier when both run in one session)."""

from clusterkit import cluster, kube, lost_nodes, ns, operator, operator_token, own_nodes, rtj  # noqa: F401
from testkit import ec2  # noqa: F401
