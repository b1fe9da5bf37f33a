"""The diffprivlib side of :mod:`scripts.bench.diffprivlib`, run by path with the peer virtualenv's python.

diffprivlib and its dependencies never enter the project's environment, so this file imports nothing
from the project and nothing beyond the standard library and ``diffprivlib``. It speaks JSON lines:

* stdin, first line: ``{"epsilon": ε, "inputs": {"<n>": {"scores": [...], "delta": Δmax}}}``;
  answered with ``{"diffprivlib": version}``.
* ``{"n": n, "mechanism": "pf" | "em", "law": true}``: the mechanism object's own numbers at ε on
  the n scores, to check its privacy convention; answered with ``{"epsilon", "sensitivity",
  "monotonic", "values"}``: for ``pf`` PermuteAndFlip's log acceptance probabilities (the
  Bernoulli(exp(·)) of each candidate's flip), for ``em`` Exponential's selection probabilities.
* ``{"n": n, "k": k, "mechanism": "pf" | "em", "calls": c}``; answered with ``{"seconds": per
  call, "epsilon": the ε of the call's steps summed, "sensitivity", "monotonic", "sample": one
  output (k item indices)}``.

A call is what a user of diffprivlib writes: ``PermuteAndFlip`` (or ``Exponential``)
``(epsilon=ε, sensitivity=Δmax, utility=scores, monotonic=False).randomise()``, the object built
in the call (it takes the utility at construction). Both select one item, so k = 10 peels: k of
them at ε/k, each on the items not chosen yet, the chosen one removed, as recsvc peels pf and em.
The default ``random_state`` draws from ``secrets.SystemRandom``.
"""

from __future__ import annotations

import importlib.metadata
import json
import sys
import time
from typing import Any

from diffprivlib.mechanisms import Exponential, PermuteAndFlip

MECHANISMS: dict[str, Any] = {"pf": PermuteAndFlip, "em": Exponential}


def _select(mech: Any, epsilon: float, delta: float, scores: list[float], k: int) -> tuple[list[int], float, Any]:
    """k item indices in selection order, the steps' ε summed and the last step's mechanism object."""
    if k == 1:
        m = mech(epsilon=epsilon, sensitivity=delta, utility=scores, monotonic=False)
        return [m.randomise()], m.epsilon, m
    remaining, rows = list(scores), list(range(len(scores)))
    out: list[int] = []
    spent = 0.0
    for _ in range(k):
        m = mech(epsilon=epsilon / k, sensitivity=delta, utility=remaining, monotonic=False)
        j = m.randomise()
        out.append(rows.pop(j))
        remaining.pop(j)
        spent += m.epsilon
    return out, spent, m


def _law(name: str, epsilon: float, delta: float, scores: list[float]) -> dict[str, object]:
    m = MECHANISMS[name](epsilon=epsilon, sensitivity=delta, utility=scores, monotonic=False)
    # Private attribute: the only place diffprivlib keeps the numbers randomise() draws with. For
    # Exponential it is the cumulative selection probability, for PermuteAndFlip the log acceptance
    # probability of each candidate.
    table = [float(x) for x in m._probabilities]
    values = [b - a for a, b in zip([0.0, *table[:-1]], table, strict=True)] if name == "em" else table
    return {"epsilon": m.epsilon, "sensitivity": m.sensitivity, "monotonic": m.monotonic, "values": values}


def main() -> None:
    setup = json.loads(sys.stdin.readline())
    epsilon = float(setup["epsilon"])
    inputs = {int(n): (list(map(float, v["scores"])), float(v["delta"])) for n, v in setup["inputs"].items()}
    print(json.dumps({"diffprivlib": importlib.metadata.version("diffprivlib")}), flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        n, name = int(req["n"]), str(req["mechanism"])
        scores, delta = inputs[n]
        if req.get("law"):
            print(json.dumps(_law(name, epsilon, delta, scores)), flush=True)
            continue
        k, calls, mech = int(req["k"]), int(req["calls"]), MECHANISMS[name]
        t = time.perf_counter()
        for _ in range(calls):
            out, spent, m = _select(mech, epsilon, delta, scores, k)
        seconds = (time.perf_counter() - t) / calls
        reply = {
            "seconds": seconds,
            "epsilon": spent,
            "sensitivity": m.sensitivity,
            "monotonic": m.monotonic,
            "sample": [int(i) for i in out],
        }
        print(json.dumps(reply), flush=True)


if __name__ == "__main__":
    main()
