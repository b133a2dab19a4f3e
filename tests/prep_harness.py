"""Run prepare_tokens.main with one fault injected from outside the module (tests/test_faults.py runs this).

    python tests/prep_harness.py --kill-each chunk:3=OUT ... -- ARGS  # one forked child per point, in turn
    python tests/prep_harness.py --file-size-limit 600 -- ARGS
    python tests/prep_harness.py --concurrent 2 -- ARGS               # forked children, all at once

ARGS are prepare_tokens.py's own arguments. prepare_tokens has no test hooks: this script replaces
one of its functions with a wrapper before calling main(). The modes that fork import everything
once and fork afterwards, so a test pays for one interpreter start, not one per run.

A kill point STAGE:K sends SIGKILL to the process when the K-th call (counted from 1) of a function
is about to run, so nothing after that point happens and no cleanup code runs:
    chunk    a tokenized chunk handed to write_tokens (prep_outputs.DocumentCount.passing yields
             each), just before its bytes are written: K = k + 1 dies with k chunks in a temp file
    replace  os.replace (counted from the first token file on): write_tokens' renames in the
             staging folder (a token file, then its sidecar), then the swap's into the output folder
    sidecar  os.replace of a sidecar from the staging folder into the output folder: its token
             file is in place already
    split    prep_outputs.write_tokens, the start of a token file (each shard's too)

--file-size-limit BYTES sets RLIMIT_FSIZE when the first token file starts (so datasets' own cache
files are not affected) and ignores SIGXFSZ, so a write past the limit raises OSError(EFBIG).
The forking modes print one JSON line: each child's exit status (negative: killed by that signal).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python_files"))
import prep_outputs  # noqa: E402 (imported after the sys.path line above)
import prepare_tokens as pt  # noqa: E402 (imported after the sys.path line above)


def _kill_on_call(owner: object, name: str, k: int, counted=lambda *args: True) -> None:
    """Kill the process at the K-th call of owner.name whose arguments counted() accepts."""
    original = getattr(owner, name)
    calls = 0

    def wrapper(*args, **kwargs):
        nonlocal calls
        calls += counted(*args)
        if calls == k:
            os.kill(os.getpid(), signal.SIGKILL)
        return original(*args, **kwargs)

    setattr(owner, name, wrapper)


def _kill_on_chunk(k: int) -> None:
    """Kill the process when the K-th chunk is about to go to write_tokens."""
    original = prep_outputs.DocumentCount.passing
    chunks = 0

    def passing(self, pieces):
        nonlocal chunks
        for ids in original(self, pieces):
            chunks += 1
            if chunks == k:
                os.kill(os.getpid(), signal.SIGKILL)
            yield ids

    prep_outputs.DocumentCount.passing = passing


def _moves_a_sidecar_in(src, dst, *args) -> bool:
    """An os.replace of a sidecar out of a prep run's staging folder (not one inside it)."""
    staging = prep_outputs.STAGING_NAME.fullmatch
    leaves = staging(Path(src).parent.name) and not staging(Path(dst).parent.name)
    return bool(leaves) and str(dst).endswith(".json")


def _when_the_first_token_file_starts(action) -> None:
    """Run action() once, when write_tokens is first called: after datasets wrote its cache."""
    original = prep_outputs.write_tokens
    done = False

    def wrapper(*args, **kwargs):
        nonlocal done
        if not done:
            done = True
            action()
        return original(*args, **kwargs)

    prep_outputs.write_tokens = wrapper


def _limit_file_size(limit: int) -> None:
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the default action kills the process
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))


STAGES = ("chunk", "replace", "sidecar", "split")


def _install_kill(point: str) -> None:
    stage, k = point.split(":")
    if stage == "chunk":
        _kill_on_chunk(int(k))
    elif stage == "replace":  # datasets may rename its own cache files first: count ours only
        _when_the_first_token_file_starts(lambda: _kill_on_call(os, "replace", int(k)))
    elif stage == "sidecar":
        _kill_on_call(os, "replace", int(k), counted=_moves_a_sidecar_in)
    else:
        _kill_on_call(prep_outputs, "write_tokens", int(k))


def _fork(run) -> int:
    """Run run() in a forked child; the parent gets the child's pid."""
    pid = os.fork()
    if pid == 0:
        try:
            code = run()
        except SystemExit as exit:
            code = exit.code if isinstance(exit.code, int) else 1
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)  # never run the parent's cleanup a second time
    return pid


def _status(pid: int) -> int:
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--kill-each",
        nargs="+",
        metavar="STAGE:K=OUT",
        help="a forked run per point, into OUT; STAGE is one of " + ", ".join(STAGES),
    )
    parser.add_argument(
        "--file-size-limit", type=int, help="RLIMIT_FSIZE in bytes for the token files"
    )
    parser.add_argument("--concurrent", type=int, help="this many forked runs at the same time")
    parser.add_argument(
        "prep_args", nargs=argparse.REMAINDER, help="-- then prepare_tokens.py arguments"
    )
    args = parser.parse_args()
    prep_args = args.prep_args[1:] if args.prep_args[:1] == ["--"] else args.prep_args
    if args.kill_each:
        statuses = {}
        for spec in args.kill_each:
            point, out = spec.split("=", 1)

            def run(point=point, out=out):
                _install_kill(point)
                return pt.main([*prep_args, "--out", out])

            statuses[spec] = _status(_fork(run))
        print(json.dumps(statuses), flush=True)
        return 0
    if args.concurrent:
        pids = [_fork(lambda: pt.main(prep_args)) for _ in range(args.concurrent)]
        print(json.dumps([_status(pid) for pid in pids]), flush=True)
        return 0
    if args.file_size_limit is not None:
        _when_the_first_token_file_starts(lambda: _limit_file_size(args.file_size_limit))
    return pt.main(prep_args)


if __name__ == "__main__":
    sys.exit(main())
