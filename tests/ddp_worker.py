"""One rank of a real torchrun job for tests/test_loaders.py (gloo on the CPU, no GPU needed).

    python -m torch.distributed.run --standalone --nproc_per_node=2 tests/ddp_worker.py \
        --out DIR --train FILE --val FILE --seq-len 8 --batch-size 3 \
        [--rank1-seq-len 16 | --rank1-train OTHER | --rank1-seed 4]

Each rank builds its datasets, calls make_dataloaders (which checks across ranks that they agree),
runs one epoch of train and val, then one epoch through a plain DataLoader with torch's
DistributedSampler, and writes the windows it saw (every x row) to DIR/rank<r>.json. When a step
fails, it writes the message to DIR/rank<r>.json instead, waits for the other ranks to have done
the same, and exits with status 1.
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
    parser.add_argument(
        "--rank1-seq-len", type=int, help="rank 1 uses this seq_len instead (a mismatch)"
    )
    parser.add_argument("--rank1-train", help="rank 1 uses this train file instead (a mismatch)")
    parser.add_argument(
        "--rank1-seed", type=int, help="rank 1 uses this shuffle seed instead (a mismatch)"
    )
    args = parser.parse_args()
    # A rank that waits for a peer that never comes fails after a minute instead of hanging; the
    # ranks reach each collective within seconds of each other, even on a busy machine.
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    out = Path(args.out) / f"rank{rank}.json"
    seq_len = args.rank1_seq_len if rank == 1 and args.rank1_seq_len else args.seq_len
    train_path = args.rank1_train if rank == 1 and args.rank1_train else args.train
    seed = args.rank1_seed if rank == 1 and args.rank1_seed is not None else args.seed
    try:
        train = nd.NpyTokensDataset(train_path, seq_len)
        val = nd.NpyTokensDataset(args.val, seq_len)
        train_loader, val_loader = nd.make_dataloaders(
            train, val, batch_size=args.batch_size, num_workers=0, seed=seed
        )
        plain = DataLoader(
            train, batch_size=args.batch_size, sampler=DistributedSampler(train, seed=args.seed)
        )
        seen = {
            "rank": rank,
            "world_size": world,
            "train": rows(train_loader),
            "val": rows(val_loader),
            "distributed_sampler": rows(plain),
            "train_state": train_loader.sampler.state_dict(),
        }
    except Exception as e:  # report it, then fail like any rank would
        out.write_text(json.dumps({"rank": rank, "error": f"{type(e).__name__}: {e}"}))
        dist.barrier()  # every rank has written its message before torchrun stops the job
        dist.destroy_process_group()
        return 1
    out.write_text(json.dumps(seen))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
