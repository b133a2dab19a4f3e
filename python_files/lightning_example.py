"""Train with PyTorch Lightning on make_dataloaders' loaders, in one process or several; resume.

    python python_files/lightning_example.py
    python python_files/lightning_example.py --resume data/lightning/step=15.ckpt
    python python_files/lightning_example.py --devices 2 --out data/lightning_ddp

The loaders go to Lightning as make_dataloaders returns them, made in the data module's setup(),
which Lightning calls on every rank once the process group has started: each rank gets its own
share of every epoch, and Lightning leaves the loaders as they are (it rebuilds only DataLoaders).
Lightning calls the sampler's set_epoch at the top of each epoch, saves the loader's state_dict()
in every checkpoint and loads it on a resume, so a run resumed from a checkpoint taken in the
middle of an epoch trains the batches the unbroken run trains. The model is one embedding and one
linear layer: the example is about the data. --trace FILE appends, for every step, each rank's
step and a CRC-32 of each window it trained on (the tests compare runs with it).
"""

from __future__ import annotations

import argparse
import json
import sys
import zlib
from pathlib import Path

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import ModelCheckpoint

sys.path.insert(0, str(Path(__file__).resolve().parent))

from npy_datasets import (  # noqa: E402 (sys.path set)
    NpyTokensDataset,
    make_dataloaders,
    read_sidecar,
)

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DATA = ROOT / "data" / "tinystories_sample"


class TokenData(L.LightningDataModule):
    def __init__(self, folder: Path, seq_len: int, batch_size: int) -> None:
        super().__init__()
        self.folder, self.seq_len, self.batch_size = folder, seq_len, batch_size

    def setup(self, stage: str) -> None:  # on every rank, once the process group has started
        train = NpyTokensDataset(self.folder / "train.npy", self.seq_len)
        val = NpyTokensDataset(self.folder / "validation.npy", self.seq_len)
        self.loaders = make_dataloaders(train, val, batch_size=self.batch_size)

    def train_dataloader(self):
        return self.loaders[0]

    def val_dataloader(self):
        return self.loaders[1]


class TinyModel(L.LightningModule):
    def __init__(self, n_vocab: int, trace: Path | None = None) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(n_vocab, 16)
        self.head = torch.nn.Linear(16, n_vocab)
        self.trace = trace

    def loss(self, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x, y = batch
        return F.cross_entropy(self.head(self.embed(x)).flatten(0, 1), y.flatten())

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int):
        if self.trace is not None:
            self.write_trace(batch[0])
        loss = self.loss(batch)
        self.log("loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        self.log("val_loss", self.loss(batch), sync_dist=True)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-2)

    def write_trace(self, x: torch.Tensor) -> None:
        windows = [zlib.crc32(row.numpy().tobytes()) for row in x.cpu()]
        line = {"step": self.global_step + 1, "rank": self.global_rank, "windows": windows}
        with open(self.trace, "a") as f:  # one write a line: ranks' lines never interleave
            f.write(json.dumps(line) + "\n")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="token file folder")
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--steps", type=int, default=30, help="optimizer steps in all")
    parser.add_argument("--checkpoint-every", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path("data") / "lightning")
    parser.add_argument("--resume", type=Path, help="a checkpoint this script wrote")
    parser.add_argument("--devices", type=int, default=1, help="processes (DDP when over 1)")
    parser.add_argument("--accelerator", default="cpu", help='"cpu", "gpu" or "auto"')
    parser.add_argument("--trace", type=Path, help="append each step's windows here (JSON lines)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.data == DEFAULT_DATA and not (DEFAULT_DATA / "train.npy").is_file():
        from prepare_tokens import prepare  # the quick start's files, made as it makes them

        prepare(out=DEFAULT_DATA, progress=False)
    n_vocab = read_sidecar(args.data / "train.npy")["n_vocab"]  # the model's vocabulary
    checkpoints = ModelCheckpoint(
        dirpath=args.out,
        filename="{step}",
        every_n_train_steps=args.checkpoint_every,
        save_top_k=-1,
    )
    trainer = L.Trainer(
        accelerator=args.accelerator,
        devices=args.devices,
        strategy="ddp" if args.devices > 1 else "auto",
        max_steps=args.steps,
        callbacks=[checkpoints],
        logger=False,
        enable_progress_bar=sys.stderr.isatty(),
        enable_model_summary=False,
    )
    data = TokenData(args.data, args.seq_len, args.batch_size)
    trainer.fit(TinyModel(n_vocab, args.trace), datamodule=data, ckpt_path=args.resume)
    if trainer.global_rank == 0:
        loss = trainer.callback_metrics["loss"].item()
        print(f"step {trainer.global_step}: loss {loss:.3f}, checkpoints in {args.out}")
    # Lightning leaves a CPU (gloo) process group open at exit, and one left for the interpreter's
    # shutdown can abort the process ("terminate called without an active exception").
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
