"""A training run that is killed and resumed, for tests/test_resume.py.

    python tests/resume_worker.py JOB_JSON

JOB_JSON (a JSON object) gives the loader's settings (build_loader), `epochs`, a `checkpoint` path,
a `log` path, and optionally `kill_at`, a global step. The run loads the checkpoint if there is
one, then for every batch appends {"step", "x"} to the log (a JSON line) and replaces the checkpoint
with {"step", "sampler": the loader's state_dict()}. Once step `kill_at` is saved it sends SIGKILL
to its process group (itself and its DataLoader workers, at once), as an out-of-memory killer or a
preempted node would: nothing runs after that, no cleanup and no exit handler.
"""

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python_files"))
import npy_datasets as nd  # noqa: E402 (imported after the sys.path line above)

WORKER_TIMEOUT = 60  # seconds a worker may take for one batch: it fails a hang, never a slow run


def build_loader(job: dict[str, Any]) -> nd.EpochLoader:
    """A dataset and an EpochLoader over an EpochSampler, from the job's settings."""
    ds = nd.NpyTokensDataset(job["paths"], job["seq_len"], **job.get("dataset", {}))
    sampler = nd.EpochSampler(ds, **job["sampler"])
    loader = nd.EpochLoader(ds, sampler, num_workers=job.get("num_workers", 0))
    loader.dataloader.timeout = WORKER_TIMEOUT if loader.dataloader.num_workers else 0
    return loader


def record(
    loader: nd.EpochLoader, epochs: int, stop_after: int | None = None
) -> tuple[list[list[list[int]]], dict]:
    """Every batch's x rows until `stop_after` batches, or until the end of epoch `epochs - 1`, and
    the state after the last batch recorded (the loop's own count: exact with workers too)."""
    batches: list[list[list[int]]] = []
    state = loader.sampler.state_dict()
    while loader.sampler.epoch < epochs:
        for step, (x, _) in enumerate(loader, 1):
            batches.append(x.tolist())
            state = loader.sampler.state_dict(consumed=step)
            if len(batches) == stop_after:
                return batches, state
    return batches, state


def train(job: dict[str, Any]) -> None:
    """Run until the end of epoch `epochs - 1`, or until killed at step `kill_at`."""
    loader = build_loader(job)
    checkpoint = Path(job["checkpoint"])
    step = 0  # the global step: batches trained since the first run began
    if checkpoint.exists():
        saved = json.loads(checkpoint.read_text())
        loader.load_state_dict(saved["sampler"])
        step = saved["step"]
    with open(job["log"], "a") as log:
        while loader.sampler.epoch < job["epochs"]:
            for x, _ in loader:
                step += 1
                log.write(json.dumps({"step": step, "x": x.tolist()}) + "\n")
                log.flush()
                state = {"step": step, "sampler": loader.state_dict()}
                temporary = checkpoint.with_name(checkpoint.name + ".tmp")
                temporary.write_text(json.dumps(state))
                os.replace(temporary, checkpoint)  # a kill leaves the old checkpoint or the new
                if step == job.get("kill_at"):  # tests run this in a process group of its own
                    os.killpg(0, signal.SIGKILL)


if __name__ == "__main__":
    train(json.loads(sys.argv[1]))
