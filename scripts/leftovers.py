"""Fail if a process that the test run started is still running: the suite leaves nothing behind.

scripts/test.sh exports RECSVC_TEST_RUN=<token> before pytest, and every process the suite starts
inherits it. A process counts as the run's if its environment holds that token, or, with ``--since``
(when the run began), if it started after that, is a child of init (PPID 1) and works inside the
checkout or a pytest temporary directory: a child started with a scrubbed environment. An orphan that
was there before the run (a developer's own server in the checkout) is never the run's. Processes that are already exiting get a grace
period; whatever remains is listed (pid, parent, command line), killed so that it holds no port or file,
and the script exits 1.

    .venv/bin/python scripts/leftovers.py TOKEN [--since EPOCH_SECONDS] [--grace SECONDS]
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent


def _is_ours(proc: psutil.Process, token: str, places: tuple[Path, ...], since: float | None) -> bool:
    try:
        if proc.environ().get("RECSVC_TEST_RUN") == token:
            return True
        if since is None or proc.create_time() < since or proc.ppid() != 1:
            return False
        cwd = Path(proc.cwd())
        return any(cwd == p or p in cwd.parents for p in places)
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return False


def leftovers(token: str, since: float | None = None) -> list[psutil.Process]:
    me = psutil.Process()
    places = (ROOT, Path(tempfile.gettempdir()) / f"pytest-of-{me.username()}")
    exempt = {me.pid, *(p.pid for p in me.parents())}  # this check and the test command running it
    return [p for p in psutil.process_iter() if p.pid not in exempt and _is_ours(p, token, places, since)]


def describe(proc: psutil.Process) -> str:
    try:
        return f"pid {proc.pid} (parent {proc.ppid()}): {' '.join(proc.cmdline())[:200]}"
    except psutil.Error:
        return f"pid {proc.pid}: exited while being listed"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("token", help="the RECSVC_TEST_RUN value that the test run exported")
    parser.add_argument(
        "--since", type=float, default=None, help="when the run began (seconds since the epoch): see above"
    )
    parser.add_argument("--grace", type=float, default=15.0, help="seconds to let exiting processes go (default 15)")
    args = parser.parse_args(argv)
    deadline = time.monotonic() + args.grace
    while (left := leftovers(args.token, args.since)) and time.monotonic() < deadline:
        time.sleep(0.5)
    if not left:
        print("[leftovers] the test run left no process running")
        return 0
    print(f"[leftovers] {len(left)} process(es) that the test run started are still running:", file=sys.stderr)
    for proc in left:
        print(f"  {describe(proc)}", file=sys.stderr)
        with contextlib.suppress(psutil.Error):
            proc.kill()
    return 1


if __name__ == "__main__":
    sys.exit(main())
