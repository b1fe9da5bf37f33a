"""The `auto` policy table: which private mechanism to run for a request's (ε, k),
chosen offline from the PUBLIC sensitivity population, never from the request's scores.

For every ε on :data:`POLICY_EPSILONS`, every slate size k in :data:`SLATE_SIZES` and every
private mechanism, the table holds the expected MSE = E[(max q − q_selected)²] on clipped scores,
averaged over the population's users, and the mechanism's rank at that (ε, k) (1 = lowest).

- Exact expectations (:func:`recsvc.mechanisms.expectation`) for the mechanisms that declare a
  cheap one; Monte Carlo for the others (rs, rs_improved: no exact form; rnm_laplace: its exact
  probabilities cost ~40 ms per call at n = 500) with ``trials`` selections per user and
  population user b's stream ``SeedSequence(seed, spawn_key=(b,))``.
- Slates (k > 1) are ranked by the expected MSE of the slate's FIRST item: peeling selects it
  with ε/k from all candidates, so it is the k = 1 value at ε/k (exact where k = 1 is exact).
  The first item carries the largest share of a slate's value and every later step is the same
  mechanism at ε/k on all but a few candidates, so the ranking carries over (checked on ml-100k
  against the mean slate MSE: python -m scripts.bench.auto --slates).
- At k > 1 the one-shot top-k mechanisms (:func:`slate_policy_mechanisms`: oneshot, gumbel, clm)
  compete too, LISTED FIRST so that they win ties: a slate is one pass instead of k. oneshot's and
  gumbel's first item is their k = 1 draw at ε/k (the noise is scaled for the whole slate), the
  same law as peeling rnm's and em's first item, so their value is that exact expectation; clm
  lists a set in uniform order, so its value is the mean over its set, by Monte Carlo (``trials``
  class draws per user shared by every ε, :func:`recsvc.mechanisms.clm.first_item_means`).
- Lookup (:meth:`PolicyTable.resolve`): the table's k nearest to the request's k in log k, then
  the grid ε nearest to the request's ε in log ε; ties go to the lower grid point. Beyond the
  grid's ends the end point applies. The service uses the table only for candidate sets no larger
  than the population's (the manifest's ``policy.candidates``; see recsvc.service.selection).

This module is shared (L1): ``recsvc prep``/``recsvc policy`` build the table, the service and
``recsvc eval`` read it.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import polars as pl

from recsvc.artifact import POLICY, POLICY_SCHEMA, ArtifactError, CandidateMatrix, Manifest, validate_policy
from recsvc.checks import ParamError, check_int

AUTO = "auto"  # the name requests and the evaluation use for the policy's choice
# The evaluation grid (docs/reference/specification.md §6); the policy grid holds it and ≥ 4 points per decade
# from 0.01 to 16.
EVALUATION_EPSILONS: tuple[float, ...] = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0)
POINTS_PER_DECADE = 4
SLATE_SIZES: tuple[int, ...] = (1, 5, 10)
AUTO_THRESHOLD = 0.1  # |median population Spearman| above which the sign rule picks gem/mgem
DEFAULT_TRIALS = 50  # Monte Carlo selections per population user, mechanism and ε (5,000 over 100 users)
DEFAULT_SEED = 0
DEFAULT_USERS = 1000  # population users the table averages over (a seeded sample of larger populations)
CHUNK_USERS = 8  # users per work unit: a moving progress bar, both workers busy on 100 users
UTILITY = (
    "expected MSE (max q − q_selected)² on clipped scores, averaged over the population users; "
    "for k > 1 the slate's first item, selected with ε/k"
)


def policy_epsilons(
    low: float = 0.01,
    high: float = 16.0,
    per_decade: int = POINTS_PER_DECADE,
    include: Iterable[float] = EVALUATION_EPSILONS,
) -> tuple[float, ...]:
    """10^(j/per_decade) in [low, high] (4 significant digits), ``include`` and ``high``, sorted."""
    j0, j1 = math.ceil(math.log10(low) * per_decade - 1e-9), math.floor(math.log10(high) * per_decade + 1e-9)
    grid = {float(f"{10 ** (j / per_decade):.4g}") for j in range(j0, j1 + 1)}
    return tuple(sorted(grid | {float(e) for e in include} | {float(high)}))


POLICY_EPSILONS: tuple[float, ...] = policy_epsilons()


def policy_mechanisms() -> tuple[str, ...]:
    """The registry's default set of private mechanisms, in registry order: what `auto` may
    choose from (``recsvc.mechanisms.default_mechanisms``)."""
    from recsvc.mechanisms import default_mechanisms

    return default_mechanisms()


def slate_policy_mechanisms() -> tuple[str, ...]:
    """The registry's private one-shot top-k mechanisms, in registry order: what `auto` also
    ranks for slates (k > 1)."""
    from recsvc.mechanisms import MECHANISMS

    return tuple(n for n, m in MECHANISMS.items() if m.one_shot and m.private)


# One-shot mechanisms whose first item is exactly their k = 1 draw at ε/k (independent noise on
# the items, scaled for the slate): their slate value is that exact expectation.
_FIRST_ITEM_AT_EPS_OVER_K = frozenset({"oneshot", "gumbel"})


def method_of(mechanism: str) -> str:
    """``exact`` where the mechanism declares a cheap exact expectation, else ``monte-carlo``."""
    from recsvc.mechanisms import MECHANISMS

    return "exact" if MECHANISMS[mechanism].expectation_fn is not None else "monte-carlo"


@dataclass(frozen=True)
class PolicySpec:
    """What a table is computed over; recorded in the manifest's ``policy`` section."""

    epsilons: tuple[float, ...] = POLICY_EPSILONS
    ks: tuple[int, ...] = SLATE_SIZES
    mechanisms: tuple[str, ...] = field(default_factory=policy_mechanisms)
    trials: int = DEFAULT_TRIALS
    seed: int = DEFAULT_SEED
    users: int = DEFAULT_USERS  # at most this many population users (seeded sample)
    params: Mapping[str, float] = field(default_factory=dict)  # mechanism parameters; {} = defaults
    slate_mechanisms: tuple[str, ...] = field(default_factory=slate_policy_mechanisms)  # k > 1 only

    @property
    def slate_ks(self) -> tuple[int, ...]:
        return tuple(k for k in self.ks if k > 1)

    def mechanisms_at(self, k: int) -> tuple[str, ...]:
        """The mechanisms ranked at slate size k, in tie-breaking order."""
        return (*self.slate_mechanisms, *self.mechanisms) if k > 1 else self.mechanisms

    def check(self) -> PolicySpec:
        from recsvc.mechanisms import MECHANISMS, check_params

        if not self.epsilons or any(not (math.isfinite(e) and e > 0) for e in self.epsilons):
            raise ParamError("{epsilons} must be finite numbers > 0 (at least one), got {got}", got=list(self.epsilons))
        if not self.ks or any(isinstance(k, bool) or not isinstance(k, int) or k < 1 for k in self.ks):
            raise ParamError("{ks} must be integers ≥ 1 (at least one), got {got}", got=list(self.ks))
        unknown = [m for m in self.mechanisms if m not in MECHANISMS or not MECHANISMS[m].private]
        if not self.mechanisms or unknown:
            raise ParamError("{mechanisms} must be private mechanisms, got {got}", got=unknown or "none")
        bad = [
            m
            for m in self.slate_mechanisms
            if m not in MECHANISMS or not (MECHANISMS[m].private and MECHANISMS[m].one_shot)
        ]
        if bad or set(self.slate_mechanisms) & set(self.mechanisms):
            raise ParamError(
                "{slate_mechanisms} must be private one-shot top-k mechanisms not in {mechanisms}, got {got}",
                got=bad or sorted(set(self.slate_mechanisms) & set(self.mechanisms)),
            )
        check_int("trials", self.trials, 1)
        check_int("seed", self.seed, 0)
        check_int("users", self.users, 1)
        check_params(dict(self.params))
        return self

    def inner_epsilons(self) -> np.ndarray:
        """Every ε a single selection runs at: ε/k for each grid ε and k (sorted, distinct)."""
        return np.unique(np.array([e / k for e in self.epsilons for k in self.ks], dtype=np.float64))

    def describe(self, users: int, candidates: int) -> dict[str, object]:
        """The manifest's ``policy`` section (``candidates``: the population's largest candidate
        set, above which the service does not use the table)."""
        return {
            "epsilons": list(self.epsilons),
            "ks": list(self.ks),
            "mechanisms": list(self.mechanisms),
            "slate_mechanisms": list(self.slate_mechanisms),
            "users": int(users),
            "candidates": int(candidates),
            "trials": int(self.trials),
            "seed": int(self.seed),
            "params": dict(self.params),
            "utility": UTILITY,
            "lookup": "nearest k in log k, then nearest ε in log ε; ties to the lower grid point",
        }


