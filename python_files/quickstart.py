"""The main job: prepare the bundled TinyStories sample, then smoke-test the DataLoader on it.

python python_files/quickstart.py            # the bundled sample, on the GPU if there is one
python python_files/quickstart.py --device cpu
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from npy_datasets import NpyTokensDataset, make_dataloaders, to_device  # noqa: E402 (sys.path set)
from prepare_tokens import prepare  # noqa: E402 (sys.path set)

ROOT = Path(__file__).resolve().parents[1]
SEQ_LEN, BATCH = 256, 16  # small enough for the sample's validation split (about 35k tokens)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--out", type=Path, default=ROOT / "data" / "tinystories_sample", help="token file folder"
    )
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--batches", type=int, default=200, help="batches to time (default 200)")
    args = parser.parse_args(argv)
    if args.batches < 1:
        parser.error(f"--batches must be at least 1, got {args.batches}")

    for prepared in prepare(out=args.out):
        print(prepared.summary())
    train = NpyTokensDataset(args.out / "train.npy", SEQ_LEN, vocab_size=50257)
    val = NpyTokensDataset(args.out / "validation.npy", SEQ_LEN, vocab_size=50257)
    train_loader, val_loader = make_dataloaders(train, val, batch_size=BATCH, seed=0)
    device = torch.device(args.device)

    x, y = to_device(next(iter(train_loader)), device)
    if not torch.equal(y[:, :-1], x[:, 1:]):
        raise SystemExit("smoke test failed: y is not x shifted by one token")
    print(f"train: {len(train):,} windows of {SEQ_LEN} tokens, validation: {len(val):,}")
    print(
        f"x: {tuple(x.shape)} {x.dtype} on {x.device}  |  "
        f"y: {tuple(y.shape)} {y.dtype} on {y.device}"
    )
    print(f"x[0, :8] = {x[0, :8].tolist()}")
    print(f"y[0, :8] = {y[0, :8].tolist()}   (y is x shifted by one token)")
    reader = train_loader.dataloader  # the torch DataLoader inside the loader
    print(f"pinned: {reader.pin_memory}, workers: {reader.num_workers}")

    batches, it = 0, iter(train_loader)
    start = time.perf_counter()
    while batches < args.batches:
        try:
            x, y = to_device(next(it), device)
        except StopIteration:  # the sample is small: start the next epoch
            it = iter(train_loader)
            continue
        batches += 1
    if device.type == "cuda":
        torch.cuda.synchronize()
    rate = batches / (time.perf_counter() - start)
    print(
        f"{rate:,.0f} batches/s ({rate * BATCH * SEQ_LEN / 1e6:.1f} M tokens/s) "
        f"over {batches} batches"
    )


if __name__ == "__main__":
    main()
