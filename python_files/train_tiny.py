"""Train a tiny GPT on token files: notebook 06's training loop, from the command line.

    python python_files/train_tiny.py                     # the quick start's sample, 300 steps
    python python_files/train_tiny.py --device cpu --steps 600 --checkpoint-every 100
    python python_files/train_tiny.py --steps 600 --resume data/checkpoints/tiny_gpt.pt

Every --checkpoint-every steps, and after the last, it saves the model, the optimizer, the step and
the sampler's state in one file (torch.save of state dicts, numbers and the sampler's JSON-ready
dict; read back with weights_only=True). --resume continues that run: on a CPU the same losses and
the same weights as a run never stopped, bit for bit. Resume with the same --steps (the learning
rate falls over --steps) and the same data, sizes and --epoch-windows.
"""

from __future__ import annotations

import argparse
import itertools
import math
import os
import pickle
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).resolve().parent))

import npy_datasets as nd  # noqa: E402 (sys.path set)

DEFAULT_DATA = Path(__file__).resolve().parents[1] / "data" / "tinystories_sample"  # quick start's
N_VOCAB = 50257  # GPT-2's vocabulary: every id in the token files is below it
LR = 1e-2  # the first learning rate: high for a transformer, fine for a model this small


def make_loaders(
    data: Path, seq_len: int, batch_size: int, epoch_windows: int | None
) -> tuple[DataLoader, DataLoader]:
    """The training and validation DataLoaders of data/train.npy and data/validation.npy, made
    from nothing. epoch_windows: an epoch of that many training windows, each starting anywhere
    (mode="random", as nanoGPT draws them); None: each window of the file once an epoch."""
    mode = "windows" if epoch_windows is None else "random"
    train_path, val_path = data / "train.npy", data / "validation.npy"
    train = nd.NpyTokensDataset(
        train_path, seq_len, mode=mode, num_samples=epoch_windows, vocab_size=N_VOCAB
    )
    val = nd.NpyTokensDataset(val_path, seq_len, vocab_size=N_VOCAB)
    return nd.make_dataloaders(train, val, batch_size=batch_size, seed=0)


class TinyGPT(nn.Module):
    """A GPT from torch's own layers: embeddings, causal encoder layers, a tied output layer."""

    def __init__(self, seq_len: int, width: int, layers: int, heads: int) -> None:
        super().__init__()
        self.seq_len = seq_len  # the longest input: one learned position embedding each
        self.tokens = nn.Embedding(N_VOCAB, width)  # also the output layer (tied)
        self.positions = nn.Embedding(seq_len, width)
        for table in (self.tokens, self.positions):
            nn.init.normal_(table.weight, std=0.02)  # small scores at first: loss ln(N_VOCAB)
        layer = dict(d_model=width, nhead=heads, dim_feedforward=4 * width, dropout=0.0)
        self.blocks = nn.ModuleList(
            nn.TransformerEncoderLayer(**layer, batch_first=True, norm_first=True)
            for _ in range(layers)
        )
        self.norm = nn.LayerNorm(width)
        causal = nn.Transformer.generate_square_subsequent_mask(seq_len)  # -inf above the diagonal
        self.register_buffer("causal", causal, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Scores (batch, t, N_VOCAB) of the next token for ids x of shape (batch, t <= seq_len)."""
        t = x.shape[1]
        h = self.tokens(x) + self.positions.weight[:t]
        for block in self.blocks:
            h = block(h, src_mask=self.causal[:t, :t], is_causal=True)
        return self.norm(h) @ self.tokens.weight.T


def make_model(
    device: torch.device,
    seq_len: int,
    width: int = 64,
    layers: int = 2,
    heads: int = 4,
    lr: float = LR,
) -> tuple[TinyGPT, torch.optim.Optimizer]:
    """The model, from seeded weights (the same in every run), on device, and its optimizer."""
    torch.manual_seed(0)
    model = TinyGPT(seq_len, width, layers, heads).to(device)
    return model, torch.optim.AdamW(model.parameters(), lr=lr)


def loss_of(model: TinyGPT, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """The mean cross-entropy of the model's next-token scores, over every position of a batch."""
    x, y = nd.to_device(batch, model.causal.device)  # the mask moved with the model
    return F.cross_entropy(model(x).flatten(0, 1), y.flatten())


def lr_at(step: int, steps: int, lr: float) -> float:
    """From lr down to lr / 10 in a straight line over `steps` steps: a function of the step."""
    return lr * (1 - 0.9 * (step - 1) / steps)


def train_step(model: TinyGPT, opt: torch.optim.Optimizer, batch: tuple, lr: float) -> float:
    """One optimizer step on one batch at learning rate lr; the batch's loss."""
    for group in opt.param_groups:
        group["lr"] = lr
    loss = loss_of(model, batch)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return loss.item()  # waits until the device has finished the step


class Step(NamedTuple):
    """What train() reports after each step."""

    number: int  # the global step: counted over every epoch, and across a resume
    loss: float  # the batch's mean loss, nats per token
    batch_in_pass: int  # batches of this pass trained on: the sampler's `consumed`
    wait: float  # seconds the step waited for its batch
    seconds: float  # seconds the whole step took, the wait included


def train(
    model: TinyGPT, opt: torch.optim.Optimizer, loader: DataLoader, steps: int, step: int = 0
) -> Iterator[Step]:
    """Train steps step + 1 to `steps`, epoch after epoch; yield a Step as each one ends."""
    for epoch in itertools.count(loader.sampler.epoch):
        loader.sampler.set_epoch(epoch)  # after load_state_dict: the loaded epoch and position
        start = time.perf_counter()
        for i, batch in enumerate(loader, 1):  # i: batches of this pass, what the sampler counts
            arrived = time.perf_counter()
            step += 1
            lr = lr_at(step, steps, opt.defaults["lr"])  # the optimizer's own lr is the first
            loss = train_step(model, opt, batch, lr)
            yield Step(step, loss, i, arrived - start, time.perf_counter() - start)
            if step == steps:
                return  # a pass left early: the sampler stays in this epoch
            start = time.perf_counter()


@torch.no_grad()
def evaluate(model: TinyGPT, val_loader: DataLoader, batches: int) -> float:
    """Mean loss on the first `batches` validation batches: the same windows every time."""
    model.eval()
    losses = [loss_of(model, batch).item() for batch in itertools.islice(val_loader, batches)]
    model.train()
    return sum(losses) / len(losses)


def save_checkpoint(
    path: Path, model: TinyGPT, opt: torch.optim.Optimizer, sampler_state: dict, step: int
) -> None:
    """Model, optimizer, sampler state and step in one file, written under a temporary name
    first: a run killed while saving leaves the previous checkpoint whole."""
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step}
    temporary = path.with_name(path.name + ".tmp")
    torch.save({**state, "sampler": sampler_state}, temporary)
    os.replace(temporary, path)