def sample_users(total: int, users: int, seed: int, stream: int = 2**32) -> np.ndarray:
    """Sorted indices of at most ``users`` of ``total`` population users (all if few enough),
    drawn from the seed's stream ``stream`` (a spawn key: each sample its own)."""
    if total <= users:
        return np.arange(total)
    rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(stream,)))
    return np.sort(rng.choice(total, users, replace=False))


@dataclass(frozen=True)
class _Context:
    mechanisms: tuple[str, ...]
    inner: np.ndarray
    trials: int
    seed: int
    params: Mapping[str, float]
    slate_mechanisms: tuple[str, ...] = ()
    slate_ks: tuple[int, ...] = ()
    epsilons: tuple[float, ...] = ()


@dataclass(frozen=True)
class _Chunk:
    start: int  # global index of the first user (its Monte Carlo stream)
    scores: np.ndarray  # (B, n) clipped, padding −inf
    sensitivities: np.ndarray  # (B, n)
    count: np.ndarray  # (B,)


def _user_mse(q: np.ndarray, d: np.ndarray, user: int, ctx: _Context) -> np.ndarray:
    """(M, E') expected MSE of one user: exact or Monte Carlo, per :func:`method_of`. The same
    numbers as :func:`recsvc.mechanisms.expectation` / ``select_batch(…, user_offset=user)``; the
    input and parameters are checked once per user rather than once per (mechanism, ε)."""
    from recsvc.mechanisms import check_params, get_mechanism
    from recsvc.mechanisms.validation import check_scores_sensitivities
    from recsvc.rng import user_stream

    q, d = check_scores_sensitivities(q, d)
    gap2 = (q.max() - q) ** 2
    out = np.empty((len(ctx.mechanisms), ctx.inner.shape[0]))
    for mi, name in enumerate(ctx.mechanisms):
        mech = get_mechanism(name)
        p = check_params({k: v for k, v in ctx.params.items() if k in mech.params}, mech)
        for ei, eps in enumerate(ctx.inner.tolist()):  # every ε > 0 and finite (PolicySpec.check)
            if mech.expectation_fn is not None:
                out[mi, ei] = mech.expectation_fn(q, d, eps, p, gap2)
            else:
                out[mi, ei] = gap2[mech.sample(q, d, eps, p, user_stream(ctx.seed, user), ctx.trials)].mean()
    return out


