"""The policies of one pass (reconcile.py orders them), one module each:

- pods: predicates on the pods and the Job (which attempt, which train, which are gated)
- children: the Service, PVC, Job and coordinator, converged to status
- kueue: the queue's part (Queued, Admitted, the Workload's activation)
- placement: node exclusions, releasing gated pods, waiting for capacity
- charging: who pays for each finding, restarts, budgets, the Job's verdict, the replacement back-off
- phase: phase and conditions, live progress, the wait conditions
- interval: the checkpoint interval from measurements (Young-Daly), applied at the next gang on request
"""
