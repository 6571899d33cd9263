"""A user's training script written with nothing but PyTorch: DDP over torch.distributed and checkpoints with
torch.save, the way a tutorial writes them. No NVRx and nothing of rtj_worker is imported, so it gets what
any command gets (ft_launcher's respawn, the operator's tiers) and nothing more. Run under rtj-worker
(ft_launcher sets the process group's environment); it saves under $RTJ_CHECKPOINT_DIR, as the user guide
asks. --crash-at N: on its first run only, rank 1 exits 3 at step N (a bug that a respawn gets past)."""

import argparse
import os
from pathlib import Path

import torch
import torch.distributed as dist


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--save-every", type=int, default=5)
    parser.add_argument("--crash-at", type=int, default=0)
    args = parser.parse_args()
    folder = Path(os.environ.get("RTJ_CHECKPOINT_DIR", "checkpoints")) / "plain"
    folder.mkdir(parents=True, exist_ok=True)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(16, 16))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    start = 0
    if (folder / "last.pt").exists():
        state = torch.load(folder / "last.pt")
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        start = state["step"]
    if rank == 0:
        with open(folder / "resumed-from", "a") as log:
            log.write(f"{start}\n")
    for step in range(start + 1, args.steps + 1):
        if step == args.crash_at and rank == 1 and not (folder / "crashed").exists():
            (folder / "crashed").write_text(str(step))
            os._exit(3)
        opt.zero_grad()
        model(torch.randn(8, 16)).square().mean().backward()
        opt.step()
        if step % args.save_every == 0:
            if rank == 0:
                torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step},
                           folder / "last.tmp")
                os.replace(folder / "last.tmp", folder / "last.pt")
            dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