def _user_slate_mse(q: np.ndarray, d: np.ndarray, user: int, ctx: _Context) -> np.ndarray:
    """(S, K, E) expected MSE of the first item of each one-shot mechanism's k-slate at ε, one user
    (see the module doc); Monte Carlo from the user's stream ``SeedSequence(seed, spawn_key=(user, 1))``."""
    from recsvc.mechanisms import check_params, get_mechanism
    from recsvc.mechanisms.clm import first_item_means
    from recsvc.mechanisms.validation import check_scores_sensitivities

    q, d = check_scores_sensitivities(q, d)
    gap2 = (q.max() - q) ** 2
    out = np.empty((len(ctx.slate_mechanisms), len(ctx.slate_ks), len(ctx.epsilons)))
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence(ctx.seed, spawn_key=(user, 1))))
    for si, name in enumerate(ctx.slate_mechanisms):
        mech = get_mechanism(name)
        p = check_params({k: v for k, v in ctx.params.items() if k in mech.params}, mech)
        for ki, k in enumerate(ctx.slate_ks):
            kk = min(k, q.shape[0])
            if name == "clm":  # every ε from the same class noise
                out[si, ki] = first_item_means(q, d, ctx.epsilons, p, kk, gap2, rng, ctx.trials)
                continue
            for ei, eps in enumerate(ctx.epsilons):
                if name in _FIRST_ITEM_AT_EPS_OVER_K and mech.expectation_fn is not None:
                    out[si, ki, ei] = mech.expectation_fn(q, d, eps / kk, p, gap2)
                else:  # another registered one-shot mechanism: its slates' first items
                    assert mech.top_k is not None
                    out[si, ki, ei] = np.mean([gap2[mech.top_k(q, d, eps, p, rng, kk)[0]] for _ in range(ctx.trials)])
    return out


