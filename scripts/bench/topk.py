"""Benchmark one-shot top-k against OpenDP's ``make_noisy_top_k``, side by side in one run.

recsvc's ``select_slate`` for the one-shot mechanisms (oneshot, gumbel, clm) and for peeling rnm and pf,
against OpenDP 0.16's ``make_noisy_top_k`` (and ``make_noisy_max`` at k = 1), per call, at
n = 500 and n = 20,720, k = 10 and k = 1, on the same float64 scores (seed 0) and at the same
privacy: pure ε-DP for scores that move by at most Δmax either way between neighbours.

OpenDP runs in its own virtualenv (``.cache/peers/opendp``, created on first use with pip), never the
project's: a worker process of that venv (scripts/bench/peers/opendp_topk.py, run by path) waits on
its stdin while recsvc is timed, and the two sides take turns in every round. If the venv cannot be
created (no network, no pip), the benchmark says so in one line and exits with status 2. Ratios are OpenDP's
time ÷ recsvc's, paired per round (median) and best against best.

Usage: .venv/bin/python -m scripts.bench.topk [--rounds 9] [--seconds 0.2]
The machine may be shared: compare the ratios within one run, not absolute times across runs.
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
from collections.abc import Callable
from pathlib import Path

import numpy as np

from scripts.bench.harness import REPO

SIZES = (500, 20_720)  # the service's candidate count and ml20m-shape's catalog
KS = (10, 1)
MECHANISMS = ("oneshot", "gumbel", "clm", "rnm", "pf")  # rnm and pf peel: k selections at ε/k
EPSILON = 1.0
OPENDP_SPEC = "opendp==0.16.*"
PEER_VENV = REPO / ".cache" / "peers" / "opendp"
WORKER = Path(__file__).resolve().parent / "peers" / "opendp_topk.py"


class PeerError(Exception):
    """The peer virtualenv could not be made ready; the message is one line for the user."""


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1] if lines else "no output"


def _opendp_version(python: Path) -> str | None:
    if not python.exists():
        return None
    proc = subprocess.run(
        [str(python), "-c", "import importlib.metadata as m, opendp; print(m.version('opendp'))"],
        capture_output=True,
        text=True,
    )
    return proc.stdout.strip() if proc.returncode == 0 else None


def peer_python(venv: Path) -> tuple[Path, str]:
    """The python of a venv holding OpenDP 0.16, created or completed if needed; and its version."""
    python = venv / "bin" / "python"
    version = _opendp_version(python)
    if version is not None and version.startswith("0.16."):
        return python, version
    print(f"creating the OpenDP peer venv at {venv} ({OPENDP_SPEC}) ...", file=sys.stderr, flush=True)
    steps = [
        [sys.executable, "-m", "venv", str(venv)],
        [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", OPENDP_SPEC],
    ]
    for cmd in steps:
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True)
        except OSError as e:
            raise PeerError(f"cannot create the OpenDP peer venv at {venv}: {e}") from None
        if proc.returncode != 0:
            raise PeerError(
                f"cannot create the OpenDP peer venv at {venv}: `{' '.join(cmd[-3:])}` failed: "
                f"{_last_line(proc.stderr or proc.stdout)}"
            )
    version = _opendp_version(python)
    if version is None:
        raise PeerError(f"cannot create the OpenDP peer venv at {venv}: opendp does not import after pip install")
    return python, version


class OpenDP:
    """The worker process in the peer venv; idle on its stdin between requests."""

    def __init__(self, python: Path, epsilon: float, data: dict[int, tuple[np.ndarray, np.ndarray]]) -> None:
        # No site customisation from the project's environment may leak into the peer's python.
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
        self.proc = subprocess.Popen(
            [str(python), str(WORKER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
        )
        # float → JSON → float round-trips exactly (shortest repr), so both sides see the same scores.
        inputs = {str(n): {"scores": q.tolist(), "delta": float(d.max())} for n, (q, d) in data.items()}
        self.version = self._ask({"epsilon": epsilon, "inputs": inputs})["opendp"]

    def _ask(self, req: dict[str, object]) -> dict[str, object]:
        assert self.proc.stdin is not None and self.proc.stdout is not None  # both PIPE
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the OpenDP worker exited (code {self.proc.wait()})")
        out: dict[str, object] = json.loads(line)
        return out

    def time(self, n: int, k: int, call: str, calls: int) -> tuple[float, dict[str, object]]:
        out = self._ask({"n": n, "k": k, "call": call, "calls": calls})
        return float(str(out["seconds"])), out

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(30)


# ----------------------------------------------------------------------------- the run

Timer = Callable[[int], float]  # calls → seconds per call


def _recsvc_timer(name: str, q: np.ndarray, d: np.ndarray, k: int, epsilon: float) -> Timer:
    from recsvc.mechanisms import select_slate
    from recsvc.rng import csprng

    g = csprng()  # ChaCha20, as the service draws

    def run(calls: int) -> float:
        t = time.perf_counter()
        for _ in range(calls):
            select_slate(name, q, d, epsilon, k, g)
        return (time.perf_counter() - t) / calls

    return run


def _opendp_timer(peer: OpenDP, n: int, k: int, call: str, epsilon: float) -> Timer:
    def run(calls: int) -> float:
        seconds, out = peer.time(n, k, call, calls)
        # The measurement must be the one with recsvc's privacy, and its output a k-item slate.
        if not math.isclose(float(str(out["map"])), epsilon, rel_tol=1e-9):
            raise RuntimeError(f"OpenDP {call} n={n} k={k}: map(Δmax) = {out['map']}, not ε = {epsilon}")
        sample = out["sample"]
        items = [sample] if call == "max" else sample
        if not isinstance(items, list) or len(set(items)) != k or not all(0 <= int(i) < n for i in items):
            raise RuntimeError(f"OpenDP {call} n={n} k={k}: unexpected output {sample!r}")
        return seconds

    return run


def _shown(path: Path) -> str:
    """``path`` relative to the repository when inside it: the output is pasted into the docs."""
    resolved = path.resolve()
    return str(resolved.relative_to(REPO)) if resolved.is_relative_to(REPO) else str(path)


def _label(side: str, call: str) -> str:
    if side == "recsvc":
        return f'select_slate("{call}")'
    return "make_noisy_max" if call == "max" else "make_noisy_top_k"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=9, help="interleaved rounds (default 9)")
    ap.add_argument("--seconds", type=float, default=0.2, help="time per entry per round (default 0.2 s)")
    ap.add_argument("--epsilon", type=float, default=EPSILON)
    ap.add_argument("--peer-venv", type=Path, default=PEER_VENV, help=f"OpenDP's venv (default {PEER_VENV})")
    args = ap.parse_args()
    try:
        python, version = peer_python(args.peer_venv)
    except PeerError as e:
        print(f"topk: {e}", file=sys.stderr)
        sys.exit(2)

    rng = np.random.default_rng(0)
    data = {n: (rng.normal(size=n), rng.uniform(0.05, 2.0, size=n)) for n in SIZES}
    peer = OpenDP(python, args.epsilon, data)
    entries: dict[tuple[int, int, str, str], Timer] = {}
    for n in SIZES:
        q, d = data[n]
        for k in KS:
            for name in MECHANISMS:
                entries[(n, k, "recsvc", name)] = _recsvc_timer(name, q, d, k, args.epsilon)
            for call in ("top_k", "max") if k == 1 else ("top_k",):
                entries[(n, k, "opendp", call)] = _opendp_timer(peer, n, k, call, args.epsilon)

    # Warm-up (numba JIT, OpenDP's measurement) and the calls that fill --seconds.
    calls = {}
    for key, run in entries.items():
        run(1)
        calls[key] = max(3, min(5000, math.ceil(args.seconds / run(1))))
    times: dict[tuple[int, int, str, str], list[float]] = {key: [] for key in entries}
    keys = list(entries)
    load0 = os.getloadavg()
    t0 = time.perf_counter()
    for r in range(args.rounds):
        # Each round starts at another entry, so no entry always follows the same one.
        shift = (r * len(keys)) // args.rounds
        for key in keys[shift:] + keys[:shift]:
            times[key].append(entries[key](calls[key]))
        print(f"round {r + 1}/{args.rounds} done ({time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)
    peer.close()
    load1 = os.getloadavg()

    print(
        f"OpenDP {version} (venv {_shown(args.peer_venv)}) against recsvc, ε = {args.epsilon}, Δ ~ U(0.05, 2) (OpenDP: Δmax, "
        f"monotonic=False), scores N(0, 1) float64, seed 0; {args.rounds} interleaved rounds of ≈ {args.seconds} s "
        f"per entry; load average {load0[0]:.2f} before, {load1[0]:.2f} after"
    )
    print("per call in µs, median (best); ratio = OpenDP ÷ recsvc, paired per round (median) / best ÷ best\n")
    print("| n | k | recsvc | median (best) | OpenDP | median (best) | ratio | best ÷ best |")
    print("|---|---|---|---|---|---|---|---|")
    for n in SIZES:
        for k in KS:
            ref = (n, k, "opendp", "max" if k == 1 else "top_k")
            for name in MECHANISMS:
                own = (n, k, "recsvc", name)
                paired = statistics.median(o / m for o, m in zip(times[ref], times[own], strict=True))
                best = min(times[ref]) / min(times[own])
                print(
                    f"| {n:,} | {k} | `{_label('recsvc', name)}` | {statistics.median(times[own]) * 1e6:,.0f} "
                    f"({min(times[own]) * 1e6:,.0f}) | `{_label('opendp', ref[3])}` | "
                    f"{statistics.median(times[ref]) * 1e6:,.0f} ({min(times[ref]) * 1e6:,.0f}) | "
                    f"{paired:.1f}× | {best:.1f}× |"
                )
    print()
    for n in SIZES:
        other = times[(n, 1, "opendp", "top_k")]
        print(
            f"OpenDP make_noisy_top_k with k = 1 at n = {n:,}: {statistics.median(other) * 1e6:,.0f} "
            f"({min(other) * 1e6:,.0f}) µs"
        )


if __name__ == "__main__":
    main()
