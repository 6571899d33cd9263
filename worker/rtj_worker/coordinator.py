"""`python -m rtj_worker.coordinator`: the gang's coordinator pod (the operator's builders/coordinator.py).

It hosts what no training node should: the rendezvous store on port P, and the ranks' two stores on
P+1 (rtj_worker.train's) and P+2 (inprocess.Wrapper's); every launcher and rank is a client. With
NVRx 0.6 it also closes the barrier rendezvous' rounds, which only the store host does (its
`nvrx-control`, fault_tolerance/control_plane.py, run in this process); NVRx 0.4.1's c10d rendezvous
needs no host, its launchers close the rounds on the store themselves.

The stores are multi-tenant masters made here first, so nvrx-control's own store on P shares this
process's server, and all of them outlive its loop: a spare that polls as the gang finishes still
finds the shutdown key (0.6.0's nvrx-control drops its store the moment it sees it). Exits 0 once the
rendezvous is over (the gang finished or gave up) and its grace has passed, or on SIGTERM; 77
(RENDEZVOUS_CONTROL_FAILED) at once if nvrx-control raised: the operator, which ignores a Succeeded
coordinator (its gang's workers say why it ended), then sees the rendezvous fail and starts a new gang
instead of waiting for the workers to lose their store.
"""

from __future__ import annotations

import datetime
import logging
import os
import signal
import sys
import threading
from collections.abc import Mapping

from . import exit_codes
from .launch import barrier_nnodes, nvrx_version

log = logging.getLogger("rtj_worker.coordinator")
# How long the stores stay up after the rendezvous ended: spares poll it every second or so.
LINGER_SECONDS = 30.0


def stores(port: int, timeout: datetime.timedelta) -> list[object]:
    from torch.distributed import TCPStore

    return [TCPStore("0.0.0.0", p, is_master=True, multi_tenant=True, wait_for_workers=False, timeout=timeout,
                     use_libuv=True) for p in (port, port + 1, port + 2)]


def control_args(env: Mapping[str, str], port: int) -> list[str]:
    """nvrx-control's command line: the launchers' rendezvous, from the operator's environment (the same
    node range as theirs, barrier_nnodes: it is nvrx-control that counts the unhealthy nodes)."""
    return [f"--nnodes={barrier_nnodes(env['RTJ_NNODES'])}", f"--rdzv-endpoint=0.0.0.0:{port}",
            f"--rdzv-id={env['RTJ_RDZV_ID']}", "--rdzv-backend=c10d",
            f"--rdzv-conf=join_timeout={env.get('RTJ_RDZV_TIMEOUT', '600')}",
            "--ft-enable-log-server=false"]


def main(env: Mapping[str, str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s rtj-coordinator %(levelname)s %(message)s")
    env = dict(os.environ if env is None else env)
    missing = [k for k in ("RTJ_RDZV_PORT", "RTJ_NNODES", "RTJ_RDZV_ID") if not env.get(k)]
    if missing or not env["RTJ_RDZV_PORT"].isdigit():
        log.error("bad environment (is this pod made by rtj-operator?): %s", missing or env["RTJ_RDZV_PORT"])
        return exit_codes.CONFIG_ERROR
    port = int(env["RTJ_RDZV_PORT"])
    stop = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        log.info("%s: stopping", signal.Signals(signum).name)
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    timeout = datetime.timedelta(seconds=float(env.get("RTJ_RDZV_TIMEOUT", "600")))
    held = stores(port, timeout)
    log.info("serving the rendezvous on %d and the ranks' stores on %d and %d", port, port + 1, port + 2)
    if nvrx_version() >= (0, 6):
        from nvidia_resiliency_ext.fault_tolerance import control_plane

        # It installs its own SIGTERM handler (its loop ends at once) and restores ours after.
        try:
            control_plane.run(control_plane.parse_args(control_args(env, port)))
        except Exception as exc:  # its loop ended badly: this gang's rendezvous is over
            log.exception("nvrx-control ended with an error: %s", exc)
            return exit_codes.RENDEZVOUS_CONTROL_FAILED
        log.info("the rendezvous is over; the stores stay up %.0f s", LINGER_SECONDS)
        stop.wait(LINGER_SECONDS)
    else:
        stop.wait()  # 0.4.1: the launchers run their rendezvous on the store themselves
    del held
    return exit_codes.OK


if __name__ == "__main__":
    sys.exit(main())
