"""What the side-by-side benchmarks against a peer library share: the peer's virtualenv, its worker
process, the recsvc timer and the interleaved rounds.

A peer library never enters the project's environment. It lives in its own virtualenv under
``.cache/peers/`` (:func:`peer_python` creates it with pip on first use), and a worker script of this
folder, run by path with that venv's python and importing nothing from the project, times the
peer's calls on request (:class:`Worker`: JSON lines on its stdin and stdout). The worker waits on
its stdin while recsvc is timed, and the two sides take turns in every round (:func:`run_rounds`),
so both see the same machine load; ratios are paired per round (:func:`ratios`).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Hashable, Sequence
from pathlib import Path
from typing import TypeVar

import numpy as np

from scripts.bench.harness import REPO

PEERS = REPO / ".cache" / "peers"
WORKERS = Path(__file__).resolve().parent

# The grid every peer comparison runs (issue 36): the service's candidate count and ml20m-shape's
# catalog, a slate of 10 and one item, at ε = 1.
SIZES = (500, 20_720)
KS = (10, 1)
EPSILON = 1.0

Timer = Callable[[int], float]  # calls → seconds per call
Key = TypeVar("Key", bound=Hashable)


class PeerError(Exception):
    """The peer virtualenv could not be made ready; the message is one line for the user."""


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1] if lines else "no output"


def _installed_version(python: Path, package: str) -> str | None:
    """``package``'s version in the venv of ``python`` if it imports there (import name = package name)."""
    if not python.exists():
        return None
    proc = subprocess.run(
        [str(python), "-c", f"import importlib.metadata as m, {package}; print(m.version({package!r}))"],
        capture_output=True,
        text=True,
    )
    return proc.stdout.strip() if proc.returncode == 0 else None


def peer_python(venv: Path, label: str, package: str, specs: Sequence[str], prefix: str) -> tuple[Path, str]:
    """The python of a venv holding ``package`` at a version starting with ``prefix``, created or
    completed with ``pip install *specs`` if needed; and that version. ``label`` names the peer in messages."""
    python = venv / "bin" / "python"
    version = _installed_version(python, package)
    if version is not None and version.startswith(prefix):
        return python, version
    print(f"creating the {label} peer venv at {venv} ({', '.join(specs)}) ...", file=sys.stderr, flush=True)
    steps = [
        [sys.executable, "-m", "venv", str(venv)],
        [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *specs],
    ]
    for cmd in steps:
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True)
        except OSError as e:
            raise PeerError(f"cannot create the {label} peer venv at {venv}: {e}") from None
        if proc.returncode != 0:
            raise PeerError(
                f"cannot create the {label} peer venv at {venv}: `{' '.join(cmd[1:4])} ...` failed: "
                f"{_last_line(proc.stderr or proc.stdout)}"
            )
    version = _installed_version(python, package)
    if version is None:
        raise PeerError(f"cannot create the {label} peer venv at {venv}: {package} does not import after pip install")
    return python, version


class Worker:
    """A worker script of this folder in the peer venv; idle on its stdin between requests."""

    def __init__(self, python: Path, script: str, setup: dict[str, object]) -> None:
        # No site customisation from the project's environment may leak into the peer's python.
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
        self.name = script
        self.proc = subprocess.Popen(
            [str(python), str(WORKERS / script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
        )
        self.hello = self.ask(setup)

    def ask(self, req: dict[str, object]) -> dict[str, object]:
        assert self.proc.stdin is not None and self.proc.stdout is not None  # both PIPE
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the worker {self.name} exited (code {self.proc.wait()})")
        out: dict[str, object] = json.loads(line)
        return out

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(30)


def score_inputs(sizes: Sequence[int]) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Scores N(0, 1) and Δ ~ U(0.05, 2), float64, seed 0, for each size in turn."""
    rng = np.random.default_rng(0)
    return {n: (rng.normal(size=n), rng.uniform(0.05, 2.0, size=n)) for n in sizes}


def worker_inputs(data: dict[int, tuple[np.ndarray, np.ndarray]]) -> dict[str, dict[str, object]]:
    """The scores and Δmax per size as a worker's setup line takes them. float → JSON → float
    round-trips exactly (shortest repr), so both sides see the same scores."""
    return {str(n): {"scores": q.tolist(), "delta": float(d.max())} for n, (q, d) in data.items()}


def recsvc_timer(name: str, q: np.ndarray, d: np.ndarray, k: int, epsilon: float) -> Timer:
    """``select_slate(name, q, d, ε, k)`` per call, drawing from ChaCha20 as the service does."""
    from recsvc.mechanisms import select_slate
    from recsvc.rng import csprng

    g = csprng()

    def run(calls: int) -> float:
        t = time.perf_counter()
        for _ in range(calls):
            select_slate(name, q, d, epsilon, k, g)
        return (time.perf_counter() - t) / calls

    return run


def check_slate(what: str, sample: object, n: int, k: int) -> None:
    """A peer's output must be ``k`` distinct item indices of ``range(n)`` (one index when k = 1 may
    come bare)."""
    items = sample if isinstance(sample, list) else [sample]
    if len(set(items)) != k or not all(isinstance(i, int) and 0 <= i < n for i in items):
        raise RuntimeError(f"{what}: unexpected output {sample!r}")


def run_rounds(
    entries: dict[Key, Timer], rounds: int, seconds: float
) -> tuple[dict[Key, list[float]], tuple[float, float]]:
    """Each entry's seconds per call in every round, and the load average before and after the rounds.

    Every entry is warmed up first (numba JIT, a peer's first call) and given the number of calls
    that fill ``seconds``; then the rounds run all entries in turn, each round from another entry."""
    calls = {}
    for key, run in entries.items():
        run(1)
        calls[key] = max(3, min(5000, math.ceil(seconds / run(1))))
    times: dict[Key, list[float]] = {key: [] for key in entries}
    keys = list(entries)
    load0 = os.getloadavg()
    t0 = time.perf_counter()
    for r in range(rounds):
        # Each round starts at another entry, so no entry always follows the same one.
        shift = (r * len(keys)) // rounds
        for key in keys[shift:] + keys[:shift]:
            times[key].append(entries[key](calls[key]))
        print(f"round {r + 1}/{rounds} done ({time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)
    load1 = os.getloadavg()
    return times, (load0[0], load1[0])


def ratios(peer: list[float], own: list[float]) -> tuple[float, float]:
    """peer ÷ own: the median of the rounds' ratios (paired) and best ÷ best."""
    paired = statistics.median(o / m for o, m in zip(peer, own, strict=True))
    return paired, min(peer) / min(own)


def micros(times: list[float]) -> str:
    """``median (best)`` per call in µs."""
    return f"{statistics.median(times) * 1e6:,.0f} ({min(times) * 1e6:,.0f})"


def shown(path: Path) -> str:
    """``path`` relative to the repository when inside it: the output is pasted into the docs."""
    resolved = path.resolve()
    return str(resolved.relative_to(REPO)) if resolved.is_relative_to(REPO) else str(path)


def arguments(description: str, label: str, venv: Path, epsilon: float) -> argparse.Namespace:
    """The command line every peer benchmark takes."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--rounds", type=int, default=9, help="interleaved rounds (default 9)")
    ap.add_argument("--seconds", type=float, default=0.2, help="time per entry per round (default 0.2 s)")
    ap.add_argument("--epsilon", type=float, default=epsilon, help=f"ε of every call (default {epsilon})")
    ap.add_argument("--peer-venv", type=Path, default=venv, help=f"{label}'s venv (default {venv})")
    return ap.parse_args()
