"""A user's training script, not the reference trainer: plain DDP, NVRx's documented heartbeat API, and
checkpoints saved the way Megatron-LM saves them (iter_NNNNNNN/ per iteration, then
latest_checkpointed_iteration.txt). Nothing of rtj_worker is imported. Run under rtj-worker (ft_launcher
sets the process group's environment); it saves under $RTJ_CHECKPOINT_DIR, as the user guide asks."""

import argparse
import os
from pathlib import Path

import torch
import torch.distributed as dist
from nvidia_resiliency_ext.fault_tolerance import RankMonitorClient


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--iters", type=int, default=40)
    parser.add_argument("--save-interval", type=int, default=10)
    args = parser.parse_args()
    save = Path(os.environ.get("RTJ_CHECKPOINT_DIR", "checkpoints"))
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    client = RankMonitorClient()
    client.init_workload_monitoring()
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(16, 16))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    start = 0
    tracker = save / "latest_checkpointed_iteration.txt"
    if tracker.exists():
        start = int(tracker.read_text())
        state = torch.load(save / f"iter_{start:07d}" / f"mp_rank_{rank:02d}.pt")
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
    for iteration in range(start, args.iters):
        opt.zero_grad()
        model(torch.randn(8, 16)).square().mean().backward()
        opt.step()
        client.send_heartbeat()
        if (iteration + 1) % args.save_interval == 0:
            folder = save / f"iter_{iteration + 1:07d}"
            folder.mkdir(parents=True, exist_ok=True)
            torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, folder / f"mp_rank_{rank:02d}.pt")
            dist.barrier()
            if rank == 0:
                tracker.write_text(str(iteration + 1))
    client.shutdown_workload_monitoring()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
