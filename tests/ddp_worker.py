"""One rank of a real torchrun job for tests/test_loaders.py (gloo on the CPU, no GPU needed).

    python -m torch.distributed.run --standalone --nproc_per_node=2 tests/ddp_worker.py \
        --out DIR --train FILE --val FILE --seq-len 8 --batch-size 5 [--disagreements JSON]

Each rank builds its datasets, calls make_dataloaders (which checks across ranks that they agree),
runs one epoch of train and val, then one epoch through a plain DataLoader with torch's
DistributedSampler, and writes the windows it saw (every x row) to DIR/rank<r>.json. When a step
fails, it writes the message to DIR/rank<r>.json instead, waits for the other ranks to have done
the same, and exits with status 1.

--disagreements {"name": {"train": FILE, "rank1": {"seq_len": 16 | "train": OTHER | "seed": 4}}}:
instead, for each named case in turn, every rank builds its datasets (rank 1 with the case's
differences) and calls make_dataloaders, and DIR/rank<r>.json maps each name to the error it
raised ("none" if it raised none).
"""

import argparse
import datetime
import json
import sys
from pathlib import Path

import torch.distributed as dist
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python_files"))
import npy_datasets as nd  # noqa: E402 (imported after the sys.path line above)


def rows(loader) -> list[list[int]]:
    return [row for x, _ in loader for row in x.tolist()]


def main() -> int:
    parser = argparse.ArgumentParser()
    for name in ("--out", "--train", "--val"):
        parser.add_argument(name, required=True)
    parser.add_argument("--seq-len", type=int, required=True)
    parser.add_argument("--batch-size", type=int, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--disagreements", type=json.loads, help="cases where rank 1 differs")
    args = parser.parse_args()
    # A rank that waits for a peer that never comes fails after a minute instead of hanging; the
    # ranks reach each collective within seconds of each other, even on a busy machine.
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    report = one_epoch(args, rank) if args.disagreements is None else disagreements(args, rank)
    (Path(args.out) / f"rank{rank}.json").write_text(json.dumps(report))
    if "error" in report:
        dist.barrier()  # every rank has written its message before torchrun stops the job
    dist.destroy_process_group()
    return 1 if "error" in report else 0


def one_epoch(args: argparse.Namespace, rank: int) -> dict:
    """The windows of one epoch of train and val, and of torch's DistributedSampler, or the error."""
    try:
        train = nd.NpyTokensDataset(args.train, args.seq_len)
        val = nd.NpyTokensDataset(args.val, args.seq_len)
        train_loader, val_loader = nd.make_dataloaders(
            train, val, batch_size=args.batch_size, num_workers=0, seed=args.seed
        )
        plain = DataLoader(
            train, batch_size=args.batch_size, sampler=DistributedSampler(train, seed=args.seed)
        )
        return {
            "rank": rank,
            "world_size": dist.get_world_size(),
            "train": rows(train_loader),
            "val": rows(val_loader),
            "distributed_sampler": rows(plain),
            "train_state": train_loader.sampler.state_dict(),
        }
    except Exception as e:  # report it, then fail like any rank would
        return {"rank": rank, "error": f"{type(e).__name__}: {e}"}


def disagreements(args: argparse.Namespace, rank: int) -> dict:
    """For each case, the error make_dataloaders raised on this rank ("none" if none)."""
    errors = {}
    for name, case in args.disagreements.items():
        mine = {"train": case["train"], "seq_len": args.seq_len, "seed": args.seed}
        mine |= case["rank1"] if rank == 1 else {}
        try:
            train = nd.NpyTokensDataset(mine["train"], mine["seq_len"])
            val = nd.NpyTokensDataset(args.val, mine["seq_len"])
            nd.make_dataloaders(train, val, batch_size=args.batch_size, seed=mine["seed"])
            errors[name] = "none"
        except Exception as e:
            errors[name] = f"{type(e).__name__}: {e}"
    return {"rank": rank, "errors": errors}


if __name__ == "__main__":
    sys.exit(main())
