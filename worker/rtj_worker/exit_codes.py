"""Exit codes of the worker entrypoint: the contract with the operator (rtj_operator.ladder).

Kept free of heavy imports: the operator imports this module too. This module says what each code
means; what the operator makes of it (who is charged, which tier recovers it) is ladder.py's, and the
table in docs/recovery.md shows both (hack/docs_tables.py writes it from the two). Each code is an
int constant with its meaning in the comment above it; NVRX_* are ft_launcher's, not the entrypoint's.
"""

# Training finished for this job: the completion marker of this RTJ's uid names the newest committed
# step (rtj_worker.ckpt_index.finished).
OK = 0
# The job's configuration is wrong (bad flags, missing script): no restart can help.
CONFIG_ERROR = 64
# The training script asked to stop for good (e.g. NaN loss guard, incompatible checkpoint).
PERMANENT_FAILURE = 65
# The ranks failed the same way twice in a row (restartBudget.maxRestartsWithoutProgress: the same last
# exception) with no step or checkpoint progress between: a typo, a missing dependency, a script that
# raises at the same step after every respawn. ft_launcher was stopped before spending its restarts on
# it (rtj_worker.crashloop); the report carries the exception and its traceback's last lines. A new pod
# may be on a better node: the operator replaces it once, and a second pod failing the same way ends
# the job (CrashLoop).
CRASH_LOOP = 66
# A rank failed and ft_launcher spent its restart budget inside this pod: a new pod may help.
LAUNCHER_BUDGET_EXHAUSTED = 70
# Peers never became reachable (the c10d rendezvous timed out), or, after training ran, a later
# rendezvous round timed out (the peers were lost and not replaced in time): only a new gang helps.
RENDEZVOUS_FAILED = 71
# Training ran, then the rendezvous store (hosted by node 0's launcher) went away: node 0 was lost or
# its pod ended. Not this pod's fault; a new pod rejoins node 0's replacement.
RENDEZVOUS_HOST_LOST = 72
# NVRx found this node unhealthy (a failed GPU/NIC health check, or a rank asked to exclude the node)
# and its launcher left so that a spare could take over: replace the pod, on another node if possible.
NODE_UNHEALTHY = 73
# ft_launcher exited 0 but training has not finished for this job: the launcher left because its
# gang stopped (the rendezvous was closed by a peer that gave up, or this node was a standby when
# the others stopped). The peer that stopped the gang reports its own cause.
GANG_STOPPED = 74
# NVRx 0.6's progress tracker refused further restarts (no checkpoint progress over
# --ft-max-no-progress-cycles restarts). A new pod or gang may still progress (a bad node, a transient
# fault): not permanent.
NO_PROGRESS = 75
# The rendezvous host's name (the coordinator's, or node 0's) did not resolve within
# rendezvousTimeoutSeconds, so ft_launcher was never started: the cluster's DNS, or the publication of
# the host pod's address (EndpointSlice), is late or broken. Not the training code: only a new gang helps.
RENDEZVOUS_HOST_UNRESOLVED = 76
# The coordinator's (never a worker's): NVRx 0.6's rendezvous host, nvrx-control, ended with an error (a
# round that could not close in time, its store gone): the gang's rendezvous is gone with it. Not the
# training code: a new gang, charged to the platform.
RENDEZVOUS_CONTROL_FAILED = 77
# Training ran, then the rendezvous was closed for good for this attempt: NVRx's barrier rendezvous
# counts the unhealthy nodes over the attempt's whole life and closes once they exceed max - min (the
# spares and launch.barrier_nnodes' headroom of one per node), though the operator replaced the earlier
# ones; or a peer closed it. A peer's or a node's
# doing: one new gang, charged once for the gang (to the platform when an unhealthy or lost node of it
# explains it), never once per pod.
RENDEZVOUS_CLOSED = 78
# NVRx >= 0.7 concluded that the job must not be restarted and said so with its launcher's exit 93,
# "do not requeue" (its failure attribution said stop, or its progress tracker saw no progress across
# restarts; fault_tolerance/utils.py, RDZV_NO_RESTART_REASONS): the job fails, not requeued.
LAUNCHER_DECLINED = 79

PERMANENT = frozenset({CONFIG_ERROR, PERMANENT_FAILURE})
# Container runtimes report a signal death as 128 + signal: SIGKILL, the container was killed (by the
# kubelet at the end of its grace period, or by the kernel's OOM killer).
SIGKILL = 137
# The entrypoint was sent SIGTERM (its pod is being deleted, or its node or runtime stops it) and
# exits so, whatever ft_launcher returned.
SIGTERM = 143
# The entrypoint was sent SIGINT, and exits so, as for SIGTERM.
SIGINT = 130

# Exit codes of ft_launcher itself that the entrypoint reads (not its own).
# NVRx >= 0.7: the launcher decided the job must not be restarted (DEFAULT_NO_RESTART_EXIT_CODE).
NVRX_DO_NOT_RESTART = 93
