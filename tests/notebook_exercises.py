"""Each notebook's exercises, answered in the notebook's own kernel (a pytest plugin: pytest.ini).

A notebook ends with numbered **Exercises**. ANSWERS holds a reference answer for each: `code`, what
a learner would write, and `sees`, a regular expression for what the exercise says they will see,
searched for in what the code prints (its asserts check the values behind it). The key is the
notebook's name without its number ("build_the_dataset" for 03_build_the_dataset.ipynb: renumbering
a notebook changes nothing here) and the exercise's number.

How they run: nbval runs a notebook's cells in one kernel, as "notebooks/NAME.ipynb::Cell N"; this
plugin adds an item "notebooks/NAME.ipynb::Exercise K" after the last cell for each answer, which
runs in that kernel, after every cell, in a copy of the notebook's namespace (one answer cannot
change the names the next one sees). So the notebook runs once for its cells and its answers. An
answer selected without all of its notebook's cells (by its id, -k or --lf) first runs them in the
kernel itself, unchecked. Each kernel run has nbval's cell time limit; a kernel that dies fails the
answer at once.

To add a notebook's exercises: add an Answer under ("its_name", k) for each exercise k, and take
the notebook out of PENDING. tests/test_exercises.py fails while an exercise has no answer or an
answer no exercise. An answer that differs on a GPU branches on torch.cuda.is_available() and
accepts either outcome in `sees`.
"""

from __future__ import annotations

import json
import re
import tempfile
import time
from pathlib import Path
from queue import Empty
from typing import NamedTuple

import pytest

PENDING: set[str] = set()  # notebooks whose exercises have no answers here yet


class Answer(NamedTuple):
    code: str  # run after the notebook's own cells, in a copy of their namespace
    sees: str  # a regular expression that what the code prints must contain (re.search)


