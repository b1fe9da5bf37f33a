"""`recsvc eval-multiselect --artifacts`: multi-selection against the central modes on real test
users, without the gRPC service (the same core functions, vectorised per user).

For each test user, each ε and each of ``trials`` repetitions:

- **multi-selection, code signal** (local ε-DP, what a device sends by default): the device's code
  (its best item of the bundle's codebook by its true scores) by exact C-ary randomised response
  (:func:`recsvc.multiselection.randomized_response`); the server answers the greedy of that
  likelihood (:func:`recsvc.multiselection.respond_code`), a function of (code, ε) only, so each
  answer is computed once per artifact;
- **multi-selection, lattice signal** (local ε-DP): the device draws the lattice signal it sends
  (:meth:`recsvc.multiselection.Lattice.signal`, the exact discrete Laplace on the bundle's grid);
  the server answers with k items, either the posterior greedy of that exact likelihood
  (:func:`recsvc.multiselection.respond_lattice`) or the plain baseline, the top k for the signal
  itself (:func:`recsvc.multiselection.baseline`); the device keeps the best of them
  by its true scores (seen items never). Both responses are in pick order, so one answer of the
  largest k gives every smaller k as its prefix, on the same signal.
- **Recommend, full catalog, `auto`** (central ε-DP): one item selected over the clipped scores
  of every catalog item, seen ones included, as the service does; `auto` resolves as there.
- **Select over the top 500, `auto`**: one item among the user's top-500 unseen candidates. The
  top 500 are chosen without noise from the history, so this is NOT end-to-end DP.

Measures per user (averaged over the repetitions, then over users with a 95% CI), against v,
the raw full-catalog scores with seen items worth 0 (:meth:`eval.multiselect.data.UserChunk.value`):

- ``utility_fraction``: v[chosen] / max v, the fraction of the best achievable score;
- ``hit_rate``: whether the chosen item is one of the user's held-out targets;
- ``mse``: the paper's (max q − q_chosen)² on q = clip(v, lo, hi) (:func:`eval.metrics.selected_stats`).

Three reference rows: each response without noise (ε = ∞: what the embedding alone allows), the
greedy response to no signal at all (ε = 0: uniform weights, the same k items for everyone) and
the non-private best item. User b's draws come from ``SeedSequence(seed, spawn_key=(b, TAG, mode, ε
index))`` (:func:`recsvc.rng.stream`): independent of chunking, workers and the other modes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from eval import metrics
from eval.multiselect.data import DatasetSource, UserChunk
from recsvc.policy import PolicyTable
from recsvc.rng import stream

TAG = 2**31 + 25  # second spawn-key word: these streams never meet eval's other streams
GREEDY, BASELINE, CODE = "multiselect", "multiselect-baseline", "multiselect-code"
RECOMMEND, SELECT, NONPRIVATE = "recommend-auto", "select-top500-auto", "nonprivate"
MEASURES = ("utility_fraction", "hit_rate", "mse")
TRUST = {
    CODE: "local ε-DP (any two histories; the operator is not trusted)",
    GREEDY: "local ε-DP (any two histories; the operator is not trusted)",
    BASELINE: "local ε-DP (any two histories; the operator is not trusted)",
    RECOMMEND: "central ε-DP (neighbouring histories; the operator is trusted)",
    SELECT: "NOT end-to-end DP (the top 500 are chosen without noise)",
    NONPRIVATE: "no privacy (the best item)",
}
SELECT_CANDIDATES = 500
NO_NOISE_EPSILON = 1e12  # the posterior of a noise-free signal: all weight on the nearest population users


@dataclass(frozen=True)
class Row:
    mode: str
    k: int
    epsilon: float  # math.inf: no noise; 0.0 (greedy only): no signal


def rows(ks: Sequence[int], epsilons: Sequence[float]) -> tuple[Row, ...]:
    """The result rows in output order: each response per k over ε then without noise (the
    greedy also without signal, ε = 0), the central modes at k = 1 per ε, the non-private best."""
    out = [Row(GREEDY, k, e) for k in ks for e in (0.0, *epsilons, math.inf)]
    out += [Row(BASELINE, k, e) for k in ks for e in (*epsilons, math.inf)]
    out += [Row(CODE, k, e) for k in ks for e in (*epsilons, math.inf)]
    out += [Row(m, 1, e) for m in (RECOMMEND, SELECT) for e in epsilons]
    return (*out, Row(NONPRIVATE, 1, math.inf))


@dataclass(frozen=True)
class Context:
    """What every chunk of one artifact shares (sent to each worker once)."""

    ks: tuple[int, ...]
    epsilons: tuple[float, ...]
    trials: int
    seed: int
    source: DatasetSource
    auto: AutoPolicy
    blind: np.ndarray  # (1, max k): the greedy answer to no signal (uniform weights), the same for everyone
    points: np.ndarray  # (P, d) int64: the population's lattice points, what the server's likelihood compares
    code_answers: np.ndarray  # (ε grid + ∞, C, max k): the server's answer to each code at each ε

    @classmethod
    def of(cls, source: DatasetSource, ks: Sequence[int], epsilons: Sequence[float], trials: int, seed: int) -> Context:
        """The answers no user's signal changes, computed once as the service computes them."""
        from recsvc.multiselection import greedy, prototype_codes, respond_code

        pop, book, kmax = source.population, source.bundle.codebook, max(ks)
        blind = greedy(pop, np.full(pop.size, 1.0 / pop.size), kmax)[None, :]
        points = source.bundle.lattice.point(pop.embeddings)  # the service rounds its prototypes the same way
        codes = prototype_codes(pop, book)
        grid = (*epsilons, NO_NOISE_EPSILON)
        answers = np.stack([np.stack([respond_code(pop, codes, y, e, kmax) for y in range(book.size)]) for e in grid])
        return cls(tuple(ks), tuple(epsilons), trials, seed, source, AutoPolicy.of(source), blind, points, answers)