def load_checkpoint(
    path: Path, model: TinyGPT, opt: torch.optim.Optimizer, loader: DataLoader
) -> int:
    """Load a save_checkpoint() file into a model, its optimizer and its loader; its step."""
    # weights_only: tensors, numbers, strings, lists and dicts; no pickled code runs. map_location:
    # a GPU's checkpoint loads on a CPU too (load_state_dict copies to where the model is)
    saved = torch.load(path, map_location="cpu", weights_only=True)
    model.load_state_dict(saved["model"])
    opt.load_state_dict(saved["optimizer"])
    loader.sampler.load_state_dict(saved["sampler"])
    return saved["step"]


@torch.no_grad()
def generate(
    model: TinyGPT, ids: list[int], new_tokens: int, top_k: int = 1, temperature: float = 1.0
) -> list[int]:
    """ids, then new_tokens more, each drawn from the model's top_k likeliest next tokens, their
    scores divided by temperature (top_k=1: the likeliest, greedy decoding). Seed torch first."""
    model.eval()
    ids = torch.tensor([ids], device=model.causal.device)
    for _ in range(new_tokens):
        scores = model(ids[:, -model.seq_len :])[:, -1]  # the model sees seq_len tokens at most
        best, which = (scores / temperature).topk(top_k)
        pick = torch.multinomial(best.softmax(dim=-1), 1)  # an index into best
        ids = torch.cat([ids, which.gather(1, pick)], dim=1)
    model.train()
    return ids[0].tolist()


