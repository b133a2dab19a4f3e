"""Train with Hugging Face accelerate on make_dataloaders' loader, in 1 or 2 processes; resume.

    python python_files/accelerate_example.py
    python python_files/accelerate_example.py --resume data/accelerate/step_15
    torchrun --standalone --nproc_per_node=2 python_files/accelerate_example.py --out data/acc_ddp

The loader is made after Accelerator(), which starts the process group under torchrun, so each
rank gets its own share of every epoch. prepare() gives it back as it is (it rebuilds only
DataLoaders), so batches are moved to the device with to_device. register_for_checkpointing puts
the loader's state_dict() into every save_state, and load_state restores it: a run resumed from a
save in the middle of an epoch trains the batches the unbroken run trains. The model is one
embedding and one linear layer: the example is about the data. --trace FILE appends, for every
step, each rank's step and a CRC-32 of each window it trained on (the tests compare runs with it).
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import zlib
from pathlib import Path

import torch
import torch.nn.functional as F
from accelerate import Accelerator

sys.path.insert(0, str(Path(__file__).resolve().parent))

from npy_datasets import (  # noqa: E402 (sys.path set)
    NpyTokensDataset,
    make_dataloaders,
    read_sidecar,
    to_device,
)

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DATA = ROOT / "data" / "tinystories_sample"


class TinyModel(torch.nn.Module):
    def __init__(self, n_vocab: int) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(n_vocab, 16)
        self.head = torch.nn.Linear(16, n_vocab)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(self.head(self.embed(x)).flatten(0, 1), y.flatten())


class Progress:
    """The global step, saved and restored with the rest by save_state and load_state."""

    def __init__(self) -> None:
        self.step = 0

    def state_dict(self) -> dict[str, int]:
        return {"step": self.step}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.step = state["step"]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="token file folder")
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--steps", type=int, default=30, help="optimizer steps in all")
    parser.add_argument("--checkpoint-every", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path("data") / "accelerate")
    parser.add_argument("--resume", type=Path, help="a folder this script's save_state wrote")
    parser.add_argument("--trace", type=Path, help="append each step's windows here (JSON lines)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    accelerator = Accelerator(cpu=not torch.cuda.is_available())  # under torchrun, it starts DDP
    if args.data == DEFAULT_DATA and not (DEFAULT_DATA / "train.npy").is_file():
        with accelerator.main_process_first():  # rank 0 writes the quick start's files once
            from prepare_tokens import prepare

            if accelerator.is_main_process:
                prepare(out=DEFAULT_DATA, progress=False)
    train = NpyTokensDataset(args.data / "train.npy", args.seq_len)
    train_loader, _ = make_dataloaders(train, batch_size=args.batch_size)  # each rank its own share
    model = TinyModel(read_sidecar(args.data / "train.npy")["n_vocab"])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, optimizer, train_loader = accelerator.prepare(model, optimizer, train_loader)
    progress = Progress()
    accelerator.register_for_checkpointing(train_loader, progress)  # progress: the global step
    if args.resume is not None:
        accelerator.load_state(args.resume)
    for epoch in itertools.count(train_loader.sampler.epoch):  # a resume goes on with its epoch
        train_loader.sampler.set_epoch(epoch)
        for batch in train_loader:
            if progress.step == args.steps:
                break
            x, y = to_device(batch, accelerator.device)
            loss = model(x, y)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            progress.step += 1
            if args.trace is not None:
                windows = [zlib.crc32(row.numpy().tobytes()) for row in batch[0]]
                line = {"step": progress.step, "rank": accelerator.process_index}
                with open(args.trace, "a") as f:  # one write a line: ranks never interleave
                    f.write(json.dumps({**line, "windows": windows}) + "\n")
            if progress.step % args.checkpoint_every == 0:
                accelerator.save_state(args.out / f"step_{progress.step}")
        if progress.step == args.steps:
            break
    accelerator.print(f"step {progress.step}: loss {loss.item():.3f}, saves in {args.out}")
    accelerator.end_training()  # leaves the process group: one left open can abort the exit


if __name__ == "__main__":
    main()
