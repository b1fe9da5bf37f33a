"""Benchmark the exact samplers of issue 36's second part against the float64 samplers they replaced.

The peers are the previous samplers, verbatim: ``oneshot`` and ``gumbel`` as the top k of float
Exponential / Gumbel noise, ``rnm_laplace`` as the argmax of float Laplace noise, ``rs`` and
``rs_improved`` with numpy's ``geometric`` / ``logseries`` counts and float Laplace records, and
``clm`` at k = 1 as its float Poisson-process draw, ``gem`` and ``mgem`` slates as the float
peel kernel (scripts/bench/gem_peel_float.py; β = 0.05, ε/10 a step). Both sides run in one process on the same
inputs (scores N(0, 1), Δ ~ U(0.05, 2), seed 0), in alternating
rounds, per call: one slate of k = 10 and one item (k = 1) at n = 500 and 20,720 (CSPRNG, as the
service draws), and a batch of 1,000 single-item draws (``select_batch``'s sampler call, from a
PCG64 user stream as ``select_batch`` draws) at n = 500. Reported: the median over
rounds of µs per call, and exact ÷ float paired per round (target ≤ 1.3).

Usage: .venv/bin/python -m scripts.bench.exact_slates [--rounds 7] [--seconds 0.15] [--only gem mgem]
The machine may be shared: compare the ratios within one run, not absolute times across runs.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import time
from collections.abc import Callable

import numpy as np

from recsvc.mechanisms import clm, gem_peel, noisy_max, random_stopping, topk
from recsvc.rng import csprng, user_stream
from scripts.bench import clm_float as clm_float_draw
from scripts.bench.gem_peel_float import peel_float

SIZES = (500, 20_720)
# gem/mgem also on synthetic ml20m-shape scores (clipped U(0, 0.003), Δ ~ U(7e-5, 0.037)): a
# concentrated law, where the float peel drew a few trials a step instead of m exponentials
CATALOG = "20,720 catalog-shape"
PEELS = ("gem", "mgem")
EPSILON = 1.0
GAMMA = {"gamma": 0.008}
BETA = 0.05  # gem's default β
Sampler = Callable[[np.ndarray, np.ndarray, np.random.Generator], object]


def _order(z: np.ndarray, k: int) -> np.ndarray:
    n = z.shape[0]
    if k == 1:
        return np.array([int(z.argmax())], dtype=np.int64)
    idx = np.argpartition(-z, k - 1)[:k] if k < n else np.arange(n)
    idx.sort()
    return idx[np.argsort(-z[idx], kind="stable")].astype(np.int64)


def _units(q: np.ndarray, d: np.ndarray, k: int) -> np.ndarray:
    return (q - q.max()) * (EPSILON / (2.0 * k * d.max()))


def oneshot_float(q: np.ndarray, d: np.ndarray, rng: np.random.Generator, k: int) -> np.ndarray:
    z = rng.standard_exponential((q.shape[0],))
    z += _units(q, d, k)
    return _order(z, k)


def gumbel_float(q: np.ndarray, d: np.ndarray, rng: np.random.Generator, k: int) -> np.ndarray:
    z = rng.gumbel(0.0, 1.0, (q.shape[0],))
    z += _units(q, d, k)
    return _order(z, k)


def laplace_float(q: np.ndarray, d: np.ndarray, rng: np.random.Generator, size: int) -> np.ndarray:
    z = rng.laplace(0.0, 1.0, (size, q.shape[0]))
    z += _units(q, d, 1)
    return z.argmax(axis=1)


def _best_of_draws(
    q: np.ndarray, d: np.ndarray, factor: float, counts: np.ndarray, rng: np.random.Generator
) -> np.ndarray:
    n = q.shape[0]
    a = rng.integers(0, n, int(counts.sum()))
    v = np.asarray(rng.laplace(0.0, 1.0, a.shape[0]), dtype=np.float64)
    v *= factor * d[a]
    v += q[a]
    if counts.shape[0] == 1:
        return a[v.argmax()][None]
    starts = np.zeros(counts.shape[0], dtype=np.int64)
    np.cumsum(counts[:-1], out=starts[1:])
    seg_max = np.maximum.reduceat(v, starts)
    hits = np.flatnonzero(v == np.repeat(seg_max, counts))
    return a[hits[np.searchsorted(hits, starts)]]


def rs_float(q: np.ndarray, d: np.ndarray, rng: np.random.Generator, size: int) -> np.ndarray:
    return _best_of_draws(q, d, 3.0 / EPSILON, rng.geometric(GAMMA["gamma"], size), rng)


def rs_improved_float(q: np.ndarray, d: np.ndarray, rng: np.random.Generator, size: int) -> np.ndarray:
    return _best_of_draws(q, d, 2.0 / EPSILON, rng.logseries(1.0 - GAMMA["gamma"], size), rng)


def clm_float(q: np.ndarray, d: np.ndarray, rng: np.random.Generator, size: int) -> np.ndarray:
    xs, order = clm._ranks(q)
    out = np.empty(size, np.int64)
    for i in range(size):
        out[i] = clm_float_draw.draw_slate(q, d, xs, order, 1, EPSILON, 0.5, rng)[0]
    return out


def _pairs() -> dict[tuple[str, int | str], tuple[Callable[..., object], Callable[..., object]]]:
    """(mechanism, k or 'batch') → (exact call, float call), each (q, d, rng)."""
    half = {"loss_weight": 0.5}
    out: dict[tuple[str, int | str], tuple[Callable[..., object], Callable[..., object]]] = {}
    for k in (10, 1):
        out[("oneshot", k)] = (
            lambda q, d, g, k=k: topk.oneshot_top_k(q, d, EPSILON, {}, g, k),
            lambda q, d, g, k=k: oneshot_float(q, d, g, k),
        )
        out[("gumbel", k)] = (
            lambda q, d, g, k=k: topk.gumbel_top_k(q, d, EPSILON, {}, g, k),
            lambda q, d, g, k=k: gumbel_float(q, d, g, k),
        )
    out[("clm", 10)] = (
        lambda q, d, g: clm.clm_top_k(q, d, EPSILON, {"loss_weight": 0.5}, g, 10),
        lambda q, d, g: clm_float_draw.draw_slate(q, d, *clm._ranks(q), 10, EPSILON, 0.5, g),
    )
    for sign, name in ((1.0, "gem"), (-1.0, "mgem")):
        exact_peel = gem_peel.gem_peel if sign > 0 else gem_peel.mgem_peel
        out[(name, 10)] = (
            lambda q, d, g, e=exact_peel: e(q, d, EPSILON / 10, {"beta": BETA}, g, 10),
            lambda q, d, g, s=sign: peel_float(s, q, d, EPSILON / 10, BETA, 10, g),
        )
    singles = {
        "rnm_laplace": (lambda q, d, g, s: noisy_max.rnm_laplace_sample(q, d, EPSILON, {}, g, s), laplace_float),
        "rs": (lambda q, d, g, s: random_stopping.rs_sample(q, d, EPSILON, GAMMA, g, s), rs_float),
        "rs_improved": (
            lambda q, d, g, s: random_stopping.rs_improved_sample(q, d, EPSILON, GAMMA, g, s),
            rs_improved_float,
        ),
        "clm": (lambda q, d, g, s: clm.clm_sample(q, d, EPSILON, half, g, s), clm_float),
    }
    for name, (exact, flt) in singles.items():
        out[(name, 1)] = (lambda q, d, g, e=exact: e(q, d, g, 1), lambda q, d, g, f=flt: f(q, d, g, 1))
        out[(name, "batch")] = (lambda q, d, g, e=exact: e(q, d, g, 1000), lambda q, d, g, f=flt: f(q, d, g, 1000))
    return out


def _timer(fn: Callable[..., object], q: np.ndarray, d: np.ndarray, g: np.random.Generator) -> Callable[[int], float]:
    def run(calls: int) -> float:
        t = time.perf_counter()
        for _ in range(calls):
            fn(q, d, g)
        return (time.perf_counter() - t) / calls

    return run


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7, help="alternating rounds (default 7)")
    ap.add_argument("--seconds", type=float, default=0.15, help="time per entry per round (default 0.15 s)")
    ap.add_argument("--only", nargs="*", default=None, help="only these mechanisms (default: all)")
    args = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    data: dict[int | str, tuple[np.ndarray, np.ndarray]] = {
        n: (rng.normal(size=n), rng.uniform(0.05, 2.0, size=n)) for n in SIZES
    }
    data[CATALOG] = (rng.uniform(0, 0.003, 20_720), rng.uniform(7e-5, 0.037, 20_720))
    g = csprng()  # per call, as the service draws
    batch_rng = user_stream(0, 0)  # a batch, as select_batch draws (one PCG64 stream per user)
    entries: dict[tuple[str, int | str, int | str, str], Callable[[int], float]] = {}
    for (name, k), (exact, flt) in _pairs().items():
        if args.only is not None and name not in args.only:
            continue
        for n in (500,) if k == "batch" else (*SIZES, CATALOG) if name in PEELS else SIZES:
            q, d = data[n]
            src = batch_rng if k == "batch" else g
            entries[(name, k, n, "exact")] = _timer(exact, q, d, src)
            entries[(name, k, n, "float")] = _timer(flt, q, d, src)
    calls = {}
    for key, run in entries.items():
        run(1)
        calls[key] = max(2, min(3000, math.ceil(args.seconds / max(run(1), 1e-7))))
    times: dict[tuple[str, int | str, int | str, str], list[float]] = {key: [] for key in entries}
    keys = list(entries)
    load0 = os.getloadavg()
    for r in range(args.rounds):
        shift = (r * len(keys)) // args.rounds
        for key in keys[shift:] + keys[:shift]:
            times[key].append(entries[key](calls[key]))
    load1 = os.getloadavg()
    print(
        f"exact vs float64 samplers, ε = {EPSILON}, γ = {GAMMA['gamma']}, {args.rounds} alternating rounds of "
        f"≈ {args.seconds} s per entry; load average {load0[0]:.2f} before, {load1[0]:.2f} after\n"
    )
    print("| mechanism | call | n | float64 µs | exact µs | exact ÷ float (paired median) |")
    print("|---|---|---|---|---|---|")
    for name, k, n, side in keys:
        if side != "exact":
            continue
        e, f = times[(name, k, n, "exact")], times[(name, k, n, "float")]
        ratio = statistics.median(a / b for a, b in zip(e, f, strict=True))
        call = "batch of 1,000" if k == "batch" else f"k = {k}"
        print(
            f"| `{name}` | {call} | {n if isinstance(n, str) else f'{n:,}'} | {statistics.median(f) * 1e6:,.0f} | {statistics.median(e) * 1e6:,.0f} | {ratio:.2f} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