@dataclass(frozen=True)
class AutoPolicy:
    """What `auto` runs for a selection's ε and candidate count, resolved as the service does
    (docs/concepts/auto.md): the artifact's policy table where it covers the count, run with the
    parameters the table assumed; else the sign rule on the population Spearman."""

    table: PolicyTable | None
    covers: int | None  # the largest candidate count the table holds for; None = any
    params: dict[str, float]
    rho: float | None

    @classmethod
    def of(cls, source: DatasetSource) -> AutoPolicy:
        from recsvc.policy import population_median

        art = source.artifact
        m = art.manifest
        table = None if art.policy is None else PolicyTable.from_frame(art.policy, f"{art.path}/policy.parquet")
        covers = None if m.policy is None or m.policy.candidates is None else int(m.policy.candidates)
        params = {} if m.policy is None else {k: float(v) for k, v in (m.policy.params or {}).items()}
        return cls(table, covers, params, population_median(m))

    def choose(self, epsilon: float, candidates: int) -> tuple[str, dict[str, float]]:
        from recsvc.policy import resolve_auto

        applies = self.table is not None and (self.covers is None or candidates <= self.covers)
        name = resolve_auto(self.rho, table=self.table if applies else None, epsilon=epsilon)
        if name is None:
            raise ValueError("`auto` is unavailable: the artifact has neither a policy table nor a population Spearman")
        return name, (self.params if applies else {})


def measures(chosen: np.ndarray, v: np.ndarray, q: np.ndarray, target: np.ndarray) -> np.ndarray:
    """(utility fraction, hit rate, MSE) of the chosen item rows (T,), averaged over them."""
    best = v.max()
    frac = float(v[chosen].mean() / best) if best > 0 else math.nan
    mse, _ = metrics.selected_stats(q[None, :], chosen[None, :])
    return np.array([frac, float(target[chosen].mean()), float(mse[0])])


def device_choice(device: np.ndarray, answers: np.ndarray) -> np.ndarray:
    """The device's pick from each answer (T, k) of item rows: the highest true score, ties to
    the earlier item, seen items (−inf) never unless all are seen (then the first)."""
    return answers[np.arange(len(answers)), np.argmax(device[answers], axis=1)]


