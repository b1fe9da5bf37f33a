"""Benchmark the multi-selection device side: what Client.multiselect does besides the RPC.

At ml20m-shape size (20,720 items, d = 32, SANSA-shaped factors with 50 nonzeros per row each,
histories of 100 items, the size the device target is stated for), per call:

- ``noise``: the floor, d exact discrete Laplace draws from the CSPRNG (32-bit words, lattice units);
- ``code``: the code signal, what a device sends by default: the history's rows, the true scores
  of the C = 32 codebook items, the best's index and its exact randomised response;
- ``signal``: the lattice signal: the history's rows, embedding, L1 clip, lattice point and noise;
- ``rerank``: the true scores of the server's k = 10 items and the local choice;
- ``device``: code + rerank, the whole device side by default (target ≤ 1 ms);
- ``device-lattice``: signal + rerank, the device side with the lattice signal.

Rows take turns within every round (interleaved), so the ratios to the floor are paired. With
``--js`` the JavaScript device (clients/js) times the same steps on the same bundle, written to a
temporary directory, in one Node process. ``--bundle DIR`` times a real client bundle instead
(e.g. ``artifacts/synthetic-ml20m-shape/client``).

Usage: .venv/bin/python -m scripts.bench.device [--rounds 7] [--calls 300] [--js] [--bundle DIR]
The machine may be shared: compare the ratios within one run, not absolute times across runs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from recsvc.device import Device
from recsvc.model import Model
from recsvc.multiselection import Words, codebook_version, embedding_version
from recsvc.rng import csprng
from scripts.bench.harness import REPO

N_ITEMS, DIM, K, CODE_SIZE = 20_720, 32, 10, 32
NNZ_PER_ROW = 50  # each factor: 2 × 20,720 × 50 ≈ 2.1M nonzeros, SANSA's density 5e-3 at this n
HISTORY = 100  # the device target is stated for a 100-item history
EPSILON = 1.0


def synthetic_device(seed: int = 0) -> Device:
    """A Device of ml20m-shape size with random SANSA-shaped factors and a random embedding."""
    rng = np.random.default_rng(seed)
    n = N_ITEMS

    def factor() -> sp.csr_matrix:
        rows = np.repeat(np.arange(n), NNZ_PER_ROW)
        cols = rng.integers(0, n, n * NNZ_PER_ROW)
        return sp.csr_matrix((rng.normal(size=rows.size), (rows, cols)), shape=(n, n))

    ids = np.array([f"item{i}" for i in range(n)])
    factors = rng.normal(scale=0.05, size=(n, DIM))
    radius = 1.0
    book = np.arange(CODE_SIZE, dtype=np.int64)  # any C items: the code's cost does not depend on which
    version = embedding_version(factors, radius)
    return Device(Model(factor(), factor(), ids), factors, radius, version, book, codebook_version(ids[book].tolist()))


def _time(fn: Callable[[int], object], calls: int) -> list[float]:
    out = []
    for i in range(calls):
        t = time.perf_counter()
        fn(i)
        out.append(time.perf_counter() - t)
    return out


Rows = tuple[dict[str, list[float]], dict[str, float]]  # per-round medians, p99 over every call


def python_rows(device: Device, rounds: int, calls: int, seed: int = 1) -> Rows:
    rng = np.random.default_rng(seed)
    ids = device.model.item_ids.tolist()
    n = len(ids)
    histories = [[ids[j] for j in rng.choice(n, HISTORY, replace=False)] for _ in range(calls)]
    answers = [[ids[j] for j in rng.choice(n, K, replace=False)] for _ in range(calls)]
    noise_rng = csprng()
    steps: dict[str, Callable[[int], object]] = {
        "noise": lambda i: device.lattice.signal(np.zeros(device.dim), EPSILON, Words(noise_rng)),
        "code": lambda i: device.code_signal(histories[i], EPSILON, noise_rng),
        "signal": lambda i: device.signal(histories[i], EPSILON, noise_rng),
        "rerank": lambda i: device.choose(histories[i], answers[i]),
        "device": lambda i: (
            device.code_signal(histories[i], EPSILON, noise_rng),
            device.choose(histories[i], answers[i]),
        ),
        "device-lattice": lambda i: (
            device.signal(histories[i], EPSILON, noise_rng),
            device.choose(histories[i], answers[i]),
        ),
    }
    for fn in steps.values():  # warm up: numba's compiled code, W2's column copy
        fn(0)
    times: dict[str, list[float]] = {name: [] for name in steps}
    every: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(rounds):
        for name, fn in steps.items():
            t = _time(fn, calls)
            times[name].append(statistics.median(t))
            every[name] += t
    return times, {name: float(np.percentile(t, 99)) for name, t in every.items()}


def js_rows(device: Device, rounds: int, calls: int, bundle: Path | None) -> Rows:
    """The JavaScript device's medians per round, on the same bundle (``bundle``, or the device's
    written to a temporary directory)."""
    from recsvc.artifact.bundle import write_client_bundle

    with tempfile.TemporaryDirectory() as tmp:
        if bundle is None:
            bundle = Path(tmp) / "client"
            book = device.model.item_ids[device.codebook]
            write_client_bundle(bundle, device.model.item_ids, device.factors, device.radius, device.model, book)
        run = subprocess.run(
            ["node", "bin/bench.js", str(bundle.resolve()), str(rounds), str(calls), str(HISTORY), str(K)],
            cwd=REPO / "clients" / "js",
            capture_output=True,
            text=True,
            check=True,
        )
    out = json.loads(run.stdout)
    return out["medians"], out["p99"]


def report(title: str, rows: Rows) -> None:
    times, p99 = rows
    floor = times["noise"]
    print(f"\n{title}: per call over {len(floor)} rounds (µs), ratio to the noise floor (paired median)")
    print(f"{'row':<14} {'median':>9} {'best':>9} {'p99':>9} {'÷ noise':>9}")
    for name, t in times.items():
        ratio = statistics.median(a / b for a, b in zip(t, floor, strict=True))
        print(
            f"{name:<14} {statistics.median(t) * 1e6:>9.1f} {min(t) * 1e6:>9.1f} {p99[name] * 1e6:>9.1f} {ratio:>9.1f}"
        )
    verdict = "met" if statistics.median(times["device"]) <= 1e-3 else "NOT met"
    print(f"target: device ≤ 1 ms per call: {verdict}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=7, help="interleaved rounds (default %(default)s)")
    ap.add_argument("--calls", type=int, default=300, help="calls per row and round (default %(default)s)")
    ap.add_argument("--js", action="store_true", help="also time the JavaScript device (needs node)")
    ap.add_argument("--bundle", type=Path, help="a client bundle directory (default: a synthetic one)")
    args = ap.parse_args()
    device = synthetic_device() if args.bundle is None else Device.load(args.bundle)
    print(
        f"n = {len(device.model.item_ids):,}, d = {device.dim}, k = {K}, history = {HISTORY}, W1/W2 nonzeros "
        f"{device.model.w1.nnz:,}/{device.model.w2.nnz:,}"
    )
    report("Python device", python_rows(device, args.rounds, args.calls))
    if args.js:
        report("JavaScript device", js_rows(device, args.rounds, args.calls, args.bundle))


if __name__ == "__main__":
    main()