def chunk_slate_mse(chunk: _Chunk, ctx: _Context) -> np.ndarray:
    """Engine work unit: (B, S, K, E) per-user slate values. Pure: depends on (chunk, ctx) only."""
    out = np.empty((chunk.count.shape[0], len(ctx.slate_mechanisms), len(ctx.slate_ks), len(ctx.epsilons)))
    for b in range(chunk.count.shape[0]):
        c = int(chunk.count[b])
        q, d = chunk.scores[b, :c], np.ascontiguousarray(chunk.sensitivities[b, :c])
        out[b] = _user_slate_mse(q, d, chunk.start + b, ctx)
    return out


def chunk_mse(chunk: _Chunk, ctx: _Context) -> np.ndarray:
    """Engine work unit: (B, M, E') per-user expected MSE. Pure: depends on (chunk, ctx) only."""
    out = np.empty((chunk.count.shape[0], len(ctx.mechanisms), ctx.inner.shape[0]))
    for b in range(chunk.count.shape[0]):
        c = int(chunk.count[b])
        out[b] = _user_mse(chunk.scores[b, :c], np.ascontiguousarray(chunk.sensitivities[b, :c]), chunk.start + b, ctx)
    return out


def _per_user(
    matrix: CandidateMatrix, spec: PolicySpec, work, engine, progress: bool | None, desc: str
) -> tuple[_Context, np.ndarray]:
    """(context, per-user values of ``work`` in user order) over the users with ≥ 1 candidate."""
    from recsvc.engines import LocalEngine, chunk_ranges

    spec.check()
    keep = np.flatnonzero(matrix.count > 0)
    if keep.size == 0:
        raise ValueError("the policy population has no users with candidates; expected ≥ 1")
    q, d, count = matrix.clipped()[keep], matrix.sensitivity[keep], matrix.count[keep]
    ctx = _Context(
        spec.mechanisms,
        spec.inner_epsilons(),
        spec.trials,
        spec.seed,
        dict(spec.params),
        spec.slate_mechanisms,
        spec.slate_ks,
        tuple(spec.epsilons),
    )
    chunks = [
        _Chunk(r.start, q[r.start : r.stop], d[r.start : r.stop], count[r.start : r.stop])
        for r in chunk_ranges(keep.size, CHUNK_USERS)
    ]
    engine = engine or LocalEngine(1, progress=progress)
    sizes = [c.count.shape[0] for c in chunks]
    return ctx, np.concatenate(list(engine.map(work, chunks, ctx, desc=desc, unit="user", sizes=sizes)))


