"""Benchmark top-k against OpenDP's ``make_noisy_top_k`` and ``make_noisy_max``, side by side in one run.

recsvc's ``select_slate`` for the one-shot mechanisms (oneshot, gumbel, clm) and for peeling rnm and pf,
against OpenDP 0.16, per call, at n = 500 and n = 20,720, k = 10 and k = 1, on the same float64 scores
(seed 0) and at the same privacy: pure ε-DP for scores that move by at most Δmax either way between
neighbours. The one-shot mechanisms at k = 10 face ``make_noisy_top_k``; rnm and pf, which peel (k
selections at ε/k, each on the items not chosen yet), face ``make_noisy_max`` peeled the same way (k
calls at scale 2kΔmax/ε on the remaining items: k maps of ε/k, summed ε); at k = 1 every mechanism
faces ``make_noisy_max``.

OpenDP runs in its own virtualenv (``.cache/peers/opendp``, created on first use with pip), never the
project's: a worker process of that venv (scripts/bench/peers/opendp_topk.py, run by path) waits on
its stdin while recsvc is timed, and the two sides take turns in every round. If the venv cannot be
created (no network, no pip), the benchmark says so in one line and exits with status 2. Ratios are OpenDP's
time ÷ recsvc's, paired per round (median) and best against best.

Usage: .venv/bin/python -m scripts.bench.topk [--rounds 9] [--seconds 0.2]
The machine may be shared: compare the ratios within one run, not absolute times across runs.
"""

from __future__ import annotations

import math
import statistics
import sys

from scripts.bench.peers import (
    EPSILON,
    KS,
    PEERS,
    SIZES,
    PeerError,
    Timer,
    Worker,
    arguments,
    check_slate,
    micros,
    peer_python,
    ratios,
    recsvc_timer,
    run_rounds,
    score_inputs,
    shown,
    worker_inputs,
)

MECHANISMS = ("oneshot", "gumbel", "clm", "rnm", "pf")  # rnm and pf peel: k selections at ε/k
PEELING = ("rnm", "pf")
OPENDP_SPECS = ("opendp==0.16.*",)
PEER_VENV = PEERS / "opendp"


def _opendp_timer(peer: Worker, n: int, k: int, call: str, epsilon: float) -> Timer:
    def run(calls: int) -> float:
        out = peer.ask({"n": n, "k": k, "call": call, "calls": calls})
        # The measurement must be the one with recsvc's privacy, and its output a k-item slate.
        if not math.isclose(float(str(out["map"])), epsilon, rel_tol=1e-9):
            raise RuntimeError(f"OpenDP {call} n={n} k={k}: map(Δmax) = {out['map']}, not ε = {epsilon}")
        check_slate(f"OpenDP {call} n={n} k={k}", out["sample"], n, k)
        return float(str(out["seconds"]))

    return run


def _peer_call(name: str, k: int) -> str:
    """The OpenDP call recsvc's ``name`` is compared with at ``k``."""
    if k == 1:
        return "max"
    return "peel" if name in PEELING else "top_k"


def _label(side: str, call: str) -> str:
    if side == "recsvc":
        return f'select_slate("{call}")'
    return {"max": "make_noisy_max", "peel": "make_noisy_max", "top_k": "make_noisy_top_k"}[call]


def main() -> None:
    args = arguments(__doc__.splitlines()[0], "OpenDP", PEER_VENV, EPSILON)
    try:
        python, version = peer_python(args.peer_venv, "OpenDP", "opendp", OPENDP_SPECS, "0.16.")
    except PeerError as e:
        print(f"topk: {e}", file=sys.stderr)
        sys.exit(2)

    data = score_inputs(SIZES)
    peer = Worker(python, "opendp_topk.py", {"epsilon": args.epsilon, "inputs": worker_inputs(data)})
    entries: dict[tuple[int, int, str, str], Timer] = {}
    for n in SIZES:
        q, d = data[n]
        for k in KS:
            for name in MECHANISMS:
                entries[(n, k, "recsvc", name)] = recsvc_timer(name, q, d, k, args.epsilon)
            for call in ("top_k", "max") if k == 1 else ("top_k", "peel"):
                entries[(n, k, "opendp", call)] = _opendp_timer(peer, n, k, call, args.epsilon)

    times, (load0, load1) = run_rounds(entries, args.rounds, args.seconds)
    peer.close()

    print(
        f"OpenDP {version} (venv {shown(args.peer_venv)}) against recsvc, ε = {args.epsilon}, Δ ~ U(0.05, 2) (OpenDP: Δmax, "
        f"monotonic=False), scores N(0, 1) float64, seed 0; {args.rounds} interleaved rounds of ≈ {args.seconds} s "
        f"per entry; load average {load0:.2f} before, {load1:.2f} after"
    )
    print("per call in µs, median (best); ratio = OpenDP ÷ recsvc, paired per round (median) / best ÷ best")
    print("(peeled: k calls of make_noisy_max at ε/k, each on the items not chosen yet, as recsvc peels)\n")
    print("| n | k | recsvc | median (best) | OpenDP | median (best) | ratio | best ÷ best |")
    print("|---|---|---|---|---|---|---|---|")
    for n in SIZES:
        for k in KS:
            for name in MECHANISMS:
                call = _peer_call(name, k)
                own, ref = (n, k, "recsvc", name), (n, k, "opendp", call)
                paired, best = ratios(times[ref], times[own])
                peeled = " (peels)" if call == "peel" else ""
                print(
                    f"| {n:,} | {k} | `{_label('recsvc', name)}`{peeled} | {micros(times[own])} | "
                    f"`{_label('opendp', call)}`{' peeled' if peeled else ''} | {micros(times[ref])} | "
                    f"{paired:.1f}× | {best:.1f}× |"
                )
    print()
    for n in SIZES:
        other = times[(n, 1, "opendp", "top_k")]
        print(
            f"OpenDP make_noisy_top_k with k = 1 at n = {n:,}: {statistics.median(other) * 1e6:,.0f} "
            f"({min(other) * 1e6:,.0f}) µs"
        )
    for n in SIZES:
        peel, top = times[(n, 10, "opendp", "peel")], times[(n, 10, "opendp", "top_k")]
        print(
            f"OpenDP at n = {n:,}, k = 10: make_noisy_max peeled {micros(peel)} µs, make_noisy_top_k {micros(top)} µs"
        )


if __name__ == "__main__":
    main()
