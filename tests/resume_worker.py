"""Resume a DataLoader over an EpochSampler from saved states in a fresh process, for tests/test_resume.py.

    python tests/resume_worker.py < jobs.json > results.json

stdin is a JSON list of jobs; each builds a new dataset and loader (build_loader), loads the job's
state (a JSON string, as a checkpoint would hold it), then either records `stop_after` batches and
the state after them (the sampler's state with the loop's own count of batches, so it is exact
with workers too), or records every batch up to the end of epoch `epochs - 1`.
"""

import json
import sys
from pathlib import Path
from typing import Any

from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python_files"))
import npy_datasets as nd  # noqa: E402 (imported after the sys.path line above)


def build_loader(job: dict[str, Any]) -> DataLoader:
    """A dataset and a DataLoader over a batching EpochSampler, from the job's settings."""
    ds = nd.NpyTokensDataset(job["paths"], job["seq_len"], **job.get("dataset", {}))
    sampler = nd.EpochSampler(ds, **job["sampler"])
    workers = job.get("num_workers", 0)
    extra = {"persistent_workers": True, "prefetch_factor": 2, "timeout": 60} if workers else {}
    return DataLoader(ds, sampler=sampler, batch_size=None, num_workers=workers, **extra)


def record(
    loader: DataLoader, epochs: int, stop_after: int | None = None
) -> tuple[list[list[list[int]]], dict]:
    """Every batch's x rows until `stop_after` batches, or until the end of epoch `epochs - 1`, and
    the state after the last batch recorded."""
    batches: list[list[list[int]]] = []
    state = loader.sampler.state_dict()
    while loader.sampler.epoch < epochs:
        for step, (x, _) in enumerate(loader, 1):
            batches.append(x.tolist())
            state = loader.sampler.state_dict(consumed=step)
            if len(batches) == stop_after:
                return batches, state
    return batches, state


def run(job: dict[str, Any]) -> dict[str, Any]:
    loader = build_loader(job)
    loader.sampler.load_state_dict(json.loads(job["state"]))
    batches, state = record(loader, job["epochs"], job.get("stop_after"))
    return {"batches": batches, "state": json.dumps(state)}


if __name__ == "__main__":
    json.dump([run(job) for job in json.load(sys.stdin)], sys.stdout)