ANSWERS = {
    ("tokenize_tinystories", 1): Answer(
        """
ids = enc.encode_ordinary("Ça va? 🐉")
pieces = [enc.decode_single_token_bytes(i) for i in ids]
whole = [enc.decode([i]) for i in ids if "\\ufffd" not in enc.decode([i])]
parts = [p for i, p in zip(ids, pieces) if "\\ufffd" in enc.decode([i])]
assert b"".join(pieces).decode("utf-8") == "Ça va? 🐉" and len(whole) + len(parts) == len(ids)
print(f"{len(ids)} ids: {len(whole)} whole pieces of text {whole}, {len(parts)} parts of characters")
print(parts)
""",
        r"^8 ids: 3 whole pieces of text \['a', ' va', '\?'\], 5 parts of characters\n"
        r"\[b'\\xc3', b'\\x87', b' \\xf0\\x9f', b'\\x90', b'\\x89'\]$",
    ),
    ("tokenize_tinystories", 2): Answer(
        """
chunks = pt.tokenize_documents(stories, enc, num_threads=2, chunk_docs=1)
one_each = np.concatenate(list(chunks))
same = np.array_equal(one_each, one_thread)
assert same
print(f"chunk_docs=1, 2 threads: {len(one_each):,} ids, the same stream as section 4: {same}")
""",
        r"^chunk_docs=1, 2 threads: 342,147 ids, the same stream as section 4: True$",
    ),
    ("tokenize_tinystories", 3): Answer(
        """
rest10, val10 = carve_validation(10, val_fraction=0.01)
assert len(val10) == 1 and round(10 * 0.01) == 0 and len(rest10) == 9
print(f"{len(val10)} validation document, row {val10.tolist()}:", end=" ")
print(f"round(10 * 0.01) is {round(10 * 0.01)}, and max(1, ...) keeps at least one")
""",
        r"^1 validation document, row \[7\]: round\(10 \* 0\.01\) is 0, and max\(1, \.\.\.\)",
    ),
    ("write_token_files", 1): Answer(
        """
(appended, _) = pt.prepare(out=DATA / "appended", eot_placement="append", progress=False)
ids = nd.open_tokens(appended.path)
assert ids[0] != enc.eot_token and ids[-1] == enc.eot_token
assert appended.meta["eot_placement"] == "append" and len(ids) == train.meta["n_tokens"]
print(f"append: first id {ids[0]}, last id {ids[-1]} (the end-of-text token)")
""",
        r"^append: first id 7454, last id 50256 \(the end-of-text token\)$",
    ),
    ("write_token_files", 2): Answer(
        """
mine = DATA / "mine.npy"
np.save(mine, np.arange(10, dtype=np.int64))
try:
    nd.open_tokens(mine)
except nd.TokenFileError as e:
    print(e)
ids = np.arange(10, dtype=np.int64)  # write_tokens checks every id, then narrows them to uint16
nd.write_tokens(mine, ids, **GPT2)
print("as uint16:", nd.open_tokens(mine).tolist())
""",
        r"^'data/notebook02/mine\.npy': dtype '<i8' is not uint16 or uint32, little-endian: "
        r"write it with write_tokens \(which picks uint16 or uint32\), or save "
        r"ids\.astype\(np\.uint16\) when all are below 65,536\n"
        r"as uint16: \[0, 1, 2, 3, 4, 5, 6, 7, 8, 9\]$",
    ),
    ("write_token_files", 3): Answer(
        """
big = DATA / "copy" / "train.npy"
size = big.stat().st_size
assert size > 2 * nd.PROBE_BYTES
with open(big, "r+b") as f:
    f.seek(size // 2)  # outside the first and the last 64 KiB
    byte = f.read(1)[0]
    f.seek(size // 2)
    f.write(bytes([byte ^ 0xFF]))
print("verify=False opens it:", len(nd.open_tokens(big)), "tokens")
try:
    nd.open_tokens(big, verify=True)
except nd.TokenFileError as e:
    print("verify=True:", e)
""",
        r"^verify=False opens it: 342147 tokens\n"
        r"verify=True: 'data/notebook02/copy/train\.npy' is damaged: its sha256 is not its sidecar's",
    ),
    ("build_the_dataset", 1): Answer(
        """
ds10 = NpyTokensDataset(path, seq_len=10)
x, y = ds10[4]
assert len(ds10) == (100 - 1) // 10 and x.tolist() == list(range(40, 50))
print(len(ds10), x.tolist())
""",
        r"^9 \[40, 41, 42, 43, 44, 45, 46, 47, 48, 49\]$",
    ),
    ("build_the_dataset", 2): Answer(
        """
rows = DATA / "rows_4x25.npy"
ids = np.arange(100).reshape(4, 25)
nd.write_tokens(rows, ids, n_vocab=50257, tokenizer="arange", eot_id=50256)
rows_ds = NpyTokensDataset(rows, seq_len=12)
files, firsts = rows_ds.locate(0, np.arange(len(rows_ds)))
assert len(rows_ds) == 4 * ((25 - 1) // 12)  # two windows a row
assert (firsts % 25 + 12 < 25).all()  # a window's last token sits in its first token's row
print(len(rows_ds), firsts.tolist())
""",
        r"^8 \[0, 12, 25, 37, 50, 62, 75, 87\]$",
    ),
    ("build_the_dataset", 3): Answer(
        """
seed = 1
shortcut = [[_splitmix64(seed + e + i) for i in range(5)] for e in (0, 1)]
hashed = [[_splitmix64(i + _splitmix64(_splitmix64(seed) + e)) for i in range(5)] for e in (0, 1)]
assert not set(hashed[0]) & set(hashed[1])
print("shortcut, epoch 1's windows 0-3 == epoch 0's 1-4:", shortcut[1][:4] == shortcut[0][1:])
print("real hash, epoch 1's windows 0-3 == epoch 0's 1-4:", hashed[1][:4] == hashed[0][1:])
""",
        r"shortcut, [^\n]*: True\nreal hash, [^\n]*: False",
    ),
    ("test_the_dataloader", 1): Answer(
        """
delays = [0.0, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02]  # seconds per batch; 20 ms: section 6
rates = [compare_workers(delay) for delay in delays]
pays = [r[2] > r[0] for r in rates]  # 2 workers faster than none
k = next(k for k in range(len(delays) + 1) if all(pays[k:]))  # they pay from delays[k] on
if k == len(delays):  # rates, not a rule: a busy machine can slow the workers at every delay
    print(f"two workers paid at none of the delays tried, up to {delays[-1] * 1000:g} ms")
elif k == 0:
    print("two workers paid at every one of the delays tried, even with no delay")
else:
    print(f"two workers pay from {delays[k] * 1000:g} ms per batch on, on this machine;", end=" ")
    print(f"at {delays[k - 1] * 1000:g} ms and below, no workers are as fast or faster")
""",
        r"^(two workers pay from [\d.]+ ms per batch on, on this machine; at [\d.]+ ms and below, "
        r"no workers are as fast or faster|two workers paid at (none|every one) of the delays tried.*)$",
    ),
    ("test_the_dataloader", 2): Answer(
        """
import warnings

with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    pinned_loader, _ = nd.make_dataloaders(train, batch_size=BATCH, pin_memory=True)
    batch = next(iter(pinned_loader))
warned = [str(w.message) for w in caught if "pin_memory" in str(w.message)]
if torch.cuda.is_available():  # the GPU half: pin_memory=False gives unpinned batches
    plain_loader, _ = nd.make_dataloaders(train, batch_size=BATCH, pin_memory=False)
    plain = next(iter(plain_loader))
    assert batch[0].is_pinned() and not plain[0].is_pinned()
    assert torch.equal(to_device(plain, DEVICE)[0].cpu(), plain[0])
else:
    assert warned and not batch[0].is_pinned()
print(warned[0] if warned else "no warning", "| pinned:", batch[0].is_pinned())
""",
        r"(pin_memory.* no accelerator .*\| pinned: False|^no warning \| pinned: True)",
    ),
    ("test_the_dataloader", 3): Answer(
        """
_, val_loader_2 = nd.make_dataloaders(train, val, batch_size=BATCH, num_workers=2)
val_loader_2.dataloader.timeout = 60  # a worker that hangs fails the answer
firsts_2 = torch.cat([x[:, 0] for x, _ in val_loader_2])
assert torch.equal(firsts_2, expected)
print(f"2 workers: {len(firsts_2)} validation windows, in order: {torch.equal(firsts_2, expected)}")
""",
        r"^2 workers: 137 validation windows, in order: True$",
    ),
    ("scaling_out", 1): Answer(
        """
three_ranks = run_example("--steps", "2", ranks=3)
line = next(line for line in three_ranks if "disjoint" in line)
shares = [nd.EpochSampler(single, batch_size=8, world_size=3, rank=r).order(0) for r in range(3)]
dropped = len(single) - len(np.unique(np.concatenate(shares)))
assert dropped == len(single) % 3 == 1 and f"dropped: {dropped} " in line
print(line)
""",
        r"^3 rank\(s\), 1,336 windows per epoch: each rank 445, disjoint: True, dropped: 1 "
        r"\(n % world_size = 1\)$",
    ),
    ("scaling_out", 2): Answer(
        """
two = run_example("--steps", "2", "--resume", state_file, ranks=2)
at_5 = [line for line in two if " step 5 " in line]
predicted = []
for r in range(2):
    rest = nd.EpochSampler(single, batch_size=8, world_size=2, rank=r).order(0, start=32)
    x, _ = single[0, rest[:8]]  # rank r's first batch of 8 after the saved position
    predicted.append(f"rank {r}/2 step 5 epoch 0 checksum {int(x.sum())}")
assert at_5 == predicted
print("\\n".join(at_5))
""",
        r"^rank 0/2 step 5 epoch 0 checksum \d+\nrank 1/2 step 5 epoch 0 checksum \d+$",
    ),
    ("scaling_out", 3): Answer(
        """
(half,) = pt.prepare(
    out=DATA / "shards_50k", splits=["train"], shard_tokens=50_000, progress=False
)
sizes = [nd.read_sidecar(path)["n_tokens"] for path in half.shards]
predicted = sum((n - 1) // SEQ_LEN for n in sizes)
smaller = nd.NpyTokensDataset(half.path, SEQ_LEN)
k = (sizes[0] - 1) // SEQ_LEN  # shard 0's windows
assert len(smaller) == predicted
assert torch.equal(smaller[0, np.arange(k)][0], single[0, np.arange(k)][0])
print(f"{len(sizes)} shards: {predicted:,} windows predicted, {len(smaller):,} found;", end=" ")
print(f"shard 0's {k} windows are the one file's first {k}")
""",
        r"^7 shards: 1,334 windows predicted, 1,334 found; shard 0's 195 windows are the one file's "
        r"first 195$",
    ),
    ("appendix_hardening", 1): Answer(
        """
fortran = DATA / "fortran.npy"
np.save(fortran, np.asfortranarray(np.arange(20, dtype=np.uint16).reshape(4, 5)))
print(refusal(lambda: nd.open_tokens(fortran)))
""",
        r"^TokenFileError: 'fortran\.npy' holds shape \(4, 5\) in Fortran order: token ids are 1-D or "
        r"2-D, in C order, each dimension at least 1$",
    ),
    ("appendix_hardening", 2): Answer(
        """
live = nd.NpyTokensDataset(path, 8)
x, _ = live[0]
st = os.stat(path)
np.save(path, np.arange(1000, 1500, dtype=np.uint16))  # the same size, written in place
os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
served = live[1][0][:3].tolist()
assert x[:3].tolist() == [0, 1, 2] and os.stat(path).st_ino == st.st_ino
print("the running dataset serves window 1 as", served, "and says nothing")
print("opened again:", refusal(lambda: nd.NpyTokensDataset(path, 8)))
""",
        r"serves window 1 as \[1008, 1009, 1010\] and says nothing\n"
        r"opened again: TokenFileError: 'live\.npy' was replaced or damaged since its sidecar: "
        r"probe_sha256 is '[0-9a-f]{64}' there, '[0-9a-f]{64}' here$",
    ),
    ("appendix_hardening", 3): Answer(
        """
pt.prepare(out=DATA / "sharded", shard_tokens=100_000, progress=False)
names = sorted(str(p) for p in (DATA / "sharded").glob("train_[0-9][0-9][0-9][0-9][0-9][0-9].npy"))
assert len(names) == 4  # 342,147 tokens: three shards of 100,000 and the rest
status = pt.main(["--verify", *names[:1], *names[2:]])
alone = [len(nd.open_tokens(name)) for name in names]
print(f"exit status {status}; each shard alone opens, with {alone} tokens")
""",
        r"^data/notebooks/appendix/sharded/train_000000\.npy: shard 0 of 4 written together, but "
        r"shards 1 of that set are not given\n"
        r".*/train_000002\.npy: shard 2 of 4 .*\n.*/train_000003\.npy: shard 3 of 4 .*\n"
        r"exit status 1; each shard alone opens, with \[100000, 100000, 100000, 42147\] tokens$",
    ),
    # Notebook 06's answers start from the checkpoint its section 3 saved at step 270 (rebuild()),
    # as its exercises say, instead of training again; each writes checkpoints of its own only.
    ("train_a_small_model", 1): Answer(
        """
again = ROOT / "data" / "checkpoints" / "06_again.pt"
first = run(*rebuild(), save_at=275, checkpoint=again)
state = torch.load(again, weights_only=True)["sampler"]
second = run(*rebuild(again))
worst = max(abs(a - b) for a, b in zip(second["loss"], main["loss"][275:]))
same = second["loss"] == main["loss"][275:] if DEVICE.type == "cpu" else worst < GPU_TOLERANCE
assert len(second["loss"]) == STEPS - 275 and (state["epoch"], state["position"]) == (1, 270)
print(f"the checkpoint of step 275: epoch {state['epoch']}, position {state['position']};", end=" ")
print(f"steps 276-300 repeat the uninterrupted run: {same}")
""",
        r"^the checkpoint of step 275: epoch 1, position 270; steps 276-300 repeat the "
        r"uninterrupted run: True$",
    ),
    ("train_a_small_model", 2): Answer(
        """
model, opt, loader, step = rebuild()
opt = torch.optim.AdamW(model.parameters(), lr=LR)  # a fresh optimizer, the right batches
other = run(model, opt, loader, step)
def gap(losses):
    return sum(abs(a - b) for a, b in zip(losses, reference)) / len(reference)
parted = [step + i for i, (a, b) in enumerate(zip(other["loss"], reference), 1) if a != b]
assert parted == list(range(272, STEPS + 1))  # step 271's loss comes before the first update
assert gap(other["loss"]) < gap(fresh["loss"])  # 0.04 against 0.23 nats when it was written
print(f"a fresh optimizer: other losses from step {parted[0]} on,", end=" ")
print(f"{gap(other['loss']):.2f} nats a step away from the run's; a fresh loader:", end=" ")
print(f"{gap(fresh['loss']):.2f}. The fresh optimizer parts by less")
""",
        r"^a fresh optimizer: other losses from step 272 on, \d+\.\d\d nats a step away from "
        r"the run's; a fresh loader: \d+\.\d\d\. The fresh optimizer parts by less$",
    ),
    ("train_a_small_model", 3): Answer(
        """
windows = nd.NpyTokensDataset(
    TOKENS / "train.npy", SEQ_LEN, mode="random", num_samples=EPOCH_WINDOWS, vocab_size=N_VOCAB
)
loader, _ = nd.make_dataloaders(windows, batch_size=BATCH, seed=0, num_workers=2)
loader.dataloader.timeout = 60  # a worker that hangs fails the answer
model, opt = make_model(DEVICE, N_VOCAB, SEQ_LEN)
with_workers = run(model, opt, loader, load_checkpoint(CHECKPOINT, model, opt, loader))
worst = max(abs(a - b) for a, b in zip(with_workers["loss"], reference))
same = with_workers["loss"] == reference if DEVICE.type == "cpu" else worst < GPU_TOLERANCE
def share(log):  # the wait over the whole step, without each pass's first step
    later = [s for s in log["steps"] if s.batch_in_pass > 1]
    return sum(s.wait for s in later) / sum(s.seconds for s in later)
more = "more" if share(with_workers) > share(main) else "less"
print(f"with 2 workers, the resumed losses repeat the uninterrupted: {same}")
print(f"data wait: {share(with_workers):.2%} of a step with 2 workers, {share(main):.2%}", end=" ")
print(f"without: {more} with workers, on this machine")
""",
        r"^with 2 workers, the resumed losses repeat the uninterrupted: True\n"
        r"data wait: [\d.]+% of a step with 2 workers, [\d.]+% without: (more|less) with workers, "
        r"on this machine$",
    ),
    ("train_a_small_model", 4): Answer(
        """
model, opt, loader, step = rebuild(END)
longer = run(model, opt, loader, step, steps=390, validate=True)
(last, loss) = longer["val"][-1]
assert step == STEPS and last == 390 and loss < val_losses[-1]
print(f"{last} steps: validation loss {loss:.2f}, perplexity {math.exp(loss):.0f}", end=" ")
print(f"(300 steps: {val_losses[-1]:.2f}, perplexity {math.exp(val_losses[-1]):.0f})")
torch.manual_seed(0)
sampled_390 = generate(model, prompt_ids, NEW_TOKENS, top_k=40, temperature=0.8)
print("greedy: ", repr(enc.decode(generate(model, prompt_ids, NEW_TOKENS)[1:])))
print("sampled:", repr(enc.decode(sampled_390[1:])))
""",
        r"^390 steps: validation loss \d\.\d\d, perplexity \d+ \(300 steps: \d\.\d\d, "
        r"perplexity \d+\)\ngreedy:  'Once upon a time.*'\nsampled: 'Once upon a time.*'$",
    ),
}


