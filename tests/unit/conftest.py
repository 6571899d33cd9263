"""The unit tier's fixtures: no cluster, no node agents, no training (tests/testkit.py's shared ones)."""

from testkit import ec2  # noqa: F401
