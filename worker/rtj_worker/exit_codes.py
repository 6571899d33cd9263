"""Exit codes of the worker entrypoint: the contract with the operator (rtj_operator.recovery).

Kept free of heavy imports: the operator imports this module too.
"""

OK = 0
# A rank failed and ft_launcher spent its restart budget inside this pod: a new pod may help.
LAUNCHER_BUDGET_EXHAUSTED = 70
# Peers never became reachable (DNS or c10d rendezvous timed out): only a new gang helps.
RENDEZVOUS_FAILED = 71
# Training ran, then the rendezvous store (hosted by node 0's launcher) went away: node 0 was lost or
# its pod ended. Not this pod's fault; a new pod rejoins node 0's replacement.
RENDEZVOUS_HOST_LOST = 72
# The job's configuration is wrong (bad flags, missing script): no restart can help.
CONFIG_ERROR = 64
# The training script asked to stop for good (e.g. NaN loss guard, incompatible checkpoint).
PERMANENT_FAILURE = 65

PERMANENT = frozenset({CONFIG_ERROR, PERMANENT_FAILURE})
# Container runtimes report a signal death as 128 + signal.
SIGKILL = 137
SIGTERM = 143
