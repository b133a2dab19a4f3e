"""Resume a ResumableDataLoader from saved states in a fresh process, for tests/test_scale.py.

    python tests/resume_worker.py < jobs.json > results.json

stdin is a JSON list of jobs; each builds a new dataset and loader (build_loader), loads the job's
state (a JSON string, as a checkpoint would hold it), then either records `stop_after` batches and
the state after them, or records every batch up to the end of epoch `epochs - 1`.
"""

import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python_files"))
import npy_datasets as nd  # noqa: E402


def build_loader(job: dict[str, Any]) -> nd.ResumableDataLoader:
    """A dataset and a ResumableDataLoader over an EpochSampler, from the job's settings."""
    ds = nd.NpyTokensDataset(job["paths"], job["seq_len"], **job.get("dataset", {}))
    sampler = nd.EpochSampler(ds, **job["sampler"])
    workers = job.get("num_workers", 0)
    extra = {"persistent_workers": True, "prefetch_factor": 2} if workers else {}
    return nd.ResumableDataLoader(ds, batch_sampler=sampler, num_workers=workers, collate_fn=nd.collate_windows, **extra)


def record(loader: nd.ResumableDataLoader, epochs: int, stop_after: int | None = None) -> list[list[list[int]]]:
    """Every batch's x rows until `stop_after` batches, or until the end of epoch `epochs - 1`."""
    batches: list[list[list[int]]] = []
    while loader.batch_sampler.epoch < epochs:
        for x, _ in loader:
            batches.append(x.tolist())
            if len(batches) == stop_after:
                return batches
    return batches


def run(job: dict[str, Any]) -> dict[str, Any]:
    loader = build_loader(job)
    loader.load_state_dict(json.loads(job["state"]))
    batches = record(loader, job["epochs"], job.get("stop_after"))
    return {"batches": batches, "state": json.dumps(loader.state_dict())}


if __name__ == "__main__":
    json.dump([run(job) for job in json.load(sys.stdin)], sys.stdout)