def population_mse(
    matrix: CandidateMatrix, spec: PolicySpec, engine=None, progress: bool | None = None, desc: str = "policy table"
) -> tuple[np.ndarray, np.ndarray, int]:
    """(inner ε (E',), mean expected MSE (M, E'), users) over the population's users with ≥ 1
    candidate. The mean is over per-user values in user order: the same bits for any engine."""
    ctx, per_user = _per_user(matrix, spec, chunk_mse, engine, progress, desc)
    return ctx.inner, per_user.mean(axis=0), per_user.shape[0]


def population_slate_mse(
    matrix: CandidateMatrix, spec: PolicySpec, engine=None, progress: bool | None = None, desc: str = "policy slates"
) -> np.ndarray:
    """(S, K, E) population mean of each one-shot mechanism's first-item MSE, for the spec's
    slate mechanisms, k > 1 and grid ε (empty without either)."""
    if not spec.slate_mechanisms or not spec.slate_ks:
        return np.empty((len(spec.slate_mechanisms), len(spec.slate_ks), len(spec.epsilons)))
    return _per_user(matrix, spec, chunk_slate_mse, engine, progress, desc)[1].mean(axis=0)


def table_frame(spec: PolicySpec, inner: np.ndarray, mse: np.ndarray, slate: np.ndarray | None = None) -> pl.DataFrame:
    """``policy.parquet``: one row per (ε, k, mechanism), ranked per (ε, k) by expected MSE
    (ties: the order of :meth:`PolicySpec.mechanisms_at`). For k > 1 a peeling mechanism's value
    is its k = 1 value at ε/k, a one-shot mechanism's its ``slate`` value (first-item utility)."""
    rows: list[tuple[float, int, str, float, int, str]] = []
    for k in spec.ks:
        names = spec.mechanisms_at(k)
        for ei, eps in enumerate(spec.epsilons):
            col = int(np.searchsorted(inner, eps / k))  # inner holds exactly these ε/k
            values = mse[:, col]
            if k > 1 and spec.slate_mechanisms:
                assert slate is not None, "k > 1 with slate mechanisms needs their values"
                values = np.r_[slate[:, spec.slate_ks.index(k), ei], values]
            order = np.argsort(values, kind="stable")
            rank = np.empty(len(order), dtype=np.int64)
            rank[order] = np.arange(1, len(order) + 1)
            rows += [(float(eps), int(k), m, float(values[i]), int(rank[i]), method_of(m)) for i, m in enumerate(names)]
    return pl.DataFrame(
        rows,
        schema=POLICY_SCHEMA,
        orient="row",
    )


def build_table(
    matrix: CandidateMatrix, spec: PolicySpec, engine=None, progress: bool | None = None
) -> tuple[pl.DataFrame, int]:
    """The policy table of a population (clipped scores, Δ, counts) and the users it averaged."""
    inner, mse, users = population_mse(matrix, spec, engine, progress)
    slate = population_slate_mse(matrix, spec, engine, progress)
    return table_frame(spec, inner, mse, slate), users


def nearest(grid: Sequence[float], value: float) -> float:
    """The point of the sorted ``grid`` nearest to ``value`` in log scale; ties to the lower
    point; beyond the ends, the end point. Pure Python (bisect): ~1 µs per request."""
    i = bisect.bisect_left(grid, value)
    if i == 0:
        return float(grid[0])
    if i == len(grid):
        return float(grid[-1])
    lo, hi = float(grid[i - 1]), float(grid[i])
    if value == hi:
        return hi
    return lo if math.log(value) - math.log(lo) <= math.log(hi) - math.log(value) else hi