def key_of(notebook: Path) -> str:
    """ANSWERS' name of a notebook: 03_build_the_dataset.ipynb -> build_the_dataset."""
    return notebook.stem.split("_", 1)[1]


# Run in the notebook's kernel, in a namespace of their own: `job` holds the code and where the
# report goes, `user` is the notebook's namespace (globals() of the kernel cell that runs them).
ANSWER_IN_KERNEL = r"""
import contextlib, io, json, traceback

printed, error = io.StringIO(), None
try:
    with contextlib.redirect_stdout(printed):
        exec(compile(job["code"], job["name"], "exec"), dict(user))
except BaseException:
    error = traceback.format_exc()
with open(job["report"], "w", encoding="utf-8") as f:
    json.dump({"error": error, "printed": printed.getvalue()}, f)
"""
CELLS_IN_KERNEL = r"""
import contextlib, io, json, traceback

error = None
try:
    with contextlib.redirect_stdout(io.StringIO()):
        for number, source in enumerate(job["cells"]):
            exec(compile(source, f"<code cell {number}>", "exec"), user)
except BaseException:
    error = traceback.format_exc()
with open(job["report"], "w", encoding="utf-8") as f:
    json.dump({"error": error}, f)
"""


class AnswerFailed(Exception):
    """An answer raised, printed what its exercise does not say, or did not finish."""


