"""Train a tiny GPT on token files: notebook 06's training loop, from the command line.

    python python_files/train_tiny.py                     # the quick start's sample, 300 steps
    python python_files/train_tiny.py --device cpu --steps 600 --checkpoint-every 100
    python python_files/train_tiny.py --steps 600 --resume data/checkpoints/tiny_gpt.pt
    python python_files/train_tiny.py --data my_tokens --vocab my_tokens/vocab.json

Any tokenizer's files: the model has the n_vocab of train.npy's sidecar (write_tokens and the prep
step write it). The samples at the end are decoded with --vocab (a JSON list of strings, one an id)
when given, else with tiktoken when the sidecar names a tiktoken encoding ("tiktoken:gpt2"), and
shown as ids otherwise. A progress bar on stderr shows the step rate, the time left and the loss.

Every --checkpoint-every steps, and after the last, it saves the model, the optimizer, the step and
the sampler's state in one file (torch.save of state dicts, numbers and the sampler's JSON-ready
dict; read back with weights_only=True). --resume continues that run: on a CPU the same losses and
the same weights as a run never stopped, bit for bit. Resume with the same --steps (the learning
rate falls over --steps) and the same data, sizes, --batch-size and --epoch-windows: another is
refused, naming it.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import pickle
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent))

import npy_datasets as nd  # noqa: E402 (sys.path set)
from npy_datasets import EpochLoader  # noqa: E402 (sys.path set)

DEFAULT_DATA = Path(__file__).resolve().parents[1] / "data" / "tinystories_sample"  # quick start's
LR = 1e-2  # the first learning rate: high for a transformer, fine for a model this small
PROMPT = "Once upon a time, there was a"  # the samples' start, after the end-of-text token


def make_loaders(
    data: Path, n_vocab: int, seq_len: int, batch_size: int, epoch_windows: int | None
) -> tuple[EpochLoader, EpochLoader]:
    """The training and validation loaders of data/train.npy and data/validation.npy, made
    from nothing; an id at or past n_vocab is refused. epoch_windows: an epoch of that many
    training windows, each starting anywhere (mode="random", as nanoGPT draws them); None: each
    window of the file once an epoch."""
    mode = "windows" if epoch_windows is None else "random"
    train_path, val_path = data / "train.npy", data / "validation.npy"
    train = nd.NpyTokensDataset(
        train_path, seq_len, mode=mode, num_samples=epoch_windows, vocab_size=n_vocab
    )
    val = nd.NpyTokensDataset(val_path, seq_len, vocab_size=n_vocab)
    return nd.make_dataloaders(train, val, batch_size=batch_size, seed=0)


class TinyGPT(nn.Module):
    """A GPT from torch's own layers: embeddings, causal encoder layers, a tied output layer."""

    def __init__(self, n_vocab: int, seq_len: int, width: int, layers: int, heads: int) -> None:
        super().__init__()
        self.seq_len = seq_len  # the longest input: one learned position embedding each
        self.tokens = nn.Embedding(n_vocab, width)  # a row an id; also the output layer (tied)
        self.positions = nn.Embedding(seq_len, width)
        for table in (self.tokens, self.positions):
            nn.init.normal_(table.weight, std=0.02)  # small scores at first: loss ln(n_vocab)
        layer = dict(d_model=width, nhead=heads, dim_feedforward=4 * width, dropout=0.0)
        self.blocks = nn.ModuleList(
            nn.TransformerEncoderLayer(**layer, batch_first=True, norm_first=True)
            for _ in range(layers)
        )
        self.norm = nn.LayerNorm(width)
        causal = nn.Transformer.generate_square_subsequent_mask(seq_len)  # -inf above the diagonal
        self.register_buffer("causal", causal, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Scores (batch, t, n_vocab) of the next token for ids x of shape (batch, t <= seq_len)."""
        t = x.shape[1]
        h = self.tokens(x) + self.positions.weight[:t]
        for block in self.blocks:
            h = block(h, src_mask=self.causal[:t, :t], is_causal=True)
        return self.norm(h) @ self.tokens.weight.T


def make_model(
    device: torch.device,
    n_vocab: int,
    seq_len: int,
    width: int = 64,
    layers: int = 2,
    heads: int = 4,
    lr: float = LR,
) -> tuple[TinyGPT, torch.optim.Optimizer]:
    """The model, from seeded weights (the same in every run), on device, and its optimizer."""
    torch.manual_seed(0)
    model = TinyGPT(n_vocab, seq_len, width, layers, heads).to(device)
    return model, torch.optim.AdamW(model.parameters(), lr=lr)


def loss_of(model: TinyGPT, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """The mean cross-entropy of the model's next-token scores, over every position of a batch."""
    x, y = nd.to_device(batch, model.causal.device)  # the mask moved with the model
    return F.cross_entropy(model(x).flatten(0, 1), y.flatten())


def lr_at(step: int, steps: int, lr: float) -> float:
    """From lr at step 1 down a straight line that reaches lr / 10 just after step `steps`."""
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
    model: TinyGPT, opt: torch.optim.Optimizer, loader: EpochLoader, steps: int, step: int = 0
) -> Iterator[Step]:
    """Train steps step + 1 to `steps`, epoch after epoch; yield a Step as each one ends."""
    for epoch in itertools.count(loader.sampler.epoch):
        loader.sampler.set_epoch(epoch)  # after load_state_dict: the loaded epoch and position
        start = time.perf_counter()
        for i, batch in enumerate(loader, 1):  # i: batches of this pass, what the sampler counts
            arrived = time.perf_counter()
            step += 1
            lr = lr_at(step, steps, opt.defaults["lr"])  # the lr opt was made with: where it starts
            loss = train_step(model, opt, batch, lr)
            yield Step(step, loss, i, arrived - start, time.perf_counter() - start)
            if step == steps:
                return  # a pass left early: the sampler stays in this epoch
            start = time.perf_counter()


