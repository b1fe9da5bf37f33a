"""Benchmark selection against diffprivlib's ``PermuteAndFlip`` and ``Exponential``, side by side in one run.

recsvc's ``select_slate("pf")`` against diffprivlib 0.6's ``PermuteAndFlip`` and ``select_slate("em")``
against its ``Exponential``, per call, at n = 500 and n = 20,720, k = 10 and k = 1, on the same
float64 scores (N(0, 1), seed 0, Δ ~ U(0.05, 2)) and at the same privacy: pure ε-DP for scores that
move by at most Δmax either way between neighbours.

The privacy convention, from diffprivlib's source (``diffprivlib/mechanisms/exponential.py``):
``monotonic=False`` sets ``scale = ε / sensitivity / 2``, so ``Exponential`` draws item a with
probability ∝ exp(ε u_a / 2Δ) and ``PermuteAndFlip`` accepts a with probability exp(ε (u_a − u*) / 2Δ)
(u* the top utility): McSherry–Talwar's and McKenna–Sheldon's mechanisms, pure ε-DP (``delta=0.0``)
for utilities that move by at most Δ either way, exactly recsvc's ``em`` and ``pf`` at ε with
Δ = Δmax. So both sides take ``epsilon=ε, sensitivity=Δmax``, with no rescaling. The benchmark checks
it before timing, on the mechanism objects the worker builds: their ε, sensitivity and
``monotonic``, ``Exponential``'s selection probabilities against recsvc's exact ``em`` law and
``PermuteAndFlip``'s acceptance probabilities against exp(ε (q_a − q*) / 2Δmax); at n = 500 also
the selection law these give against recsvc's exact ``pf`` law.

Both diffprivlib classes select one item, so k = 10 peels on the peer side as recsvc peels pf and
em: k selections at ε/k, each on the items not chosen yet (ε in total by basic composition; the
worker reports the steps' ε summed). A diffprivlib call builds the mechanism object, as a user must
(it takes the utility list at construction), then calls ``randomise()``; its default
``random_state`` draws from ``secrets.SystemRandom``, recsvc's from ChaCha20.

diffprivlib runs in its own virtualenv (``.cache/peers/diffprivlib``, created on first use with pip),
never the project's: a worker process of that venv (scripts/bench/peers/diffprivlib_select.py, run
by path) waits on its stdin while recsvc is timed, and the two sides take turns in every round. If
the venv cannot be created (no network, no pip), the benchmark says so in one line and exits with
status 2. Ratios are diffprivlib's time ÷ recsvc's, paired per round (median) and best against best.

Usage: .venv/bin/python -m scripts.bench.diffprivlib [--rounds 9] [--seconds 0.2]
The machine may be shared: compare the ratios within one run, not absolute times across runs.
"""

from __future__ import annotations

import math
import sys

import numpy as np

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

PEERS_OF = {"pf": "PermuteAndFlip", "em": "Exponential"}  # recsvc mechanism → diffprivlib class
# diffprivlib 0.6.6 imports sklearn.tree._tree.DOUBLE, which scikit-learn 1.8 no longer has.
DIFFPRIVLIB_SPECS = ("diffprivlib==0.6.*", "scikit-learn<1.8")
PEER_VENV = PEERS / "diffprivlib"
LAW_SIZE = 500  # the pf selection law by quadrature: n/2 + 1 nodes, n² work


def _same_mechanism(out: dict[str, object], what: str, epsilon: float, delta: float) -> None:
    """The mechanism object(s) of a reply have recsvc's parameters: ε in total, Δmax, either way."""
    if not math.isclose(float(str(out["epsilon"])), epsilon, rel_tol=1e-9):
        raise RuntimeError(f"diffprivlib {what}: ε = {out['epsilon']}, not {epsilon}")
    if float(str(out["sensitivity"])) != delta or out["monotonic"] is not False:
        raise RuntimeError(f"diffprivlib {what}: sensitivity {out['sensitivity']}, monotonic {out['monotonic']}")


