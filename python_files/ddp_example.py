"""Several processes, one epoch: each rank reads its own share of the windows; stop, resume exactly.

    torchrun --standalone --nproc_per_node=2 python_files/ddp_example.py --steps 4
    python python_files/ddp_example.py --steps 3 --save-state data/loader_state.json
    python python_files/ddp_example.py --steps 3 --resume data/loader_state.json

Each rank prints one line per step: the epoch, and a checksum of the batch it received (the sum of
its token ids), so runs can be compared line by line. At the end, every rank's window indices of
the current epoch are gathered and checked: disjoint, and together the whole epoch minus the
n % world_size windows the sampler drops so that every rank gets as many. Under torchrun the
backend is NCCL with one GPU per rank when the node has a GPU for every local rank, and gloo on the
CPU otherwise (a one-GPU machine running two ranks): the first line says which. --save-state writes
the global step and the sampler's state after the last step (JSON, rank 0); --resume starts from
such a file, with any number of ranks, and counts on from its step.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent))

from npy_datasets import NpyTokensDataset, make_dataloaders, to_device  # noqa: E402 (sys.path set)
from prepare_tokens import prepare  # noqa: E402 (sys.path set)

ROOT = Path(__file__).resolve().parents[1]


def say(line: str) -> None:
    """One write per line, so the lines of ranks sharing a terminal or pipe never run together."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def choose_backend(local_ranks: int, gpus: int) -> str:
    """NCCL when every rank of this node can have a GPU of its own, else gloo on the CPU."""
    return "nccl" if gpus >= local_ranks else "gloo"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--data", type=Path, default=ROOT / "data" / "tinystories_sample", help="token file folder"
    )
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--steps", type=int, default=4, help="batches each rank takes (default 4)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--save-state", type=Path, help="write the loader state here after the last step"
    )
    parser.add_argument("--resume", type=Path, help="continue from a state written by --save-state")
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error(f"--steps must be at least 1, got {args.steps}")
    if args.resume is not None and not args.resume.is_file():
        parser.error(f"--resume must be a file --save-state wrote, got {str(args.resume)!r}")
    return args


def start_ranks() -> tuple[bool, int, int, torch.device]:
    """Join torchrun's process group, if there is one: distributed?, rank, world size, device."""
    distributed = "RANK" in os.environ  # set by torchrun
    gpus = torch.cuda.device_count()
    backend = (
        choose_backend(int(os.environ.get("LOCAL_WORLD_SIZE", 1)), gpus) if distributed else None
    )
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    if distributed:
        dist.init_process_group(backend)
    rank, world = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)
    use_gpu = backend == "nccl" or (not distributed and gpus > 0)
    device = torch.device("cuda", torch.cuda.current_device()) if use_gpu else torch.device("cpu")
    if rank == 0:
        say(
            f"{world} rank(s), backend {backend or 'none'}, device {device.type}, "
            f"{gpus} GPU(s) on this node"
        )
    return distributed, rank, world, device


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    distributed, rank, world, device = start_ranks()
    if rank == 0:  # one process writes the token files; the others wait, then only read them
        prepare(out=args.data, progress=False)
    if distributed:
        dist.barrier()
    train = NpyTokensDataset(args.data / "train.npy", args.seq_len, vocab_size=50257)
    val = NpyTokensDataset(args.data / "validation.npy", args.seq_len, vocab_size=50257)
    train_loader, _ = make_dataloaders(
        train, val, batch_size=args.batch_size, num_workers=0, seed=args.seed
    )
    sampler = train_loader.sampler
    step = 0  # the global step: batches taken since the first run began
    if args.resume:
        try:
            saved = json.loads(args.resume.read_text())
            train_loader.load_state_dict(saved["sampler"])
            step = saved["step"]
        except (ValueError, KeyError, TypeError) as error:
            why = f"it has no {error}" if isinstance(error, KeyError) else str(error)
            raise SystemExit(f"--resume {args.resume}: not a state --save-state wrote: {why}")
    last = step + args.steps

    while step < last:
        epoch = sampler.epoch  # each pass is the next epoch (or the rest of a resumed one)
        for batch in train_loader:
            x, y = to_device(batch, device)
            step += 1
            say(f"rank {rank}/{world} step {step} epoch {epoch} checksum {int(x.sum())}")
            if step == last:
                break

    state = train_loader.state_dict()  # counts the batches the loop received
    if args.save_state and rank == 0:
        args.save_state.parent.mkdir(parents=True, exist_ok=True)
        args.save_state.write_text(json.dumps({"step": step, "sampler": state}))
        say(
            f"saved the loader state: step {step}, epoch {state['epoch']}, "
            f"position {state['position']}"
        )
    check_disjoint(sampler.order(epoch), len(train), distributed, rank, world, device)
    if distributed:
        dist.destroy_process_group()
    return 0


def check_disjoint(
    order: np.ndarray, n: int, distributed: bool, rank: int, world: int, device: torch.device
) -> None:
    """Gather every rank's windows of the last epoch (order: this rank's); rank 0 says whether
    they are disjoint and how many windows no rank got."""
    mine = torch.from_numpy(order)
    if distributed:
        every = [torch.zeros_like(mine) for _ in range(world)]
        dist.all_gather(every, mine.to(device) if device.type == "cuda" else mine)
        every = [t.cpu() for t in every]
    else:
        every = [mine]
    if rank == 0:
        seen = torch.cat(every)
        disjoint = len(torch.unique(seen)) == len(seen)
        expected = n % world  # remainder="drop": the last n % W windows of the order
        say(
            f"{world} rank(s), {n:,} windows per epoch: each rank {len(mine):,}, "
            f"disjoint: {disjoint}, "
            f"dropped: {n - len(torch.unique(seen))} (n % world_size = {expected})"
        )


if __name__ == "__main__":
    raise SystemExit(main())