class ExerciseAnswer(pytest.Item):
    """One exercise's reference answer, run in its notebook's nbval kernel after every cell."""

    def __init__(self, *, number: int, answer: Answer, **kwargs) -> None:
        super().__init__(**kwargs)
        self.number, self.answer = number, answer

    def runtest(self) -> None:
        notebook = self.parent  # nbval's IPyNbFile: its kernel runs the cells before this item
        selected = [i for i in self.session.items if i.parent is notebook and i.name[:5] == "Cell "]
        code_cells = sum(cell.cell_type == "code" for cell in notebook.nb.cells)
        if len(selected) < code_cells and not getattr(notebook, "cells_run_for_answers", False):
            from test_notebooks import _code_cells  # the cells as Python: IPython-only lines blank

            cells = self._in_kernel(CELLS_IN_KERNEL, {"cells": _code_cells(notebook.path)})
            if cells["error"] is not None:
                raise AnswerFailed(
                    f"{notebook.name}'s cells failed before the answer:\n{cells['error']}"
                )
            notebook.cells_run_for_answers = True
        job = {"code": self.answer.code, "name": f"<exercise {self.number}>"}
        result = self._in_kernel(ANSWER_IN_KERNEL, job)
        if result["error"] is not None:
            raise AnswerFailed(f"the answer to exercise {self.number} failed:\n{result['error']}")
        if not re.search(self.answer.sees, result["printed"], flags=re.M):
            raise AnswerFailed(
                f"exercise {self.number} should print a match for {self.answer.sees!r}; "
                f"it printed:\n{result['printed']}"
            )

    def _in_kernel(self, code: str, job: dict) -> dict:
        """Run code in the notebook's kernel with `job` and the notebook's namespace; its report."""
        kernel, limit = self.parent.kernel, self.config.option.nbval_cell_timeout  # pytest.ini
        if not kernel.is_alive():
            raise AnswerFailed(f"the kernel of {self.parent.name} is not running")
        with tempfile.TemporaryDirectory() as folder:
            report = Path(folder) / "report.json"
            job = {**job, "report": str(report)}
            msg_id = kernel.execute_cell_input(
                f"exec({code!r}, {{'job': {job!r}, 'user': globals()}})", allow_stdin=False
            )
            deadline = time.monotonic() + limit
            while True:  # in slices, so that a kernel that dies fails the answer at once
                try:
                    kernel.await_reply(msg_id, timeout=5)
                    break
                except Empty:
                    if not kernel.is_alive():
                        raise AnswerFailed(f"exercise {self.number}: the kernel died") from None
                    if time.monotonic() > deadline:
                        kernel.interrupt()
                        raise AnswerFailed(
                            f"exercise {self.number}: not done in {limit} s"
                        ) from None
            if not report.exists():
                raise AnswerFailed(f"exercise {self.number} left no report (the kernel died?)")
            return json.loads(report.read_text(encoding="utf-8"))

    def repr_failure(self, excinfo, style=None):
        if isinstance(excinfo.value, AnswerFailed):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style)

    def reportinfo(self):
        return self.path, None, f"{self.parent.name}::{self.name}"


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector):
    """A notebook's items: nbval's, a code cell each, then an answer each, in number order."""
    report = yield
    from nbval.plugin import IPyNbFile

    if isinstance(collector, IPyNbFile) and report.passed:
        report.result.extend(
            ExerciseAnswer.from_parent(collector, name=f"Exercise {n}", number=n, answer=answer)
            for (key, n), answer in sorted(ANSWERS.items())
            if key == key_of(collector.path)
        )
    return report


# In this plugin, not in tests/conftest.py, so that it holds for `pytest notebooks` too, which
# loads no conftest of tests/. pytest.ini runs the tests on pytest-xdist workers, one a core, a
# test file to a worker (-n auto --dist loadfile): a file's module fixtures run once, a notebook's
# cells in order in one kernel.
# The notebooks share the repository's data/ folder, so they go to one worker together, one after
# another in order: notebook 02 rewrites data/tinystories_sample, which notebooks 04 to 06 read (a
# prep run that found another writing there would print "waiting for another prep run" into a
# notebook's output). The tests write their files in folders of their own. (xdist's own --dist
# loadgroup would do this with marks, but with pytest 9.2 it drops them: pytest-xdist issue 1386.)
@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist: absent with -p no:xdist
def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "loadfile":
        return None  # another --dist given: xdist's own
    from xdist.scheduler import LoadFileScheduling

    class LoadFileSharingData(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            file = nodeid.split("::", 1)[0]
            return "the notebooks: data/ of the repository" if file.endswith(".ipynb") else file

    return LoadFileSharingData(config, log)