def _pf_law(log_accept: np.ndarray) -> np.ndarray:
    """P(permute-and-flip selects a) from the acceptance probabilities p: a's position in the random
    order is a uniform arrival time t, and every other b is either after a or before it and refused,
    so P(a) = p_a ∫₀¹ ∏_{b≠a} (1 − p_b t) dt, a polynomial of degree n − 1 in t (Gauss–Legendre with
    n/2 + 1 nodes is exact)."""
    p = np.exp(log_accept)
    x, w = np.polynomial.legendre.leggauss(len(p) // 2 + 1)
    t, w = (x + 1) / 2, w / 2
    logs = np.log1p(-np.outer(p, t))  # (n, nodes)
    others = logs.sum(axis=0) - logs  # ∑ over b ≠ a, per a and node
    out: np.ndarray = p * (np.exp(others) @ w)
    return out


def check_privacy(peer: Worker, data: dict[int, tuple[np.ndarray, np.ndarray]], epsilon: float) -> None:
    """diffprivlib's mechanisms at ``epsilon`` with ``sensitivity=Δmax, monotonic=False`` are
    recsvc's em and pf at ``epsilon`` on the same scores; RuntimeError if not."""
    from recsvc.mechanisms import log_probabilities

    for n, (q, d) in data.items():
        delta = float(d.max())
        for name, cls in PEERS_OF.items():
            out = peer.ask({"n": n, "mechanism": name, "law": True})
            _same_mechanism(out, f"{cls} n={n}", epsilon, delta)
            values = np.asarray(out["values"], dtype=np.float64)
            if name == "em":
                # Differences of a cumulative sum of n terms: absolute rounding up to ~n·2⁻⁵³.
                got, want, atol = values, np.exp(log_probabilities("em", q, d, epsilon)), 4 * n * 2.0**-53
            else:
                got, want, atol = values, epsilon / (2 * delta) * (q - q.max()), 0.0
            if not np.allclose(got, want, rtol=1e-9, atol=atol):
                raise RuntimeError(f"diffprivlib {cls} n={n}: not recsvc's {name} at ε = {epsilon}")
            if name == "pf" and n == LAW_SIZE:
                law = np.exp(log_probabilities("pf", q, d, epsilon))
                if not np.allclose(_pf_law(values), law, rtol=1e-8, atol=0.0):
                    raise RuntimeError(f"diffprivlib {cls} n={n}: its selection law is not recsvc's pf law")


def _peer_timer(peer: Worker, n: int, k: int, name: str, epsilon: float, delta: float) -> Timer:
    def run(calls: int) -> float:
        out = peer.ask({"n": n, "k": k, "mechanism": name, "calls": calls})
        what = f"{PEERS_OF[name]} n={n} k={k}"
        _same_mechanism(out, what, epsilon, delta)
        check_slate(f"diffprivlib {what}", out["sample"], n, k)
        return float(str(out["seconds"]))

    return run


def main() -> None:
    args = arguments(__doc__.splitlines()[0], "diffprivlib", PEER_VENV, EPSILON)
    try:
        python, version = peer_python(args.peer_venv, "diffprivlib", "diffprivlib", DIFFPRIVLIB_SPECS, "0.6.")
    except PeerError as e:
        print(f"diffprivlib: {e}", file=sys.stderr)
        sys.exit(2)

    data = score_inputs(SIZES)
    peer = Worker(python, "diffprivlib_select.py", {"epsilon": args.epsilon, "inputs": worker_inputs(data)})
    check_privacy(peer, data, args.epsilon)
    entries: dict[tuple[int, int, str, str], Timer] = {}
    for n in SIZES:
        q, d = data[n]
        for k in KS:
            for name in PEERS_OF:
                entries[(n, k, "recsvc", name)] = recsvc_timer(name, q, d, k, args.epsilon)
                entries[(n, k, "diffprivlib", name)] = _peer_timer(peer, n, k, name, args.epsilon, float(d.max()))

    times, (load0, load1) = run_rounds(entries, args.rounds, args.seconds)
    peer.close()

    print(
        f"diffprivlib {version} (venv {shown(args.peer_venv)}) against recsvc, ε = {args.epsilon}, Δ ~ U(0.05, 2) "
        f"(diffprivlib: sensitivity=Δmax, monotonic=False), scores N(0, 1) float64, seed 0; {args.rounds} "
        f"interleaved rounds of ≈ {args.seconds} s per entry; load average {load0:.2f} before, {load1:.2f} after"
    )
    print("per call in µs, median (best); ratio = diffprivlib ÷ recsvc, paired per round (median) / best ÷ best")
    print("(k = 10: both sides peel, k selections at ε/k, each on the items not chosen yet)\n")
    print("| n | k | recsvc | median (best) | diffprivlib | median (best) | ratio | best ÷ best |")
    print("|---|---|---|---|---|---|---|---|")
    for n in SIZES:
        for k in KS:
            for name, cls in PEERS_OF.items():
                own, ref = (n, k, "recsvc", name), (n, k, "diffprivlib", name)
                paired, best = ratios(times[ref], times[own])
                peeled = " (peels)" if k > 1 else ""
                print(
                    f'| {n:,} | {k} | `select_slate("{name}")`{peeled} | {micros(times[own])} | '
                    f"`{cls}`{' peeled' if peeled else ''} | {micros(times[ref])} | {paired:.1f}× | {best:.1f}× |"
                )


if __name__ == "__main__":
    main()