# ---- the command line ----------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add = parser.add_argument
    add("--data", type=Path, default=DEFAULT_DATA, help="folder of train.npy and validation.npy")
    add("--steps", type=int, default=300, help="train until this step (default 300)")
    add("--seq-len", type=int, default=64, help="tokens a window (default 64)")
    add("--batch-size", type=int, default=2, help="windows a batch (default 2)")
    add("--width", type=int, default=64, help="the model's width (default 64)")
    add("--layers", type=int, default=2, help="transformer layers (default 2)")
    add("--heads", type=int, default=4, help="attention heads; they divide --width (default 4)")
    add("--lr", type=float, default=LR, help=f"the first learning rate (default {LR})")
    add("--epoch-windows", type=int, help="an epoch of this many windows drawn from anywhere")
    add("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    add("--checkpoint", type=Path, default=DEFAULT_DATA.parent / "checkpoints" / "tiny_gpt.pt")
    add("--checkpoint-every", type=int, default=100, help="steps between checkpoints (default 100)")
    add("--resume", type=Path, help="a checkpoint to continue from")
    add("--log-every", type=int, default=10, help="steps between loss lines (default 10)")
    add("--eval-every", type=int, default=100, help="steps between validations (default 100)")
    add("--eval-batches", type=int, default=16, help="validation batches (default 16)")
    args = parser.parse_args(argv)
    for name, value in vars(args).items():
        if isinstance(value, int) and value < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1, got {value}")
    if not (args.lr > 0 and math.isfinite(args.lr)):
        parser.error(f"--lr must be a finite number above 0, got {args.lr}")
    if args.resume is not None and not args.resume.is_file():
        parser.error(f"--resume must be a checkpoint file, got {str(args.resume)!r}")
    if args.checkpoint.is_dir():
        parser.error(f"--checkpoint must be a file's path, got the folder {str(args.checkpoint)!r}")
    if args.device.split(":")[0] not in ("cpu", "cuda") or (
        args.device.startswith("cuda") and not torch.cuda.is_available()
    ):
        valid = "cpu or cuda[:N]" if torch.cuda.is_available() else "cpu (no CUDA here)"
        parser.error(f"--device must be {valid}, got {args.device!r}")
    if args.width % args.heads:
        parser.error(f"--heads must divide --width: {args.heads} does not divide {args.width}")
    if args.epoch_windows is not None and args.epoch_windows < args.batch_size:
        parser.error(f"--epoch-windows must be at least --batch-size, got {args.epoch_windows}")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    device = torch.device(args.device)
    torch.use_deterministic_algorithms(device.type == "cpu")  # bit-for-bit resumes on a CPU
    if args.data == DEFAULT_DATA and not (DEFAULT_DATA / "train.npy").is_file():
        from prepare_tokens import prepare  # the quick start's files, made here as it makes them

        prepare(out=DEFAULT_DATA, progress=False)
    for name in ("train.npy", "validation.npy"):
        if not (args.data / name).is_file():
            raise SystemExit(f"no {args.data / name}: write it with prepare_tokens.py --out")
    train_loader, val_loader = make_loaders(
        args.data, args.seq_len, args.batch_size, args.epoch_windows
    )
    sizes = args.seq_len, args.width, args.layers, args.heads
    model, opt = make_model(device, *sizes, lr=args.lr)
    weights = sum(p.numel() for p in model.parameters())
    print(f"{weights:,} weights on {device}; {len(train_loader):,} batches an epoch", flush=True)
    step = 0 if args.resume is None else resume(args.resume, model, opt, train_loader)
    if step >= args.steps:
        raise SystemExit(
            f"the checkpoint is at step {step}: nothing to do for --steps {args.steps}"
        )
    since_log: list[Step] = []
    for done in train(model, opt, train_loader, args.steps, step):
        since_log.append(done)
        if done.number % args.log_every == 0 or done.number == args.steps:
            seconds = sum(s.seconds for s in since_log)
            ms = seconds / len(since_log) * 1000
            waiting = sum(s.wait for s in since_log) / seconds
            loss = f"loss {done.loss:.4f}, perplexity {math.exp(done.loss):,.1f}"
            timing = f"{ms:.1f} ms a step, {waiting:.1%} of it waiting for data"
            print(f"step {done.number}: {loss} ({timing})", flush=True)
            since_log = []
        if done.number % args.eval_every == 0 or done.number == args.steps:
            val = evaluate(model, val_loader, args.eval_batches)
            print(f"step {done.number}: validation loss {val:.4f}, perplexity {math.exp(val):,.1f}")
        if done.number % args.checkpoint_every == 0 or done.number == args.steps:
            state = train_loader.sampler.state_dict(consumed=done.batch_in_pass)
            save_checkpoint(args.checkpoint, model, opt, state, done.number)
            print(f"step {done.number}: saved {args.checkpoint}", flush=True)
    print_samples(model)


def resume(path: Path, model: TinyGPT, opt: torch.optim.Optimizer, loader: DataLoader) -> int:
    """load_checkpoint(), with one line naming --resume for a file it cannot load; its step."""
    try:
        step = load_checkpoint(path, model, opt, loader)
    except (RuntimeError, KeyError, TypeError, ValueError, pickle.UnpicklingError) as error:
        lines = [line.strip() for line in str(error).splitlines() if "size mismatch" in line]
        sizes = "--seq-len, --width, --layers, --heads"
        raise SystemExit(
            f"--resume {path}: not a checkpoint train_tiny wrote, or one of other sizes "
            f"({sizes})" + "".join(f"; {line}" for line in lines[:1])
        ) from None
    print(f"resumed at step {step}: epoch {loader.sampler.epoch}, {len(loader)} batches left")
    return step


def print_samples(model: TinyGPT, prompt: str = "Once upon a time, there was a") -> None:
    """The model's greedy continuation of the prompt, and a seeded top-k one."""
    from prep_tokenize import gpt2_encoding  # from the repository's files: no download

    enc = gpt2_encoding()
    ids = [enc.eot_token, *enc.encode_ordinary(prompt)]  # each story starts after <|endoftext|>
    greedy = generate(model, ids, 32)
    torch.manual_seed(0)  # the top-k draws: the same text every time
    sampled = generate(model, ids, 32, top_k=40, temperature=0.8)
    print(f"greedy: {enc.decode(greedy[1:])!r}")
    print(f"top-40, temperature 0.8: {enc.decode(sampled[1:])!r}")


if __name__ == "__main__":
    main()