@dataclass(frozen=True)
class PolicyTable:
    """A validated policy table: :meth:`resolve` maps a request's (ε, k) to a mechanism."""

    frame: pl.DataFrame
    grids: Mapping[int, tuple[float, ...]]  # k → its sorted ε grid
    best: Mapping[tuple[int, float], str]  # (k, ε) → the rank-1 mechanism

    @classmethod
    def from_frame(cls, frame: pl.DataFrame, source: str = POLICY) -> PolicyTable:
        """Refuses a table whose grid is empty or that names a mechanism this version does not
        know (or one that is not private): ArtifactError naming ``source``."""
        from recsvc.mechanisms import MECHANISMS

        try:
            frame = validate_policy(frame)
        except ArtifactError as exc:
            raise ArtifactError(f"{source}: {exc}") from None
        names = frame["mechanism"].unique(maintain_order=True).to_list()
        unknown = [m for m in names if m not in MECHANISMS]
        if unknown:
            raise ArtifactError(
                f"{source}: unknown mechanism(s) {', '.join(map(repr, unknown))} (made by another "
                f"version?); expected some of {', '.join(MECHANISMS)}; rebuild it with "
                "`recsvc policy --artifacts DIR`"
            )
        public = [m for m in names if not MECHANISMS[m].private]
        if public:
            raise ArtifactError(
                f"{source}: {', '.join(public)} is not differentially private and `auto` never "
                "chooses it; rebuild it with `recsvc policy --artifacts DIR`"
            )
        top = frame.filter(pl.col("rank") == 1)
        best = {(int(k), float(e)): str(m) for e, k, m in top.select("epsilon", "k", "mechanism").iter_rows()}
        ks = sorted({k for k, _ in best})
        grids = {k: tuple(sorted(e for kk, e in best if kk == k)) for k in ks}
        return cls(frame, grids, best)

    @property
    def ks(self) -> tuple[int, ...]:
        return tuple(self.grids)

    @property
    def epsilons(self) -> tuple[float, ...]:
        return tuple(sorted({e for g in self.grids.values() for e in g}))

    def grid_point(self, epsilon: float, k: int = 1) -> tuple[int, float]:
        """The table's (k, ε) a request's (ε, k) resolves at (see the module doc)."""
        kk = int(nearest(self.ks, k))
        return kk, nearest(self.grids[kk], epsilon)

    def resolve(self, epsilon: float, k: int = 1) -> str:
        """The mechanism with the lowest expected MSE at the grid point of (ε, k)."""
        return self.best[self.grid_point(epsilon, k)]

    def winners(self) -> list[tuple[int, float, str, float]]:
        """(k, ε, best mechanism, its expected MSE) for every grid point, sorted."""
        top = self.frame.filter(pl.col("rank") == 1).sort("k", "epsilon")
        return [
            (int(k), float(e), str(m), float(v))
            for k, e, m, v in top.select("k", "epsilon", "mechanism", "expected_mse").iter_rows()
        ]


def resolve_auto(
    rho_median: float | None,
    threshold: float = AUTO_THRESHOLD,
    table: PolicyTable | None = None,
    epsilon: float | None = None,
    k: int = 1,
) -> str | None:
    """`auto` (docs/concepts/auto.md), from public data only (it costs nothing and never sees a request's scores):
    with a policy table, the mechanism with the lowest expected MSE on the public population at
    the table's grid point of (ε, k) (:meth:`PolicyTable.resolve`); without one, the sign rule:
    mgem if ρ̄ > t, gem if ρ̄ < −t, else rnm. None when neither is available."""
    if table is not None and epsilon is not None:
        return table.resolve(epsilon, k)
    if rho_median is None or not math.isfinite(rho_median):
        return None
    if rho_median > threshold:
        return "mgem"
    if rho_median < -threshold:
        return "gem"
    return "rnm"


def population_median(manifest: Manifest) -> float | None:
    """The median population Spearman(q, Δ) the sign rule reads; None when not recorded."""
    stats = manifest.population_spearman
    return None if stats is None else float(stats.median)
