"""A user's training script that reports its progress with the worker image's small library
(rtj_worker.progress.for_this_rank: standard library only) and nothing else of rtj_worker: plain DDP over
torch.distributed, checkpoints with torch.save. Run under rtj-worker; it saves under $RTJ_CHECKPOINT_DIR.
--crash-at N: on its first run only, rank 1 exits 3 at step N."""

import argparse
import os
from pathlib import Path

import torch
import torch.distributed as dist

from rtj_worker.progress import for_this_rank


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--save-every", type=int, default=5)
    parser.add_argument("--crash-at", type=int, default=0)
    args = parser.parse_args()
    folder = Path(os.environ.get("RTJ_CHECKPOINT_DIR", "checkpoints")) / "with-progress"
    folder.mkdir(parents=True, exist_ok=True)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    progress = for_this_rank()
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(16, 16))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    start = 0
    if (folder / "last.pt").exists():
        state = torch.load(folder / "last.pt")
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        start = state["step"]
    progress.loaded(start)
    progress.started(rank, 0, start)
    for step in range(start + 1, args.steps + 1):
        if step == args.crash_at and rank == 1 and not (folder / "crashed").exists():
            (folder / "crashed").write_text(str(step))
            os._exit(3)
        opt.zero_grad()
        model(torch.randn(8, 16)).square().mean().backward()
        opt.step()
        progress.stepped(step)
        if step % args.save_every == 0:
            if rank == 0:
                torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step},
                           folder / "last.tmp")
                os.replace(folder / "last.tmp", folder / "last.pt")
            dist.barrier()
            progress.commit(step)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
