"""The OpenDP side of :mod:`scripts.bench.topk`, run by path with the peer virtualenv's python.

OpenDP and its dependencies never enter the project's environment, so this file imports nothing
from the project and nothing beyond the standard library and ``opendp``. It speaks JSON lines:

* stdin, first line: ``{"epsilon": ε, "inputs": {"<n>": {"scores": [...], "delta": Δmax}}}``;
  answered with ``{"opendp": version}``.
* stdin, then: ``{"n": n, "k": k, "call": "top_k" | "max" | "peel", "calls": c}``; answered with
  ``{"seconds": per call, "map": the call's ε at d_in = Δmax, "sample": one output}``.

The measurement is the one with recsvc's privacy: pure ε-DP (``max_divergence``), sensitivity Δmax
in L∞ with ``monotonic=False`` (a neighbour may move scores either way), so the range distance is
2Δmax and ``scale = 2kΔmax/ε`` makes the map exactly ε. ``peel`` is what recsvc's peeling mechanisms
do: k ``make_noisy_max`` calls at ``scale = 2kΔmax/ε`` (each map ε/k), each on the items not chosen
yet, the chosen one removed; its ``map`` is the sum of the k maps (basic composition), ε.
"""

from __future__ import annotations

import importlib.metadata
import json
import sys
import time
from typing import Any

import opendp.prelude as dp


def _measurement(n: int, k: int, call: str, epsilon: float, delta: float) -> Any:
    """``call``'s measurement on n items; ``peel`` is one step of it, on n remaining items."""
    space = (
        dp.vector_domain(dp.atom_domain(T=float, nan=False), size=n),
        dp.linf_distance(T=float, monotonic=False),
    )
    if call == "max":
        return dp.m.make_noisy_max(*space, dp.max_divergence(), scale=2.0 * delta / epsilon)
    if call == "peel":
        return dp.m.make_noisy_max(*space, dp.max_divergence(), scale=2.0 * k * delta / epsilon)
    return dp.m.make_noisy_top_k(*space, dp.max_divergence(), k=k, scale=2.0 * k * delta / epsilon)


def _peel(steps: list[Any], scores: list[float]) -> list[int]:
    """k selections by noisy max, each on the scores not chosen yet; the chosen items' indices in order."""
    remaining, rows = list(scores), list(range(len(scores)))
    out = []
    for meas in steps:
        j = meas(remaining)
        out.append(rows.pop(j))
        remaining.pop(j)
    return out


def main() -> None:
    dp.enable_features("contrib")
    setup = json.loads(sys.stdin.readline())
    epsilon = float(setup["epsilon"])
    inputs = {int(n): (list(map(float, v["scores"])), float(v["delta"])) for n, v in setup["inputs"].items()}
    print(json.dumps({"opendp": importlib.metadata.version("opendp")}), flush=True)
    cache: dict[tuple[int, int, str], Any] = {}
    for line in sys.stdin:
        req = json.loads(line)
        n, k, call, calls = int(req["n"]), int(req["k"]), str(req["call"]), int(req["calls"])
        scores, delta = inputs[n]
        # A peel's steps run on n, n - 1, ..., n - k + 1 items: one measurement per size, built once.
        sizes = [n - i for i in range(k)] if call == "peel" else [n]
        for m in sizes:
            if (m, k, call) not in cache:
                cache[(m, k, call)] = _measurement(m, k, call, epsilon, delta)
        steps = [cache[(m, k, call)] for m in sizes]
        out: object = None
        t = time.perf_counter()
        if call == "peel":
            for _ in range(calls):
                out = _peel(steps, scores)
        else:
            meas = steps[0]
            for _ in range(calls):
                out = meas(scores)
        seconds = (time.perf_counter() - t) / calls
        spent = sum(meas.map(delta) for meas in steps)
        print(json.dumps({"seconds": seconds, "map": spent, "sample": out}), flush=True)


if __name__ == "__main__":
    main()