@torch.no_grad()
def evaluate(model: TinyGPT, val_loader: EpochLoader, batches: int) -> float:
    """Mean loss on the first `batches` validation batches: the same windows every time."""
    model.eval()
    losses = [loss_of(model, batch).item() for batch in itertools.islice(val_loader, batches)]
    model.train()
    return sum(losses) / len(losses)


def save_checkpoint(
    path: Path, model: TinyGPT, opt: torch.optim.Optimizer, loader: EpochLoader, step: int, i: int
) -> None:
    """Model, optimizer, step, and the loader's state after i batches of this pass, in one file
    written under a temporary name first: a run killed while saving leaves the previous whole."""
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step}
    state["sampler"] = loader.sampler.state_dict(consumed=i)
    state["batch_size"] = loader.sampler.batch_size  # the steps' batches: load_checkpoint checks it
    temporary = path.with_name(path.name + ".tmp")
    torch.save(state, temporary)
    os.replace(temporary, path)


def load_checkpoint(
    path: Path, model: TinyGPT, opt: torch.optim.Optimizer, loader: EpochLoader
) -> int:
    """Load a save_checkpoint() file into a model, its optimizer and its loader; its step."""
    # weights_only: tensors, numbers, strings, lists and dicts; no pickled code runs. map_location:
    # a GPU's checkpoint loads on a CPU too (load_state_dict copies to where the model is)
    saved = torch.load(path, map_location="cpu", weights_only=True)
    model.load_state_dict(saved["model"])  # a model of other sizes: a "size mismatch" error
    opt.load_state_dict(saved["optimizer"])
    if saved["batch_size"] != loader.sampler.batch_size:  # other batches: not the same run
        sizes = f"batch size {saved['batch_size']}, not {loader.sampler.batch_size}"
        raise ValueError(f"{path} was saved by a run of {sizes}: resume with the same batch size")
    loader.sampler.load_state_dict(saved["sampler"])  # other files or windows: it names the field
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
    add("--vocab", type=Path, help="a JSON list of strings, one an id: the samples shown as text")
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
    if args.vocab is not None and not args.vocab.is_file():
        parser.error(f"--vocab must be a JSON file, got {str(args.vocab)!r}")
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
    meta = token_files(args.data)
    text = sample_text(meta, args.vocab)  # before training: a --vocab it cannot use fails now
    try:
        train_loader, val_loader = make_loaders(
            args.data, meta["n_vocab"], args.seq_len, args.batch_size, args.epoch_windows
        )
    except (ValueError, OSError) as error:  # ids past n_vocab, a seq_len or batch too large
        settings = f"--data {args.data} --seq-len {args.seq_len} --batch-size {args.batch_size}"
        raise SystemExit(f"train_tiny.py {settings}: {error}") from None
    sizes = args.seq_len, args.width, args.layers, args.heads
    model, opt = make_model(device, meta["n_vocab"], *sizes, lr=args.lr)
    weights = sum(p.numel() for p in model.parameters())
    vocab = f"{meta['n_vocab']:,} ids of {meta['tokenizer']}"
    print(
        f"{weights:,} weights on {device} for {vocab}; {len(train_loader):,} batches an epoch",
        flush=True,
    )
    step = 0 if args.resume is None else resume(args, model, opt, train_loader)
    if step >= args.steps:
        raise SystemExit(
            f"the checkpoint is at step {step}: nothing to do for --steps {args.steps}"
        )
    fit(args, model, opt, train_loader, val_loader, step)
    print_samples(model, text)


