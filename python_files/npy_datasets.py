"""Serve (x, y) next-token windows to PyTorch from token files on disk.

Copy this one file into your project. It needs Python 3.11+, numpy and torch.

    write_tokens("data/tinystories/train.npy", ids,  # once: ids from any tokenizer
                 n_vocab=50257, tokenizer="tiktoken:gpt2", eot_id=50256)
    train = NpyTokensDataset("data/tinystories/train.npy", seq_len=256)  # or a glob
    val = NpyTokensDataset("data/tinystories/validation.npy", seq_len=256)
    train_loader, val_loader = make_dataloaders(train, val, batch_size=32)
    if resuming:  # after loading the model and the optimizer
        train_loader.load_state_dict(checkpoint["loader"])
    for epoch in range(train_loader.sampler.epoch, 10):  # 0, or the saved epoch
        train_loader.sampler.set_epoch(epoch)
        for batch in train_loader:  # after a resume, the rest of the epoch
            x, y = to_device(batch, "cuda")  # int64, (32, 256): y is x shifted by one
            ...  # loss = model(x, y); save the model, optimizer and loader's state

Terms. A token file holds token ids, uint16 or uint32: a .npy file, raw ids
(a .bin, as nanoGPT writes them) or an llm.c shard (llm.c's format: a
1,024-byte header, then the ids). Its sidecar is the JSON file beside it
(train.npy.json) that says what it holds. A shard is one of several files
that together hold a dataset. A window is seq_len + 1 tokens in a row: x is
its first seq_len, y its last seq_len. An epoch is one order of all the
windows; a pass is one `for batch in loader` loop over an epoch, or over
the rest of one after a resume. torchrun starts one process per GPU; each
is a rank, numbered 0 to world_size - 1 (the number of processes), and
serves its share of each epoch. A probe is the sha256 of a file's first
and last 64 KiB, which each open compares with the sidecar's, so a replaced
file is caught without reading it all.

len(train_loader) is a whole epoch's batches, even in a resumed pass, so
keep your own step count. A batch counts as served once your loop receives
it, so train on each batch you receive before you save or stop. A loop that
breaks and iterates again in the same process gets that pass from its start,
as a DataLoader would; a run resumed from state_dict() goes on after the
last batch the loop received. Under torchrun, make the loaders after
torch.cuda.set_device(local_rank) and init_process_group: each rank serves
its share of each epoch, and all ranks' states are equal (save rank 0's,
load it on each). Lightning and accelerate take these loaders as they are.

How it works. Token files are memory-mapped: only the pages a batch touches
are read. The sampler yields batches of window indices, each with its epoch.
The dataset finds where each window starts, and copies the batch out at
once. The loader counts the batches your loop receives, so its state resumes
a run exactly, with any number of ranks or workers.

The file reads top-down: the dataset, the sampler and the loaders, the
helpers they call, opening files, and the writer. Within a part, what you
call comes first. Last comes the open-file budget, an appendix you may cut
whole (its header says how); MAX_OPEN_FILES there is the one number to tune.
Importing it imports numpy only: a prep script can write files without torch."""

from __future__ import annotations

import errno
import glob
import hashlib
import io
import json
import os
import secrets
import stat
import warnings
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, NamedTuple

import numpy as np

if TYPE_CHECKING:
    import torch

PathLike = str | os.PathLike

__all__ = [
    "NpyTokensDataset",
    "EpochSampler",
    "EpochLoader",
    "make_dataloaders",
    "to_device",
    "verify_across_ranks",
    "TokenFileError",
    "read_sidecar",
    "open_tokens",
    "write_tokens",
    "FORMAT_VERSION",
]

# ---- The format version, and the error for a bad file ----

FORMAT_VERSION = 1  # of the JSON sidecar this file reads and writes


class TokenFileError(ValueError):
    """A token file or its sidecar cannot be read safely."""


# ---- The dataset: window indices in, (x, y) out ----


