"""Pure builders: an RTJ in, a manifest dict out. No I/O, deterministic names."""

from .coordinator import build_coordinator
from .job import build_job
from .names import coordinator_name, job_name, network_policy_name, pvc_name, service_name
from .network import build_network_policy
from .pvc import build_pvc
from .service import build_service

__all__ = ["build_coordinator", "build_job", "build_network_policy", "build_pvc", "build_service", "coordinator_name",
           "job_name", "network_policy_name", "pvc_name", "service_name"]
