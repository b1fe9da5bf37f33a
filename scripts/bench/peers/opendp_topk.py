"""The OpenDP side of :mod:`scripts.bench.topk`, run by path with the peer virtualenv's python.

OpenDP and its dependencies never enter the project's environment, so this file imports nothing
from the project and nothing beyond the standard library and ``opendp``. It speaks JSON lines:

* stdin, first line: ``{"epsilon": ε, "inputs": {"<n>": {"scores": [...], "delta": Δmax}}}``;
  answered with ``{"opendp": version}``.
* stdin, then: ``{"n": n, "k": k, "call": "top_k" | "max", "calls": c}``; answered with
  ``{"seconds": per call, "map": the measurement's ε at d_in = Δmax, "sample": one output}``.

The measurement is the one with recsvc's privacy: pure ε-DP (``max_divergence``), sensitivity Δmax
in L∞ with ``monotonic=False`` (a neighbour may move scores either way), so the range distance is
2Δmax and ``scale = 2kΔmax/ε`` makes the map exactly ε.
"""

from __future__ import annotations

import importlib.metadata
import json
import sys
import time
from typing import Any

import opendp.prelude as dp


def _measurement(n: int, k: int, call: str, epsilon: float, delta: float) -> Any:
    space = (
        dp.vector_domain(dp.atom_domain(T=float, nan=False), size=n),
        dp.linf_distance(T=float, monotonic=False),
    )
    if call == "max":
        return dp.m.make_noisy_max(*space, dp.max_divergence(), scale=2.0 * delta / epsilon)
    return dp.m.make_noisy_top_k(*space, dp.max_divergence(), k=k, scale=2.0 * k * delta / epsilon)


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
        key = (n, k, call)
        if key not in cache:
            cache[key] = _measurement(n, k, call, epsilon, delta)
        meas = cache[key]
        out = None
        t = time.perf_counter()
        for _ in range(calls):
            out = meas(scores)
        seconds = (time.perf_counter() - t) / calls
        print(json.dumps({"seconds": seconds, "map": meas.map(delta), "sample": out}), flush=True)


if __name__ == "__main__":
    main()