class NpyTokensDataset:
    """(x, y) next-token windows of token files, as int64 tensors.

    Token files hold uint16 or uint32 ids. x is seq_len tokens, and y is x
    shifted by one. ds[i] is window i, and ds[epoch, indices] is a batch. path
    is a file, a list of files, or a glob such as "data/train_*.npy". No window
    crosses from one file, or from one row of a 2-D file, to the next.

    mode="windows" cuts the tokens into windows one after another: no token is
    in two windows' x, though y's last token is the next window's first x token.
    mode="random" serves num_samples windows an epoch (by default as many as
    mode="windows" has), at random starts that depend only on seed, the epoch
    and the index. So seed matters in that mode only; make_dataloaders' seed
    sets the order windows are served in. A plain DataLoader(ds, batch_size=B)
    passes no epoch: it gets epoch 0's windows every epoch.

    dtype is for raw .bin files without a sidecar. vocab_size refuses a file
    holding an id of vocab_size or more (read whole once if its sidecar has no
    max_token_id). verify=True compares each file's sha256 with its sidecar's."""

    def __init__(
        self,
        path: PathLike | Sequence[PathLike],
        seq_len: int,
        *,
        mode: str = "windows",
        num_samples: int | None = None,
        seed: int = 0,
        dtype: Any = None,
        vocab_size: int | None = None,
        verify: bool = False,
    ) -> None:
        _check_int("seq_len", seq_len, 1)
        _check_int("seed", seed, 0)
        if mode not in ("windows", "random"):
            raise ValueError(f'mode must be "windows" or "random", got {mode!r}')
        if num_samples is not None and mode != "random":
            raise ValueError('num_samples applies to mode="random" only')
        if num_samples is not None:
            _check_int("num_samples", num_samples, 1)
        self.seq_len = int(seq_len)
        self.mode = mode
        self.seed = int(seed)
        self.files = self._open_files(path, dtype, vocab_size, verify)
        self.paths = [f.path for f in self.files]
        self.dtype = self.files[0].dtype
        shapes = [f.shape if len(f.shape) == 2 else (1, *f.shape) for f in self.files]
        shapes = np.array(shapes)  # each file's rows and tokens a row; 1-D is one row
        self._row_len = shapes[:, 1]
        self._windows_per_row = (self._row_len - 1) // self.seq_len
        self._starts_per_row = np.maximum(self._row_len - self.seq_len, 0)
        # Window k is in file f when bounds[f] <= k < bounds[f + 1]. The
        # random starts of mode="random" are numbered the same way.
        windows = np.cumsum(shapes[:, 0] * self._windows_per_row)
        starts = np.cumsum(shapes[:, 0] * self._starts_per_row)
        self._window_bounds = np.concatenate(([0], windows))
        self._start_bounds = np.concatenate(([0], starts))
        if self._window_bounds[-1] == 0:
            held = "and the rest hold" if len(self.paths) > 1 else "holds"
            raise ValueError(
                f"{self.paths[0]!r} {held} no window: {self._row_len.max()} tokens at most "
                f"(in a file, or a row of a 2-D file), and seq_len={seq_len} needs {seq_len + 1}"
            )
        self.num_samples = int(self._window_bounds[-1] if num_samples is None else num_samples)
        self._one_flat_file = len(self.files) == 1 and len(self.files[0].shape) == 1
        # The windows of each file this process has mapped, least recently used first.
        self._maps: dict[int, np.ndarray] = {}
        self._pid = None  # the process the maps belong to
        self._max_maps = 0  # set by _windows in each process

    @staticmethod
    def _open_files(path: Any, dtype: Any, vocab_size: Any, verify: bool) -> list[TokenFile]:
        """Open each file: path is a file, a list of files, or a glob (sorted)."""
        given = path if isinstance(path, (list, tuple)) else [path]
        if not given or not all(isinstance(p, (str, os.PathLike)) for p in given):
            raise TypeError(f"path must be a file, a glob or a non-empty list: {path!r:.100}")
        text = os.fspath(given[0])
        pattern = not os.path.exists(text) and bool(set(text) & set("*?["))
        if isinstance(path, (list, tuple)) or not pattern:
            paths = [os.fspath(p) for p in given]
        else:
            paths = sorted(p for p in glob.glob(text) if not p.endswith(".json"))
        if not paths:
            raise FileNotFoundError(f"no token file matches {text!r} (*.json are skipped)")
        files = [_open_file(p, dtype, vocab_size, verify) for p in paths]
        first = files[0]
        other = next((f for f in files if f.dtype != first.dtype), None)
        if other is not None:
            raise TokenFileError(
                f"{other.path!r} holds {other.dtype.name}, {first.path!r} "
                f"{first.dtype.name}: a dataset has one dtype"
            )
        named = {f.sidecar["tokenizer"]: f.path for f in files if "tokenizer" in f.sidecar}
        if len(named) > 1:
            raise TokenFileError(f"a dataset needs one tokenizer; these differ: {named}")
        return files

    def __getstate__(self) -> dict[str, Any]:  # pickled for a worker, which maps files anew
        return {**self.__dict__, "_maps": {}}

    def __len__(self) -> int:
        return self.num_samples

    def fingerprint(self) -> dict[str, Any]:
        """What decides the windows, as JSON: the files and the settings."""
        files = [
            {"name": Path(f.path).name, "bytes": f.identity[2], "dtype": f.dtype.name}
            | {"shape": list(f.shape), "sha256": f.sidecar.get("sha256"), "probe": f.probe}
            for f in self.files
        ]
        settings = {"seq_len": self.seq_len, "mode": self.mode, "seed": self.seed}
        return {"files": files, **settings, "num_samples": self.num_samples}

    def __getitem__(self, index: int | tuple[int, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        if not isinstance(index, tuple):
            x, y = self._gather(0, self._indices([index]))
            return x[0], y[0]
        if len(index) != 2:
            raise TypeError(f"use ds[i] or ds[epoch, indices], not ds[{index!r:.80}]")
        _check_int("epoch", index[0], 0)
        return self._gather(int(index[0]), self._indices(index[1]))

    def __getitems__(self, keys: list[int] | tuple) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """A batch for DataLoader: keys are (epoch, indices), or indices of epoch 0.
        A DataLoader calls it once a batch, where it exists, not __getitem__ once a key."""
        epoch, indices = keys if isinstance(keys, tuple) and len(keys) == 2 else (0, keys)
        if self.mode == "random" and not isinstance(keys, tuple):
            warnings.warn(
                'mode="random" with no epoch: the same windows each epoch; use '
                "make_dataloaders, or an EpochSampler as batch_sampler="
            )
        _check_int("epoch", epoch, 0)
        x, y = self._gather(int(epoch), self._indices(indices))
        return list(zip(x, y))

    def _indices(self, keys: list | np.ndarray) -> np.ndarray:
        """Window indices as int64, from 0 to len(self) - 1; -1 is the last."""
        found = np.asarray(keys)
        # numpy would read True as 1: a bool among the keys is refused
        bools = isinstance(keys, (list, tuple)) and {bool, np.bool_} & set(map(type, keys))
        if found.ndim != 1 or (found.size and found.dtype.kind not in "iu") or bools:
            raise TypeError(
                f"use ds[i] or ds[epoch, indices] (1-D ints), not {found.dtype} {keys!r:.80}"
            )
        n = self.num_samples
        low, high = (int(found.min()), int(found.max())) if found.size else (0, 0)
        if low < -n or high >= n:
            bad = low if low < -n else high
            more = f" and {len(self.paths) - 1} more files" if len(self.paths) > 1 else ""
            where = f"{n} windows of {self.paths[0]!r}{more}"
            raise IndexError(f"index {bad} is out of range for {where}")
        if low < 0:
            return found.astype(np.int64) % n
        return found.astype(np.int64, copy=False)

    def locate(self, epoch: int, indices: Any) -> tuple[np.ndarray, np.ndarray]:
        """Each window's file, and its first token's position in that file."""
        _check_int("epoch", epoch, 0)
        return self._locate(int(epoch), self._indices(indices))

    def _locate(self, epoch: int, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """locate without its checks: the batch path, _gather, calls this."""
        indices = np.asarray(indices, dtype=np.int64)
        if self.mode == "random":  # slot k is the k-th possible start, over all files
            # Seed and epoch are hashed before the index is added: else window
            # i + 1 of epoch e would be window i of epoch e + 1.
            key = _splitmix64(_splitmix64(self.seed) + epoch)
            hashed = _splitmix64(indices.astype(np.uint64) + np.uint64(key))
            slots = (hashed % np.uint64(self._start_bounds[-1])).astype(np.int64)
            bounds, per_row, stride = self._start_bounds, self._starts_per_row, 1
        else:
            slots = indices
            bounds, per_row = self._window_bounds, self._windows_per_row
            stride = self.seq_len
        if self._one_flat_file:  # one 1-D file: no search for the file, no division
            return np.zeros_like(slots), slots * stride
        files = np.searchsorted(bounds[1:], slots, side="right")
        rows, place = np.divmod(slots - bounds[files], per_row[files])
        return files, rows * self._row_len[files] + place * stride

    def _gather(self, epoch: int, indices: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """A batch as int64 x and y, read with one index into each file."""
        import torch

        files, firsts = self._locate(epoch, indices)
        if len(self.files) == 1:
            windows = self._windows(0)[firsts]
        else:
            windows = np.empty((len(firsts), self.seq_len + 1), dtype=self.dtype)
            for f in np.unique(files).tolist():  # one file's map in use at a time
                mine = files == f
                windows[mine] = self._windows(f)[firsts[mine]]
        x = windows[:, :-1].astype(np.int64)
        y = windows[:, 1:].astype(np.int64)
        return torch.from_numpy(x), torch.from_numpy(y)

    def _windows(self, f: int) -> np.ndarray:
        """Every window of file f, as the rows of a view over its map."""
        file = self.files[f]
        try:
            st = os.stat(file.path)
            same = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns) == file.identity
        except OSError:
            same = False
        if not same:  # if the file shrank, reading its map raises SIGBUS, which kills the process
            raise TokenFileError(
                f"{file.path!r} changed since the dataset opened it (its size, modification "
                "time or inode is not the same): make the NpyTokensDataset again"
            )
        if self._pid != os.getpid():  # a new process (a worker): drop inherited maps
            self._maps = {}
            self._pid = os.getpid()
            self._max_maps = _maps_this_process_may_keep()
        windows = self._maps.pop(f, None)  # re-inserted last, so the dict is in order of use
        while windows is None and len(self._maps) >= self._max_maps:
            del self._maps[next(iter(self._maps))]
        if windows is None:  # a view, no copy: row s is tokens[s : s + seq_len + 1]
            flat = np.asarray(_memmap(file)).reshape(-1)
            step = flat.strides[0]
            shape = (max(len(flat) - self.seq_len, 0), self.seq_len + 1)
            windows = np.lib.stride_tricks.as_strided(flat, shape, (step, step), writeable=False)
        self._maps[f] = windows
        return windows


def _splitmix64(x: Any) -> Any:
    """SplitMix64's output: a well-mixed 64-bit hash of an int or a uint64 array."""
    mask = 2**64 - 1
    x = (x + 0x9E3779B97F4A7C15) & mask
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & mask
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & mask
    return x ^ (x >> 31)


# ---- The sampler: each epoch's order, each rank's share, resuming ----


class EpochSampler:
    """Batches of window indices, as (epoch, indices), for an EpochLoader or
    for DataLoader(ds, batch_sampler=sampler).

    Epoch e's order depends only on seed and e. Rank r of W serves items r,
    r + W, r + 2W, ... of it. remainder="drop" leaves out the windows that
    the ranks cannot share evenly, and "pad" repeats the first few instead:
    DistributedSampler's drop_last=True and False. drop_last=True drops this
    rank's short last batch, as DataLoader's drop_last does.

    Each iteration is a pass. The next pass is:
      at first                      epoch 0, from its start
      after a pass that served all  the next epoch, from its start
      after a pass the loop left    the same pass again
      after set_epoch(e)            epoch e, from its start
      after load_state_dict(state)  its epoch, from its position; until a
                                    pass ends, set_epoch takes that epoch only
    The state is the epoch and a position in its order of all ranks' items,
    so a run may resume with other numbers of ranks or workers, or another
    batch size. Under a plain DataLoader(ds, batch_sampler=sampler) with
    workers, pass consumed= to state_dict: the workers fetch batches ahead of
    your loop, so a pass they fetched whole counts as served though your loop
    left it."""

    def __init__(
        self,
        data_source: Any,
        *,
        batch_size: int,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        world_size: int | None = None,
        rank: int | None = None,
        remainder: str = "drop",
    ) -> None:
        _check_int("batch_size", batch_size, 1)
        _check_int("seed", seed, 0)
        if type(shuffle) is not bool or type(drop_last) is not bool:
            raise TypeError(f"shuffle and drop_last must be bools: {shuffle!r}, {drop_last!r}")
        if remainder not in ("drop", "pad"):
            raise ValueError(f'remainder must be "drop" or "pad", got {remainder!r}')
        if (world_size is None) != (rank is None):
            raise ValueError(f"pass both world_size and rank, or neither: {world_size}, {rank}")
        self._world_from_torch = world_size is None  # checked again each pass
        if world_size is None:
            world_size, rank = _distributed_world()
        _check_int("world_size", world_size, 1)
        _check_int("rank", rank, 0, world_size - 1)
        self.num_samples = len(data_source)
        if not 1 <= self.num_samples <= 2**31:  # an epoch's order is held in memory
            raise ValueError(f"an epoch takes 1 to 2**31 windows, not {self.num_samples:,}")
        self.batch_size = int(batch_size)
        self.shuffle = shuffle
        self.seed = int(seed)
        self.drop_last = drop_last
        self.world_size = int(world_size)
        self.rank = int(rank)
        self.remainder = remainder
        # The pass state, for the docstring's table. _latest: the pass that
        # began last. _epoch, _start: the next pass's epoch and start in its
        # order, unless _latest served all its batches (then the next epoch,
        # from 0). _resumed: a state was loaded and no pass has ended since.
        self._epoch = 0
        self._start = 0
        self._resumed = False
        self._latest: SamplerPass | None = None
        fingerprint = getattr(data_source, "fingerprint", None)
        self._fingerprint = None if fingerprint is None else fingerprint()
        if len(self) == 0:
            raise ValueError(
                f"batch_size={batch_size} leaves no whole batch of "
                f"{self._share(self.num_samples)} windows a rank: lower batch_size or ranks"
            )

    @property
    def epoch(self) -> int:
        """The epoch of the next pass (during a pass's last batch, the one after)."""
        return self._next_pass()[0]

    def _finished(self) -> bool:  # the latest pass served all its batches
        return self._latest is not None and self._latest.handed == self._latest.items

    def _next_pass(self) -> tuple[int, int]:
        """The next pass's epoch, and its start in that epoch's order."""
        if self._finished():
            return self._latest.epoch + 1, 0
        return self._epoch, self._start

    def set_epoch(self, epoch: int) -> None:
        """The next pass is epoch `epoch`; after load_state_dict, only the saved one."""
        _check_int("epoch", epoch, 0)
        resuming = self._resumed and not self._finished()
        if resuming and epoch != self._epoch:
            raise ValueError(
                f"set_epoch({epoch}), but the loaded state continues epoch {self._epoch} "
                f"at {self._start}: start your epoch loop at sampler.epoch. For example, "
                "a Lightning checkpoint saved after fit(max_steps=...) counts that epoch "
                "as done: save with ModelCheckpoint instead"
            )
        self._start = self._start if resuming else 0
        self._epoch = int(epoch)
        self._resumed = resuming
        self._latest = None  # a state saved now describes the pass to come

    def __len__(self) -> int:
        """A whole epoch's batches on this rank."""
        items = self._share(self.num_samples)
        size = self.batch_size
        return items // size if self.drop_last else _ceil_div(items, size)

    def _share(self, n: int) -> int:  # each rank's share of n windows
        world = self.world_size
        return n // world if self.remainder == "drop" else _ceil_div(n, world)

    def order(self, epoch: int, start: int = 0) -> np.ndarray:
        """This rank's window indices of `epoch`, from `start` in its order."""
        if not 0 <= start <= self.num_samples:
            raise ValueError(f"start must be from 0 to {self.num_samples:,}, got {start}")
        if self.shuffle:
            full = np.random.default_rng([self.seed, epoch]).permutation(self.num_samples)
        else:
            full = np.arange(self.num_samples)
        rest = full[start:]
        extra = len(rest) % self.world_size
        if extra and self.remainder == "drop":
            rest = rest[: len(rest) - extra]
        elif extra:  # np.resize repeats the first items as often as need be
            rest = np.concatenate((rest, np.resize(full, self.world_size - extra)))
        return rest[self.rank :: self.world_size]

    def __iter__(self) -> Iterator[tuple[int, np.ndarray]]:
        # A generator: a pass picks its epoch when its first batch is asked for.
        current, batches = self._begin()
        for epoch, indices in batches:
            current.handed += len(indices)
            yield epoch, indices

    def _begin(self) -> tuple[SamplerPass, Iterator[tuple[int, np.ndarray]]]:
        """Begin the next pass: its record, and its batches (the caller counts)."""
        now = _distributed_world() if self._world_from_torch else None
        if now is not None and now != (self.world_size, self.rank):
            raise RuntimeError(
                f"an EpochSampler made for rank {self.rank} of {self.world_size}, now rank "
                f"{now[1]} of {now[0]}: make the loaders after "
                "torch.distributed.init_process_group"
            )
        self._resumed = self._resumed and not self._finished()
        epoch, start = self._next_pass()
        mine = self.order(epoch, start)
        if self.drop_last:
            mine = mine[: len(mine) // self.batch_size * self.batch_size]
        self._epoch = epoch
        self._start = start
        self._latest = SamplerPass(epoch, start, len(mine))
        size = self.batch_size
        batches = ((epoch, mine[lo : lo + size]) for lo in range(0, len(mine), size))
        return self._latest, batches

    def state_dict(self, consumed: int | None = None) -> dict[str, Any]:
        """Where a run resumed from this state goes on, as JSON. Under a plain
        DataLoader, pass consumed: the batches of this pass your loop took."""
        latest = self._latest or SamplerPass(self._epoch, self._start, 0)
        items = latest.handed
        if consumed is not None:
            batches = _ceil_div(latest.handed, self.batch_size)  # handed out so far
            _check_int("consumed", consumed, 0)
            if consumed > batches:
                raise ValueError(
                    f"consumed={consumed}, but the pass handed out {batches} batches: count "
                    "this pass's batches (enumerate(loader, 1)), not all steps"
                )
            items = min(int(consumed) * self.batch_size, latest.items)
        epoch = latest.epoch
        position = latest.start + items * self.world_size
        if self._latest is not None and items == latest.items:  # all served
            epoch = latest.epoch + 1
            position = 0
        state = {"format": "npy_datasets.EpochSampler", "version": 1}
        state |= {"epoch": epoch, "position": position, "dataset": self._fingerprint}
        settings = {"num_samples": self.num_samples, "shuffle": self.shuffle}
        return state | settings | {"seed": self.seed}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue where a state_dict() of the same windows, order and seed stopped."""
        mine = self.state_dict() | {"epoch": 0, "position": 0}
        if not isinstance(state, dict) or set(state) != set(mine):
            raise ValueError(f"not an EpochSampler state (keys {sorted(mine)}): {state!r:.200}")
        settings = [k for k in mine if k not in ("epoch", "position")]
        typed = {k: (type(mine[k]), mine[k]) for k in settings}  # in JSON, true is not 1
        bad = next((k for k in settings if (type(state[k]), state[k]) != typed[k]), None)
        if bad is not None:  # name the first field that differs, inside the dataset's too
            pairs = zip(_leaves(state[bad], bad), _leaves(mine[bad], bad))
            first = ((p, a, b) for (p, a), (_, b) in pairs if a != b)
            bad, saved, here = next(first, (bad, state[bad], mine[bad]))
            if isinstance(saved, dict) and isinstance(here, dict):  # one file's record
                key = next((k for k in here if saved.get(k) != here[k]), "")
                bad, saved, here = f"{bad}.{key}", saved.get(key), here.get(key)
            there = f"{saved!r:.120} in the state, {here!r:.120} here"
            raise ValueError(f"a state of other windows or order: {bad} is {there}")
        _check_int("epoch", state["epoch"], 0)
        _check_int("position", state["position"], 0, self.num_samples - 1)
        self._epoch = int(state["epoch"])
        self._start = int(state["position"])
        self._resumed = True
        self._latest = None


@dataclass
class SamplerPass:
    """One pass over an EpochSampler, as far as it has gone."""

    epoch: int
    start: int  # where it began in the epoch's order (all ranks' items)
    items: int  # the indices this rank's pass holds
    handed: int = 0  # how many of them it has handed out (to your loop, in an EpochLoader)


def _ceil_div(a: int, b: int) -> int:
    """The number of batches of b that hold a items: the last may be short."""
    return -(-a // b)


# ---- The loaders: what a training loop iterates over ----


class EpochLoader:
    """(x, y) batches of an EpochSampler's passes, read by a DataLoader.

    It counts the batches your loop receives, so state_dict() is exact with
    any number of workers. It is not a DataLoader on purpose: Lightning and
    accelerate would rebuild a DataLoader around a sampler of their own."""

    def __init__(
        self,
        dataset: NpyTokensDataset,
        sampler: EpochSampler,
        *,
        num_workers: int = 0,
        pin_memory: bool = False,
        prefetch_factor: int = 2,
    ) -> None:
        from torch.utils.data import DataLoader

        if not isinstance(sampler, EpochSampler):
            raise TypeError(f"sampler must be an EpochSampler, got {type(sampler).__name__}")
        made_for = sampler._fingerprint  # None if it was made of something else
        here = getattr(dataset, "fingerprint", lambda: None)()
        if sampler.num_samples != len(dataset) or made_for not in (None, here):
            raise ValueError(
                "the sampler was made for other windows than the dataset's: make it with "
                "EpochSampler(dataset, ...)"
            )
        self.dataset = dataset
        self.sampler = sampler
        self.batch_size = sampler.batch_size
        self.batch_sampler = None  # Lightning reads it, as on a DataLoader
        # batch_size=None: ds[epoch, indices] once a batch from _PassIndices; tuple keeps (x, y).
        self._pass = _PassIndices()
        # The workers' settings, until the first pass checks their descriptors.
        self._workers = (num_workers, prefetch_factor) if num_workers else None
        options = {"batch_size": None, "collate_fn": tuple, "num_workers": num_workers}
        if num_workers:  # DataLoader refuses these without workers
            options.update(persistent_workers=True, prefetch_factor=prefetch_factor)
        self.dataloader = DataLoader(dataset, sampler=self._pass, pin_memory=pin_memory, **options)

    def __len__(self) -> int:
        """A whole epoch's batches on this rank."""
        return len(self.sampler)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        # A generator: the pass begins at the first batch, after set_epoch.
        if self._workers is not None:  # so files opened since make_dataloaders count
            _check_loader(*self._workers, pin=False)
            self._workers = None
        current, batches = self.sampler._begin()
        self._pass.batches = batches  # what the DataLoader reads next
        for x, y in self.dataloader:  # counted before the loop gets it
            current.handed += len(x)
            yield x, y

    def state_dict(self) -> dict[str, Any]:
        """The sampler's state_dict(): where a run resumed from it goes on."""
        return self.sampler.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """The sampler's load_state_dict()."""
        self.sampler.load_state_dict(state)


class _PassIndices:
    """The sampler of an EpochLoader's DataLoader: the latest pass's batches."""

    batches: Iterator[tuple[int, np.ndarray]] = iter(())

    def __iter__(self) -> Iterator[tuple[int, np.ndarray]]:
        return self.batches


def make_dataloaders(
    train: NpyTokensDataset,
    val: NpyTokensDataset | None = None,
    *,
    batch_size: int,
    num_workers: int = 0,
    seed: int = 0,
    pin_memory: bool | None = None,
    prefetch_factor: int = 2,
    world_size: int | None = None,
    rank: int | None = None,
) -> tuple[EpochLoader, EpochLoader | None]:
    """An EpochLoader of (x, y) batches for train, and one for val (or None).

    Train is shuffled in an order that seed sets (a dataset's own seed sets
    only where mode="random" windows start). Validation is in order; in
    mode="random" it draws new windows each pass: for the same windows at every
    evaluation, call val_loader.sampler.set_epoch(0) before each. Under
    torch.distributed each rank serves an equal share: train leaves out the
    last few windows, validation repeats the first few. Make the loaders after
    the process group starts: the ranks check that they agree. Memory is pinned
    when CUDA is available; pinning starts CUDA, so call torch.cuda.set_device
    first."""
    import torch

    if not isinstance(train, NpyTokensDataset) or not isinstance(val, NpyTokensDataset | None):
        raise TypeError(
            "train and val (or None) must be NpyTokensDatasets, got "
            f"{type(train).__name__} and {type(val).__name__}"
        )
    _check_int("batch_size", batch_size, 1)  # before the ranks compare them
    _check_int("seed", seed, 0)
    _check_int("num_workers", num_workers, 0)
    _check_int("prefetch_factor", prefetch_factor, 1)
    if pin_memory not in (None, True, False):
        raise TypeError(f"pin_memory must be True, False or None, got {pin_memory!r}")
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        val_fingerprint = None if val is None else val.fingerprint()
        fingerprints = {"train": train.fingerprint(), "val": val_fingerprint}
        verify_across_ranks({**fingerprints, "batch_size": int(batch_size), "seed": int(seed)})
    pin = torch.cuda.is_available() if pin_memory is None else pin_memory
    _check_loader(num_workers, prefetch_factor, pin and torch.cuda.is_available())
    options = {"num_workers": num_workers, "prefetch_factor": prefetch_factor, "pin_memory": pin}
    common = {"world_size": world_size, "rank": rank, "batch_size": batch_size, "seed": seed}
    sampler = EpochSampler(train, shuffle=True, drop_last=True, remainder="drop", **common)
    train_loader = EpochLoader(train, sampler, **options)
    if val is None:
        return train_loader, None
    sampler = EpochSampler(val, shuffle=False, remainder="pad", **common)
    return train_loader, EpochLoader(val, sampler, **options)


def to_device(
    batch: Sequence[torch.Tensor], device: str | torch.device
) -> tuple[torch.Tensor, ...]:
    """Move a batch's tensors to device; from pinned memory, without waiting."""
    return tuple(t.to(device, non_blocking=t.is_pinned()) for t in batch)


def verify_across_ranks(settings: dict[str, Any], group: Any = None) -> None:
    """Raise on every rank unless all pass equal JSON settings (a dataset's
    fingerprint(), say), naming the first rank and setting that differ.
    Under NCCL it gathers on the current CUDA device: call
    torch.cuda.set_device(local_rank) first."""
    seen = _gather_digests([json.dumps(settings, sort_keys=True)], group)
    other = next((rank for rank, theirs in enumerate(seen) if theirs != seen[0]), 0)
    if not other:
        return
    # Every rank raises. To name what differs, gather one digest for each setting and file.
    leaves = list(_leaves(settings, ""))
    seen = _gather_digests([json.dumps(leaf) for leaf in leaves], group)
    pairs = enumerate(zip(seen[0], seen[other]))
    first = next((i for i, (a, b) in pairs if a != b), len(leaves))
    where, value = leaves[first] if first < len(leaves) else ("its settings", "")
    value = value["name"] if isinstance(value, dict) and "name" in value else value
    raise RuntimeError(
        f"rank {other} differs from rank 0 in {where} ({value!r:.60} on this rank): "
        "give every rank the same files and settings"
    )


# ---- Helpers: checking arguments, talking to torch.distributed ----


def _check_int(name: str, value: Any, low: int, high: int | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r:.80}")
    if high is not None and not low <= value <= high:
        raise ValueError(f"{name} must be from {low:,} to {high:,}, got {value}")
    if value < low:
        raise ValueError(f"{name} must be at least {low:,}, got {value}")
    if value >= 2**63:  # numpy computes with it as an int64
        raise ValueError(f"{name} must be below 2**63, got {value}")


def _distributed_world() -> tuple[int, int]:
    """(world_size, rank) of torch.distributed; (1, 0) outside torchrun."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size(), dist.get_rank()
    launched = os.environ.get("WORLD_SIZE", "1")  # torchrun sets it
    if launched != "1":
        raise RuntimeError(
            f"WORLD_SIZE={launched}, but torch.distributed is not initialised: "
            "call init_process_group first, or pass world_size and rank"
        )
    return 1, 0


def _leaves(value: Any, path: str) -> Iterator[tuple[str, Any]]:
    """(path, value) of each setting: a dict's keys, a list's length and items."""
    if isinstance(value, dict) and value:
        for key, item in value.items():
            yield from _leaves(item, f"{path}.{key}" if path else str(key))
    elif isinstance(value, list):
        yield f"len({path})", len(value)
        for i, item in enumerate(value):
            yield f"{path}[{i}]", item
    else:
        yield path, value


def _gather_digests(texts: list[str], group: Any) -> list[list[bytes]]:
    """Each rank's sha256 digests of texts, gathered as tensors, not pickled."""
    import torch
    import torch.distributed as dist

    device = "cuda" if dist.get_backend(group) == "nccl" else "cpu"  # NCCL moves CUDA tensors only
    world = dist.get_world_size(group)
    count = torch.tensor([len(texts)], device=device)
    counts = [torch.empty_like(count) for _ in range(world)]
    dist.all_gather(counts, count, group=group)
    digests = b"".join(hashlib.sha256(t.encode()).digest() for t in texts)
    mine = torch.zeros((max(counts).item(), 32), dtype=torch.uint8)
    mine[: len(texts)] = torch.frombuffer(bytearray(digests), dtype=torch.uint8).view(-1, 32)
    mine = mine.to(device)
    seen = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(seen, mine, group=group)
    return [[bytes(row.tolist()) for row in theirs.cpu()] for theirs in seen]


# ---- Opening token files: each is checked before it is mapped ----

NPY_MAGIC = b"\x93NUMPY"  # the first bytes of every .npy file
# llm.c's shards: 256 int32 words (magic, version, count, zeros), then the ids.
LLMC_HEADER_BYTES = 256 * 4
LLMC_VERSIONS = {20240520: 1, 20240801: 7}  # magic: version
LLMC_DTYPES = {20240520: np.dtype("<u2"), 20240801: np.dtype("<u4")}
LLMC_OTHER_FILES = (20240326, 20240327, 20240328, 20240522)  # weights and such
PROBE_BYTES = 1 << 16  # a file's probe hashes this many bytes at each end
# The sidecar fields write_tokens writes, and their JSON types. The reader
# needs only format and format_version (and dtype, for raw ids).
WRITTEN_FIELDS = {
    "format": str,
    "format_version": int,
    "file": str,
    "layout": str,
    "dtype": str,
    "shape": list,
    "n_tokens": int,
    "file_size": int,
    "sha256": str,
    "probe_sha256": str,
    "max_token_id": int,
    "tokenizer": str,
    "n_vocab": int,
    "eot_id": int,
}
JSON_TYPES = {str: "string", int: "integer", list: "array"}


class TokenFile(NamedTuple):
    """A token file as it was when it was checked and opened."""

    path: str
    layout: str  # "npy", "llmc" or "bin" (raw ids)
    dtype: np.dtype
    shape: tuple[int, ...]  # (tokens,), or (rows, tokens) for a 2-D .npy
    offset: int  # bytes before the first id
    identity: tuple[int, int, int, int]  # device, inode, size, mtime
    probe: str  # sha256 of its first and last PROBE_BYTES
    sidecar: dict[str, Any]  # {} for a file without one


def read_sidecar(path: PathLike) -> dict[str, Any] | None:
    """A token file's JSON sidecar (None if there is none), its fields checked."""
    side = sidecar_path(path)
    name = repr(str(side))
    if not os.path.lexists(side):
        return None
    if not side.is_file():  # reading a FIFO would wait for a writer
        raise TokenFileError(f"{name} is not a file: a sidecar is JSON, or absent")
    try:
        meta = json.loads(side.read_bytes())
    except (OSError, ValueError, RecursionError) as error:  # ValueError: it is not JSON
        raise TokenFileError(f"{name} is not JSON ({error}); write it again") from None
    if not isinstance(meta, dict) or meta.get("format") != "npy-tokens":
        raise TokenFileError(f'{name} is not a sidecar: it lacks "format": "npy-tokens"')
    version = meta.get("format_version")  # its type is checked below with the rest
    if type(version) is int and not 1 <= version <= FORMAT_VERSION:
        raise TokenFileError(
            f"{name} has format_version {version!r}; this npy_datasets.py reads 1 to "
            f"{FORMAT_VERSION}: copy a newer one"
        )
    # type(), not isinstance(): a JSON true is a bool, and a bool is an int.
    present = [k for k in WRITTEN_FIELDS if k in meta or k == "format_version"]
    bad = next((k for k in present if type(meta.get(k)) is not WRITTEN_FIELDS[k]), None)
    if bad is not None:
        found = f"is {meta[bad]!r:.60}, not" if bad in meta else "is missing: it needs"
        raise TokenFileError(
            f"{name}: {bad!r} {found} a JSON {JSON_TYPES[WRITTEN_FIELDS[bad]]}; write the "
            "file again (rerun the prep step, or write_tokens)"
        )
    return meta


def sidecar_path(path: PathLike) -> Path:
    """A token file's JSON sidecar: its name with '.json' added (train.npy.json)."""
    return Path(path).with_name(Path(path).name + ".json")


def open_tokens(
    path: PathLike, dtype: Any = None, *, vocab_size: int | None = None, verify: bool = False
) -> np.memmap:
    """A token file's ids as a read-only memmap: a .npy, an llm.c shard, or
    raw ids (of the sidecar's dtype, or dtype=)."""
    return _memmap(_open_file(os.fspath(path), dtype, vocab_size, verify))


def _open_file(path: str, dtype: Any, vocab_size: int | None, verify: bool) -> TokenFile:
    """A token file, checked: its kind, sidecar, header, and first and last bytes."""
    if vocab_size is not None:
        _check_int("vocab_size", vocab_size, 1)
    if type(verify) is not bool:
        raise TypeError(f"verify must be True or False, got {verify!r}")
    dtype = None if dtype is None else _token_dtype(dtype, "the dtype argument")
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise FileNotFoundError(f"{path!r} does not exist") from None
    except OSError as error:  # no permission, a link loop, ...
        raise TokenFileError(f"{path!r} cannot be read ({error.strerror})") from None
    if not stat.S_ISREG(st.st_mode):  # reading a FIFO would wait for a writer
        kind = "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file"
        raise TokenFileError(f"{path!r} is {kind}; expected a .npy or .bin token file")
    if st.st_size == 0:
        raise TokenFileError(f"{path!r} is empty (0 bytes); write it again")
    meta = read_sidecar(path) or {}
    if verify and "sha256" not in meta:
        lacks = "its sidecar has no sha256" if meta else "it has no sidecar"
        raise TokenFileError(f"{path!r}: {lacks}, whose sha256 verify=True compares")
    with open(path, "rb") as f:  # everything below reads this one open file
        st = os.fstat(f.fileno())
        head = f.read(PROBE_BYTES)
        layout, found, shape, offset = _layout(path, head, st.st_size, meta, dtype)
        probe = _probe(f, head, st.st_size)
        f.seek(0)
        digest = hashlib.file_digest(f, "sha256").hexdigest() if verify else None
    if dtype not in (None, found):
        raise TokenFileError(f"{path!r} holds {found.name}, not dtype={dtype.name}")
    actual = {"layout": layout, "dtype": found.name, "shape": list(shape)}
    actual |= {"file_size": st.st_size, "probe_sha256": probe}
    bad = next((k for k in actual if k in meta and meta[k] != actual[k]), None)
    if bad is not None:
        raise TokenFileError(
            f"{path!r} was replaced or damaged since its sidecar: {bad} is "
            f"{meta[bad]!r:.70} there, {actual[bad]!r:.70} here"
        )
    if verify and digest != meta["sha256"]:
        raise TokenFileError(f"{path!r} is damaged: its sha256 is not its sidecar's")
    identity = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    file = TokenFile(path, layout, found, shape, offset, identity, probe, meta)
    if vocab_size is not None:  # the sidecar's max_token_id, else every id, read once
        top = meta.get("max_token_id")
        top = int(_memmap(file).max()) if top is None else top
        if top >= vocab_size:
            raise TokenFileError(f"{path!r} holds ids up to {top}, past vocab_size={vocab_size}")
    return file


def _layout(
    path: str, head: bytes, size: int, meta: dict[str, Any], dtype: np.dtype | None
) -> tuple[str, np.dtype, tuple[int, ...], int]:
    """The layout a file's first bytes show; its ids' dtype, shape and offset."""
    magic = int.from_bytes(head[:4], "little")
    # A sidecar's "bin" is final: raw ids may spell a magic (GPT-2's 20115,
    # 19797, 22864 spell the .npy one).
    raw = meta.get("layout") == "bin"
    if not raw and (head.startswith(NPY_MAGIC) or path.endswith(".npy")):
        return ("npy", *_npy_layout(path, head, size))
    if not raw and magic in LLMC_OTHER_FILES:
        raise TokenFileError(f"{path!r} is an llm.c file (magic {magic}), not a token shard")
    if not raw and magic in LLMC_VERSIONS:  # checked as llm.c checks it: version and size
        version, count = np.frombuffer(head[4:12].ljust(8, b"\0"), dtype="<i4").tolist()
        dtype = LLMC_DTYPES[magic]
        needed = LLMC_HEADER_BYTES + count * dtype.itemsize
        if version != LLMC_VERSIONS[magic] or count <= 0 or needed != size:
            raise TokenFileError(
                f"{path!r} is no llm.c token shard (magic {magic}, version {version}, "
                f"{count} tokens: {needed} bytes, not {size})"
            )
        return "llmc", dtype, (count,), LLMC_HEADER_BYTES
    dtype = meta.get("dtype", dtype)  # raw ids: the sidecar's dtype, or dtype=
    if dtype is None:
        raise TokenFileError(
            f"{path!r} holds raw ids and no sidecar gives their dtype: pass "
            "dtype=np.uint16 (nanoGPT's train.bin) or np.uint32"
        )
    dtype = _token_dtype(dtype, repr(path))
    if size % dtype.itemsize:
        raise TokenFileError(f"{path!r} has {size} bytes, not a whole number of {dtype.name} ids")
    return "bin", dtype, (size // dtype.itemsize,), 0


def _npy_layout(path: str, head: bytes, size: int) -> tuple[np.dtype, tuple[int, ...], int]:
    """A .npy file's dtype, shape and offset, once numpy has read its header."""
    if not head.startswith(NPY_MAGIC):
        found = "is cut short in" if NPY_MAGIC.startswith(head) else f"starts {head[:6]!r}, not"
        raise TokenFileError(f"{path!r} {found} the .npy magic (raw ids go in a .bin)")
    readers = {
        (1, 0): np.lib.format.read_array_header_1_0,
        (2, 0): np.lib.format.read_array_header_2_0,
    }
    try:  # only the bytes read already: numpy refuses a header over 10,000 bytes
        with io.BytesIO(head) as f:
            version = np.lib.format.read_magic(f)
            if version not in readers:  # version 3.0 only adds UTF-8 field names
                raise ValueError(f"format version {version}; token files use 1.0 or 2.0")
            shape, fortran, found = readers[version](f)
            offset = f.tell()
    except Exception as error:  # numpy raises several kinds
        # Keep numpy's first sentence: the rest may suggest allow_pickle, never safe here.
        reason = str(error).split(".\n")[0].split(". ")[0]
        raise TokenFileError(f"{path!r} has a .npy header numpy cannot read: {reason}") from None
    dtype = _token_dtype(found, repr(path))  # a 0-byte dtype would kill numpy
    if (
        not 1 <= len(shape) <= 2
        or any(type(n) is not int for n in shape)  # numpy lets True pass as an int
        or min(shape) < 1
        or (fortran and len(shape) == 2 and 1 not in shape)
    ):
        order = "Fortran" if fortran else "C"
        raise TokenFileError(
            f"{path!r} holds shape {shape} in {order} order: token ids are 1-D or 2-D, "
            "in C order, each dimension at least 1"
        )
    needed = offset + dtype.itemsize * int(np.prod(shape, dtype=object))
    if needed > size:
        raise TokenFileError(
            f"{path!r} is cut short: header and ids need {needed:,} bytes, the file has {size:,}"
        )
    return dtype, shape, offset


def _token_dtype(dtype: Any, where: str) -> np.dtype:
    """dtype as little-endian uint16 or uint32, the widths of token ids."""
    try:
        found = np.dtype(dtype)
    except (TypeError, ValueError):
        raise TokenFileError(f"{where}: {dtype!r} is not a dtype; use uint16 or uint32") from None
    if found.kind != "u" or found.itemsize not in (2, 4) or found.byteorder == ">":
        raise TokenFileError(
            f"{where}: dtype {found.str!r} is not uint16 or uint32, little-endian: write it "
            "with write_tokens (which picks uint16 or uint32), or save ids.astype(np.uint16) "
            "when all are below 65,536"
        )
    return found.newbyteorder("<")


def _probe(f: BinaryIO, head: bytes, size: int) -> str:
    """sha256 of a file's first and last PROBE_BYTES, no byte twice."""
    f.seek(max(len(head), size - PROBE_BYTES))
    return hashlib.sha256(head + f.read(PROBE_BYTES)).hexdigest()


def _memmap(file: TokenFile) -> np.memmap:
    """A checked file's ids, mapped read-only if the path still opens that
    file: a file renamed over it since is refused."""
    try:
        with open(file.path, "rb") as f:
            st = os.fstat(f.fileno())
            if (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns) == file.identity:
                return np.memmap(f, file.dtype, "r", offset=file.offset, shape=file.shape)
    except (OSError, ValueError) as error:  # ValueError: it shrank since it was checked
        reason = getattr(error, "strerror", None) or error
        problem = f"{file.path!r} cannot be mapped ({reason})"
        if getattr(error, "errno", None) in (errno.EMFILE, errno.ENFILE):
            problem += f"; {_limit_fix(1, '')}"  # out of descriptors
        raise TokenFileError(problem) from None
    raise TokenFileError(
        f"{file.path!r} changed since it was checked (its size, modification time or "
        "inode is not the same): open it again"
    )


# ---- Writing token files (optional: cut it if yours are made elsewhere) ----


def write_tokens(
    path: PathLike,
    ids: Any,
    *,
    n_vocab: int,
    tokenizer: str,
    eot_id: int,
    dtype: Any = None,
    layout: str | None = None,
    **fields: Any,
) -> dict[str, Any]:
    """Write ids to path, then the JSON sidecar that describes them; return the sidecar.

    ids is an array, a list of equal-length arrays (rows of a 2-D .npy), or an
    iterator of 1-D arrays, written as one stream. eot_id is recorded in the
    sidecar, not inserted: put it between documents yourself, so that windows
    can tell them apart. layout is "npy", "bin" (raw ids, as nanoGPT's
    train.bin) or "llmc" (llm.c's shards); by default "bin" for a .bin path,
    else "npy". Nothing old is replaced until all is written."""
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"{str(path)!r} is a folder, not a file path")
    _check_int("n_vocab", n_vocab, 1, 2**32)
    _check_int("eot_id", eot_id, 0, n_vocab - 1)
    if not isinstance(tokenizer, str) or not tokenizer:
        raise TypeError(f"tokenizer must be a name such as 'tiktoken:gpt2', got {tokenizer!r}")
    if layout is None:
        layout = "bin" if path.suffix == ".bin" else "npy"
    if layout not in HEADERS or (path.suffix == ".npy" and layout != "npy"):
        valid = '"npy", "bin" or "llmc" ("npy" for a .npy path)'
        raise ValueError(f"{str(path)!r}: layout={layout!r}; use {valid}; nothing written")
    if dtype is None:  # GPT-2's largest id, 50256, fits uint16
        dtype = "<u2" if n_vocab <= 2**16 else "<u4"
    dtype = _token_dtype(dtype, "the dtype argument")
    if n_vocab - 1 > np.iinfo(dtype).max:
        raise ValueError(f"n_vocab={n_vocab:,} has ids that {dtype.name} cannot hold")
    mine = {"tokenizer": tokenizer, "n_vocab": int(n_vocab), "eot_id": int(eot_id)}
    fields = _json_fields(path, fields) | mine  # refused before a file is opened
    return _write_atomically(path, ids, dtype, n_vocab, layout, fields)


def _json_fields(path: Path, fields: dict[str, Any]) -> dict[str, Any]:
    """The caller's sidecar fields as JSON (a numpy int becomes an int)."""
    taken = sorted(fields.keys() & WRITTEN_FIELDS)
    if taken:
        raise TypeError(f"{str(path)!r}: write_tokens sets {taken} itself; nothing written")
    fields = {k: v.item() if isinstance(v, np.generic) else v for k, v in fields.items()}
    try:
        return json.loads(json.dumps(fields, allow_nan=False))
    except (TypeError, ValueError) as error:
        why = f"a sidecar field is not JSON ({error}); nothing written"
        raise TypeError(f"{str(path)!r}: {why}") from None


def _write_atomically(
    path: Path, ids: Any, dtype: np.dtype, n_vocab: int, layout: str, fields: dict
) -> dict[str, Any]:
    """Write new files, then rename them over the old ones once the old
    sidecar is deleted, so no sidecar ever describes another file."""
    side = sidecar_path(path)
    tag = f"tmp.{os.getpid()}.{secrets.token_hex(4)}"  # .train.npy.tmp.<pid>.<hex>
    short = os.fsencode(path.name)[:200].decode("utf-8", "ignore")  # a name holds 255 bytes at most
    tmp = path.with_name(f".{short}.{tag}")
    side_tmp = path.with_name(f".{short}.json.{tag}")
    try:
        with open(tmp, "x+b") as f:  # "x" never writes through a link planted there
            meta = _write_ids(f, path, ids, dtype, n_vocab, layout)
        meta |= fields
        with open(side_tmp, "xb") as f:
            f.write((json.dumps(meta, sort_keys=True, indent=2) + "\n").encode())
            f.flush()  # fsync syncs what the OS holds, not Python's buffer
            os.fsync(f.fileno())
        side.unlink(missing_ok=True)
        os.replace(tmp, path)
        os.replace(side_tmp, side)
        if os.name != "nt":  # sync the folder, so the renames survive a power cut
            folder = os.open(path.parent, os.O_RDONLY)
            try:
                os.fsync(folder)
            finally:
                os.close(folder)
    except OSError as error:  # name the file being written, not a temporary one
        if error.filename in (None, str(tmp), str(side_tmp)):
            missing = f"the folder {str(path.parent)!r} does not exist"
            why = f"{error.strerror} while writing" if path.parent.exists() else missing
            raise OSError(error.errno, why, str(path)) from error
        raise
    finally:
        tmp.unlink(missing_ok=True)
        side_tmp.unlink(missing_ok=True)
    return meta


def _write_ids(
    f: BinaryIO, path: Path, ids: Any, dtype: np.dtype, n_vocab: int, layout: str
) -> dict[str, Any]:
    """Stream ids into f after a header, written again once they are counted.
    Return what the sidecar says of the file, which open_tokens compares."""
    placeholder = HEADERS[layout](dtype, (0,))  # rewritten once the ids are counted
    one_array = isinstance(ids, (list, tuple, range)) or hasattr(ids, "__array__")
    if isinstance(ids, (str, bytes)) or not isinstance(ids, Iterable):
        raise TypeError(f"{str(path)!r}: ids are an array of ints, or an iterable of them")
    chunks = [ids] if one_array else ids
    most_dims = 2 if one_array and layout == "npy" else 1  # only a .npy keeps rows
    f.write(placeholder)
    count = 0
    top = 0
    shape = (0,)
    for chunk in chunks:
        tokens, most = _checked_ids(path, chunk, dtype, n_vocab, most_dims)
        f.write(memoryview(tokens.reshape(-1)).cast("B"))  # the ids' bytes, any shape
        count += tokens.size
        top = max(top, most)
        shape = tokens.shape if one_array else (count,)
    if count == 0:
        raise ValueError(f"{str(path)!r}: no token ids to write; nothing written")
    f.seek(0)
    f.write(HEADERS[layout](dtype, shape))  # the placeholder's length: HEADERS' rule
    f.flush()
    os.fsync(f.fileno())
    size = os.fstat(f.fileno()).st_size
    f.seek(0)
    sha256 = hashlib.file_digest(f, "sha256").hexdigest()
    f.seek(0)
    probe = _probe(f, f.read(PROBE_BYTES), size)
    about = {"format": "npy-tokens", "format_version": FORMAT_VERSION, "file": path.name}
    about |= {"layout": layout, "dtype": dtype.name, "shape": list(shape), "n_tokens": count}
    return about | {"file_size": size, "sha256": sha256, "probe_sha256": probe, "max_token_id": top}


def _checked_ids(
    path: Path, chunk: Any, dtype: np.dtype, n_vocab: int, most_dims: int
) -> tuple[np.ndarray, int]:
    """chunk as C-ordered ids of dtype, and its largest id, once each id is
    checked to be below n_vocab: astype would wrap 70000 to 4464."""
    try:
        ids = np.asarray(chunk)
    except ValueError:  # a list of arrays of different lengths
        raise ValueError(
            f"{str(path)!r}: ragged ids; a list of arrays is written as rows, which need one "
            "length; iter(arrays) is written as one stream, whose windows cross them; nothing "
            "written"
        ) from None
    except TypeError as error:  # torch's bfloat16, which numpy lacks; a CUDA tensor
        raise TypeError(
            f"{str(path)!r}: ids cannot be read as a numpy array ({error}): pass integer "
            "ids as a numpy array or a CPU tensor"
        ) from None
    if not 1 <= ids.ndim <= most_dims or (ids.size and ids.dtype.kind not in "iu"):
        valid = "1-D or 2-D (.npy)" if most_dims == 2 else "1-D"
        raise TypeError(f"{str(path)!r}: ids must be {valid} integers, not {ids.dtype} {ids.shape}")
    low, top = (int(ids.min()), int(ids.max())) if ids.size else (0, 0)
    if low < 0 or top >= n_vocab:
        bad = low if low < 0 else top
        raise ValueError(
            f"{str(path)!r}: token id {bad} is outside 0 to {n_vocab - 1} (n_vocab={n_vocab})"
        )
    return np.ascontiguousarray(ids, dtype=dtype), top


def _npy_header(dtype: np.dtype, shape: tuple[int, ...]) -> bytes:
    """numpy's .npy header: 128 bytes for the shape of any token array."""
    header = io.BytesIO()
    fields = {"descr": dtype.str, "fortran_order": False, "shape": shape}
    np.lib.format.write_array_header_1_0(header, fields)
    return header.getvalue()


def _llmc_header(dtype: np.dtype, shape: tuple[int, ...]) -> bytes:
    """llm.c's shard header, as _layout reads it: magic, version, count."""
    magic = next(m for m, d in LLMC_DTYPES.items() if d == dtype)
    n_tokens = shape[0]
    if n_tokens >= 2**31:  # the count is an int32
        raise ValueError(
            f"an llm.c shard holds at most {2**31 - 1:,} tokens, got {n_tokens:,}; "
            "write it as several shards"
        )
    words = np.array([magic, LLMC_VERSIONS[magic], n_tokens], dtype="<i4")
    return words.tobytes().ljust(LLMC_HEADER_BYTES, b"\0")


# Each layout's header, one length for any shape: _write_ids writes it twice.
HEADERS = {"npy": _npy_header, "bin": lambda dtype, shape: b"", "llmc": _llmc_header}


# ---- The open-file budget (optional) ----
# An appendix: the rest of the file works without it. Each mapped file holds
# a file descriptor, and a DataLoader worker needs a few for each batch.
# Under a low limit (ulimit -n) a worker loses a batch and the loader hangs;
# this part keeps maps under the limit, or raises at once. To cut it, delete
# it and `import errno`, set self._max_maps = 1024 in _windows, and delete
# its calls in _memmap, EpochLoader.__iter__ and make_dataloaders.

MAX_OPEN_FILES = 1024  # the most files one process keeps mapped
# Free descriptors a DataLoader needs: 16, and 4 for each batch a worker has
# in flight (x and y, twice). 2 workers 2 batches ahead, 300 shards: hung with 20 free.
LOADER_DESCRIPTORS = 16
BATCH_DESCRIPTORS = 4
# CUDA opens its device files as it starts: on a one-GPU machine it failed
# with 40 allowed. With fewer than 64 free, a failure is blamed on the limit.
CUDA_DESCRIPTORS = 64


def _maps_this_process_may_keep() -> int:
    """Half the descriptors free after the DataLoader's, at most MAX_OPEN_FILES.
    A worker with fewer than LOADER_DESCRIPTORS free raises (it would hang)."""
    from torch.utils.data import get_worker_info

    limit, in_use = _descriptors()
    if limit is None:
        return MAX_OPEN_FILES
    free = limit - in_use
    if get_worker_info() is not None and free < LOADER_DESCRIPTORS:
        fix = _limit_fix(LOADER_DESCRIPTORS, " or open fewer files after make_dataloaders")
        raise TokenFileError(
            f"a DataLoader worker has {free} descriptors free, "
            f"fewer than {LOADER_DESCRIPTORS}; {fix}"
        )
    return max(1, min(MAX_OPEN_FILES, (free - LOADER_DESCRIPTORS) // 2))


def _check_loader(num_workers: int, prefetch_factor: int, pin: bool) -> None:
    """Raise now, naming the fix, where workers or pinning would fail later."""
    limit, in_use = _descriptors() if num_workers else (None, 0)
    in_flight = num_workers * prefetch_factor  # batches workers fetch ahead
    needed = LOADER_DESCRIPTORS + BATCH_DESCRIPTORS * in_flight
    if limit is not None and limit - in_use < needed:
        fix = _limit_fix(needed, " or use num_workers=0")
        raise ValueError(f"{num_workers} workers need {needed} free descriptors; {fix}")
    if pin:
        import torch

        try:
            torch.empty(1).pin_memory()
        except RuntimeError as error:  # torch.AcceleratorError is one
            first = str(error).strip().partition("\n")[0]
            failed = f"pinning memory starts CUDA, which failed ({first})"
            limit, in_use = _descriptors()
            if limit is None or limit - in_use >= CUDA_DESCRIPTORS:
                raise RuntimeError(f"{failed}: fix CUDA, or pass pin_memory=False") from error
            fix = _limit_fix(CUDA_DESCRIPTORS, " or pass pin_memory=False")
            raise RuntimeError(f"{failed}; {fix}") from error


def _descriptors() -> tuple[int | None, int]:
    """The open-file limit (None if none), and the descriptors in use."""
    try:
        import resource  # Unix only
    except ImportError:
        return None, 0
    limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    limit = None if limit == resource.RLIM_INFINITY else limit
    try:
        return limit, len(os.listdir("/dev/fd"))  # Linux and macOS
    except OSError:  # listing them takes a descriptor, and none is left
        return limit, limit or 0


def _limit_fix(needed: int, or_else: str) -> str:
    """Advice: the descriptors in use, the limit, and a limit to raise it to."""
    limit, in_use = _descriptors()
    enough = max(4096, 2 * (in_use + needed))  # twice what is needed, 4096 at least
    fix = f"raise it (ulimit -n {enough}){or_else}"
    return f"{in_use} descriptors in use, the limit is {limit}: {fix}"