def token_files(data: Path) -> dict[str, Any]:
    """train.npy's sidecar: its n_vocab sizes the model, its tokenizer decodes the samples. Both
    files must exist, with sidecars that name the same tokenizer (the quick start's are made)."""
    if data == DEFAULT_DATA and not (DEFAULT_DATA / "train.npy").is_file():
        from prepare_tokens import prepare  # the quick start's files, made here as it makes them

        prepare(out=DEFAULT_DATA, progress=False)
    metas = []
    for path in (data / "train.npy", data / "validation.npy"):
        if not path.is_file():
            raise SystemExit(f"no {path}: write it with prepare_tokens.py --out, or write_tokens")
        try:
            meta = nd.read_sidecar(path)
        except ValueError as error:  # a sidecar without n_vocab, or not JSON: it names the file
            raise SystemExit(f"--data: {error}") from None
        how = "write it with write_tokens(..., n_vocab=...) or prepare_tokens.py"
        if meta is None:
            raise SystemExit(f"{path} has no sidecar ({path.name}.json) to give its n_vocab: {how}")
        missing = next((key for key in ("n_vocab", "tokenizer") if key not in meta), None)
        if missing is not None:  # the reader needs neither; the model and the samples do
            raise SystemExit(f"--data: '{path}.json': {missing!r} is missing: {how}")
        metas.append(meta)
    train, val = metas
    keys = ("tokenizer", "n_vocab", "eot_id")
    bad = next((key for key in keys if val.get(key) != train.get(key)), None)
    if bad is not None:
        differ = f"has {bad} {val.get(bad)!r}, train.npy {train.get(bad)!r}"
        raise SystemExit(f"{data / 'validation.npy'} {differ}: write both with one tokenizer")
    return train


def resume(
    args: argparse.Namespace, model: TinyGPT, opt: torch.optim.Optimizer, loader: EpochLoader
) -> int:
    """load_checkpoint() of --resume; one line naming what differs, or what is wrong; its step."""
    path = args.resume
    try:
        step = load_checkpoint(path, model, opt, loader)
    except RuntimeError as error:  # torch's: a model of other sizes, or a file it cannot read
        lines = str(error).splitlines() or [""]
        mismatch = next((line.strip() for line in lines if "size mismatch" in line), None)
        if mismatch is None:
            raise SystemExit(
                f"--resume {path}: not a checkpoint train_tiny wrote ({lines[0]:.120})"
            )
        sizes = "the files' n_vocab (--data), --seq-len, --width, --layers, --heads"
        raise SystemExit(f"--resume {path}: saved by a model of other sizes ({sizes}); {mismatch}")
    except ValueError as error:  # a batch size, or the sampler's: the field that differs
        this = f"--data {args.data} --epoch-windows {args.epoch_windows}"
        this += f" --batch-size {args.batch_size}"
        raise SystemExit(f"--resume {path}: {error}; use the checkpoint's settings (now {this})")
    except (EOFError, KeyError, TypeError, IndexError, pickle.UnpicklingError) as error:
        first = str(error).splitlines()[0] if str(error) else "empty"  # EOFError of 0 bytes
        what = f"{type(error).__name__}: {first:.120}"
        raise SystemExit(f"--resume {path}: not a checkpoint train_tiny wrote ({what})")
    done = loader.state_dict()["position"] // loader.batch_size  # one process: its batches
    left = f"{len(loader) - done:,} of its {len(loader):,} batches left"  # len(): a whole epoch
    print(f"resumed at step {step}: epoch {loader.sampler.epoch}, {left}")
    return step


def fit(
    args: argparse.Namespace,
    model: TinyGPT,
    opt: torch.optim.Optimizer,
    train_loader: EpochLoader,
    val_loader: EpochLoader,
    step: int,
) -> None:
    """train() to --steps under a progress bar on stderr (steps a second, time left, loss and
    perplexity); on stdout a loss line every --log-every steps, validations and saves."""
    bar = tqdm(total=args.steps, initial=step, unit="step", file=sys.stderr, dynamic_ncols=True)
    since_log: list[Step] = []
    for done in train(model, opt, train_loader, args.steps, step):
        since_log.append(done)
        bar.set_postfix(
            loss=f"{done.loss:.3f}", perplexity=f"{math.exp(done.loss):,.1f}", refresh=False
        )
        bar.update()
        if done.number % args.log_every == 0 or done.number == args.steps:
            seconds = sum(s.seconds for s in since_log)
            ms = seconds / len(since_log) * 1000
            waiting = sum(s.wait for s in since_log) / seconds
            loss = f"loss {done.loss:.4f}, perplexity {math.exp(done.loss):,.1f}"
            timing = f"{ms:.1f} ms a step, {waiting:.1%} of it waiting for data"
            say(f"step {done.number}: {loss} ({timing})")
            since_log = []
        if done.number % args.eval_every == 0 or done.number == args.steps:
            val = evaluate(model, val_loader, args.eval_batches)
            say(f"step {done.number}: validation loss {val:.4f}, perplexity {math.exp(val):,.1f}")
        if done.number % args.checkpoint_every == 0 or done.number == args.steps:
            consumed = done.batch_in_pass
            save_checkpoint(args.checkpoint, model, opt, train_loader, done.number, consumed)
            say(f"step {done.number}: saved {args.checkpoint}")
    bar.close()