def _central(ctx: Context, eps: float, q: np.ndarray, d: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """``trials`` selections by what `auto` runs among these candidates (Monte Carlo: exact
    probabilities over a 20,000-item catalog cost minutes per user)."""
    from recsvc.mechanisms.registry import check_params, get_mechanism

    name, params = ctx.auto.choose(eps, q.size)
    mech = get_mechanism(name)
    return np.asarray(mech.sample(q, d, eps, check_params(params, mech), rng, ctx.trials), dtype=np.int64)


def evaluate_user(ctx: Context, chunk: UserChunk, b: int) -> np.ndarray:
    """(rows, measures) for user b of the chunk. Per ε, ``trials`` signals of each kind: the code
    of its true scores by randomised response, and the lattice signal of its embedding; without
    noise, the code itself and the lattice point of the clipped embedding. Each is answered as
    the service answers it."""
    from recsvc.multiselection import Words, baseline, code_of, randomized_response, respond_lattice

    src, g = ctx.source, chunk.start + b
    pop, factors, grid, book = src.population, src.bundle.embedding, src.bundle.lattice, src.bundle.codebook
    v, dev, target, e = chunk.value(b), chunk.device_scores(b), chunk.target[b], chunk.embedding[b]
    q = np.clip(v, src.lo, src.hi)
    kmax, code = max(ctx.ks), code_of(dev[book])
    out: dict[Row, np.ndarray] = {}

    def keep(mode: str, eps: float, answers: np.ndarray) -> None:
        """The device's pick from each answer (T, max k): every k's answer is its first k items."""
        for k in ctx.ks:
            out[Row(mode, k, eps)] = measures(device_choice(dev, answers[:, :k]), v, q, target)

    keep(GREEDY, 0.0, ctx.blind)
    for ei, eps in enumerate((*ctx.epsilons, math.inf)):
        if math.isinf(eps):
            sent, signals, at = np.array([code]), grid.point(e)[None, :], NO_NOISE_EPSILON
        else:
            words, code_words = Words(stream(ctx.seed, g, TAG, 0, ei)), Words(stream(ctx.seed, g, TAG, 3, ei))
            sent = np.array([randomized_response(code, book.size, eps, code_words) for _ in range(ctx.trials)])
            signals, at = np.stack([grid.signal(e, eps, words) for _ in range(ctx.trials)]), eps
        keep(CODE, eps, ctx.code_answers[ei][sent])
        keep(GREEDY, eps, np.stack([respond_lattice(pop, ctx.points, z, at, grid, kmax) for z in signals]))
        keep(BASELINE, eps, np.stack([baseline(z * grid.step, factors, kmax) for z in signals]))  # embedding units
    full_q = np.clip(chunk.raw[b], src.lo, src.hi)  # what Recommend selects over: seen items keep their scores
    c = int(chunk.cand_count[b])
    rows500 = chunk.cand_rows[b, :c]
    for ei, eps in enumerate(ctx.epsilons):
        picked = _central(ctx, eps, full_q, src.sens, stream(ctx.seed, g, TAG, 1, ei))
        out[Row(RECOMMEND, 1, eps)] = measures(picked, v, q, target)
        sel = _central(ctx, eps, chunk.cand_scores[b, :c], chunk.cand_sens[b, :c], stream(ctx.seed, g, TAG, 2, ei))
        out[Row(SELECT, 1, eps)] = measures(rows500[sel], v, q, target)
    out[Row(NONPRIVATE, 1, math.inf)] = measures(np.array([int(np.argmax(v))]), v, q, target)
    return np.stack([out[r] for r in rows(ctx.ks, ctx.epsilons)])


def evaluate_chunk(chunk: UserChunk, ctx: Context) -> np.ndarray:
    """(B, rows, measures) for one chunk of users; a pure function of (chunk, ctx)."""
    return np.stack([evaluate_user(ctx, chunk, b) for b in range(len(chunk.user_ids))])