def say(line: str) -> None:
    """A line on stdout, above the progress bar (tqdm draws the bar again below it)."""
    tqdm.write(line, file=sys.stdout)
    sys.stdout.flush()


# ---- the samples: text for any tokenizer ---------------------------------------------------------


class SampleText(NamedTuple):
    """How the samples start and read: the prompt's ids, and ids -> text (None: shown as ids)."""

    prompt: list[int]
    decode: Callable[[list[int]], str] | None
    how: str  # with decode None: one line on how to read the ids


def sample_text(meta: dict[str, Any], vocab: Path | None) -> SampleText:
    """--vocab's strings when given; tiktoken when the sidecar names a tiktoken encoding
    ("tiktoken:gpt2": from the repository's files, no download); else ids, and how to read them."""
    eot = meta["eot_id"]  # each document starts after it: so does the prompt
    tokenizer = meta["tokenizer"]
    n_vocab = meta["n_vocab"]
    if vocab is not None:
        pieces = read_vocab(vocab, n_vocab)
        prompt = [eot, *(encode_greedily(pieces, PROMPT) or [])]  # or eot alone
        return SampleText(prompt, lambda ids: "".join(pieces[i] for i in ids), "")
    how = f"pass --vocab FILE, a JSON list of {n_vocab:,} strings, one an id, to see them as text"
    if tokenizer.startswith("tiktoken:"):
        from prep_tokenize import load_encoding

        try:
            enc = load_encoding(tokenizer.removeprefix("tiktoken:"))
        except ValueError as error:  # unknown, or offline and not in tiktoken's cache
            return SampleText([eot], None, f"{error}; or {how}")
        return SampleText([eot, *enc.encode_ordinary(PROMPT)], enc.decode, "")
    named = f"the files' tokenizer, {tokenizer!r}, is not tiktoken's"
    return SampleText([eot], None, f"ids above: {named}; decode them with it, or {how}")


def read_vocab(path: Path, n_vocab: int) -> list[str]:
    """--vocab's JSON list of n_vocab strings, string i the text of id i."""
    try:
        pieces = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:  # ValueError: not JSON, or not UTF-8
        raise SystemExit(f"--vocab {path}: cannot be read as JSON ({error})") from None
    if not isinstance(pieces, list) or not all(isinstance(piece, str) for piece in pieces):
        raise SystemExit(f'--vocab {path}: must be a JSON list of strings, one an id: ["a", ...]')
    if len(pieces) != n_vocab:
        found = f"holds {len(pieces):,} strings; the files' n_vocab is {n_vocab:,}"
        raise SystemExit(f"--vocab {path} {found}: give one string an id, in id order")
    return pieces


def encode_greedily(pieces: list[str], text: str) -> list[int] | None:
    """text as the ids of pieces, the longest piece first at each place (a character-level
    vocabulary: a character an id); None when some character is in no piece."""
    ids = {piece: i for i, piece in enumerate(pieces) if piece}
    longest = max(map(len, ids), default=0)
    encoded, at = [], 0
    while at < len(text):
        sizes = range(min(longest, len(text) - at), 0, -1)
        size = next((n for n in sizes if text[at : at + n] in ids), None)
        if size is None:
            return None
        encoded.append(ids[text[at : at + size]])
        at += size
    return encoded


def print_samples(model: TinyGPT, text: SampleText, new_tokens: int = 32) -> None:
    """The model's greedy continuation of the prompt, and a seeded top-k one."""
    top_k = min(40, model.tokens.num_embeddings)  # a character vocabulary may have fewer ids
    greedy = generate(model, text.prompt, new_tokens)
    torch.manual_seed(0)  # the top-k draws: the same text every time
    sampled = generate(model, text.prompt, new_tokens, top_k=top_k, temperature=0.8)
    if text.decode is None:
        print(f"greedy (ids): {greedy[1:]}")
        print(f"top-{top_k}, temperature 0.8 (ids): {sampled[1:]}")
        print(text.how)
        return
    print(f"greedy: {text.decode(greedy[1:])!r}")
    print(f"top-{top_k}, temperature 0.8: {text.decode(sampled[1:])!r}")


if __name__ == "__main__":
    main()
