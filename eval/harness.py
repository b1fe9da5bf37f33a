"""Evaluation harness: every mechanism × ε on every user, chunked over an engine (SPEC §6).

The work unit :func:`evaluate_chunk` is a pure function of (chunk of users, context). User b's
randomness is ``SeedSequence(seed, spawn_key=(b,))`` with b the GLOBAL user index, so results
do not depend on the chunk size or on the engine (local processes or Dask). Chunks are built
lazily and their results are reduced in order into bounded running aggregates, while per-user
rows stream to Parquet: memory does not grow with the number of users.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pyarrow.parquet as pq

from eval import metrics
from eval.metrics import RunningMean
from recsvc.artifacts import StagedDir, check_out
from recsvc.checks import ParamError, check_int
from recsvc.engines import resolve_workers
from recsvc.stats import spearman_rows

DEFAULT_EPSILONS: tuple[float, ...] = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0)
DEFAULT_TRIALS = 50
DEFAULT_BETA = 0.05
DEFAULT_GAMMA = 0.008
DEFAULT_CHUNK_SIZE = 256  # users per work unit when the run is large
MIN_AUTO_CHUNK = 16  # automatic chunks never get smaller than this (per-chunk overhead)
CHUNKS_PER_WORKER = 4  # automatic chunking aims for this many chunks per worker (progress, balance)
DEFAULT_LEVEL = 0.8  # sweep scenario's t when none is given
HIST_BINS = 40  # correlation histogram bins on [-1, 1]
SCATTER_USERS = 10_000  # Figure 13 shows 10,000 random test users

# Which of the shared params each mechanism takes (SPEC §2).
_PARAMS_OF: dict[str, tuple[str, ...]] = {
    "gem": ("beta",),
    "mgem": ("beta",),
    "combined_gem": ("beta", "corr_budget_fraction"),
    "rs": ("gamma",),
    "rs_improved": ("gamma",),
}


@dataclass(frozen=True)
class EvalConfig:
    """One evaluation run. Exactly one of ``artifacts`` / ``scenario`` is the data source."""

    artifacts: Path | None = None
    scenario: str | None = None
    n: int = 100  # scenario candidates
    level: float | None = None  # sweep scenario's t (None = 0.8); only for scenario "sweep"
    users: int | None = None  # first N users (artifact) / rows (scenario); None = all / default
    mechanisms: tuple[str, ...] | None = None  # None = every private mechanism
    epsilons: tuple[float, ...] = DEFAULT_EPSILONS
    trials: int = DEFAULT_TRIALS
    seed: int = 0
    exact: bool = False
    beta: float = DEFAULT_BETA
    gamma: float = DEFAULT_GAMMA
    corr_budget_fraction: float | None = None  # None = the mechanism's default (0.6)
    engine: str = "local"
    workers: int | None = None
    scheduler: str | None = None
    chunk_size: int | None = None  # None = automatic: ≤ 256, ≥ 4 chunks per worker, ≥ 16 users
    out: Path | None = None
    force: bool = False  # replace an existing ``out`` directory (never the artifact directory)
    progress: bool | None = None
    ratio_epsilon: float = 1.0  # ε whose mGEM/GEM log-ratio is plotted against correlation


# ---------------------------------------------------------------------------------------------
# Validation (before any work)


def _check_out(cfg: EvalConfig) -> None:
    """The results directory must never touch the artifact it reads (nor the working directory):
    :func:`recsvc.artifacts.check_out`. Only stats, no writes."""
    if cfg.out is None:
        return
    check_out(cfg.out, cfg.force, protect=_protected(cfg))


def _protected(cfg: EvalConfig) -> dict[str, Path]:
    return {} if cfg.artifacts is None else {"--artifacts": Path(cfg.artifacts)}


def validate(cfg: EvalConfig) -> tuple[str, ...]:
    """Every check that needs no data (parameters, out); raises ValueError, returns the mechanisms.
    :func:`run` calls it first; the demo calls it before building anything."""
    from recsvc.mechanisms import MECHANISMS

    if (cfg.artifacts is None) == (cfg.scenario is None):
        raise ParamError("give exactly one data source: {artifacts} DIR or {scenario} NAME")
    if cfg.level is not None and cfg.scenario != "sweep":
        src = "{scenario} {name}" if cfg.scenario is not None else "{artifacts}"
        raise ParamError(f"{{level}} applies only to {{scenario}} sweep, got it with {src}; "
                         "drop {level} or use {scenario} sweep", name=cfg.scenario)
    check_int("seed", cfg.seed, 0)
    check_int("trials", cfg.trials, 1)
    for param, value in (("users", cfg.users), ("chunk_size", cfg.chunk_size)):
        if value is not None:
            check_int(param, value, 1)
    resolve_workers(cfg.workers)
    r = cfg.ratio_epsilon
    if isinstance(r, bool) or not (isinstance(r, (int, float)) and math.isfinite(r) and r > 0):
        raise ParamError("{ratio_epsilon} must be a finite number > 0, got {value}", value=repr(r))
    if not cfg.epsilons:
        raise ValueError("no ε given; expected at least one ε > 0")
    for eps in cfg.epsilons:
        if not (isinstance(eps, (int, float)) and math.isfinite(eps) and eps > 0):
            raise ValueError(f"ε must be a finite number > 0, got {eps!r}")
    if len(set(cfg.epsilons)) != len(cfg.epsilons):
        raise ValueError(f"ε values must be distinct, got {list(cfg.epsilons)}")
    for pname, val in (("beta", cfg.beta), ("gamma", cfg.gamma), ("corr_budget_fraction", cfg.corr_budget_fraction)):
        if val is not None and not (0 < val < 1):
            raise ValueError(f"{pname} must be in (0, 1), got {val!r}")
    names = tuple(cfg.mechanisms) if cfg.mechanisms else tuple(m for m, o in MECHANISMS.items() if o.private)
    unknown = [m for m in names if m not in MECHANISMS]
    if unknown:
        raise ValueError(f"unknown mechanism(s) {unknown}; expected some of {', '.join(MECHANISMS)}")
    if len(set(names)) != len(names):
        raise ValueError(f"mechanisms must be distinct, got {list(names)}")
    _check_out(cfg)
    return names


def _chunk_size(cfg: EvalConfig, total: int) -> int:
    """The explicit --chunk-size, else ≤ 256 users but small enough that every worker gets
    ~4 chunks (a moving progress bar, both cores busy), never below 16 users. Per-user results
    and aggregates do not depend on it (per-user streams; fixed-block merging, see RunningMean)."""
    if cfg.chunk_size is not None:
        return int(cfg.chunk_size)
    workers = resolve_workers(cfg.workers)
    return max(MIN_AUTO_CHUNK, min(DEFAULT_CHUNK_SIZE, -(-total // (CHUNKS_PER_WORKER * workers))))


# ---------------------------------------------------------------------------------------------
# Data sources → lazy chunks


@dataclass(frozen=True)
class Chunk:
    """Users [start, start + len) of the run: clipped scores, Δ, real candidate counts."""

    start: int
    user_ids: np.ndarray  # (B,) str
    scores: np.ndarray  # (B, n) clipped; padding −inf
    sensitivities: np.ndarray  # (B, n); padding 1
    count: np.ndarray  # (B,)


class _ArtifactSource:
    def __init__(self, path: Path, users: int | None) -> None:
        from recsvc.artifacts import load_artifact

        self.artifact = load_artifact(path)  # verifies every sha256 before anything is trusted
        total = len(self.artifact.user_ids)
        if total == 0:
            raise ValueError(f"{path}: the artifact has no candidate users; expected ≥ 1")
        self.total = total if users is None else min(users, total)
        self.name = str(self.artifact.manifest.get("dataset", Path(path).name))

    def chunk(self, r: range) -> Chunk:
        m = self.artifact.candidate_matrix(users=len(r), start=r.start)
        return Chunk(r.start, m.user_ids, m.clipped(), m.sensitivity, m.count)


class _ScenarioSource:
    def __init__(self, name: str, n: int, users: int | None, seed: int, level: float | None) -> None:
        from eval.scenarios import scenario

        level = DEFAULT_LEVEL if level is None else level
        self.sc = scenario(name, n=n, seed=seed, repeats=users, level=level)
        self.total = self.sc.repeats
        self.name = f"scenario-{name}" + (f"-{level_dirname(level)}" if name == "sweep" else "")

    def chunk(self, r: range) -> Chunk:
        q = self.sc.draws[r.start : r.stop]
        ids = np.array([f"{self.sc.name}/{i}" for i in r])
        return Chunk(r.start, ids, q, self.sc.rows_sensitivities(r.start, r.stop), np.full(len(r), q.shape[1]))


class _LazyChunks(Sequence):
    """Builds each chunk only when the engine asks for it (engines keep a bounded window)."""

    def __init__(self, source: Any, ranges: list[range]) -> None:
        self.source, self.ranges = source, ranges

    def __len__(self) -> int:
        return len(self.ranges)

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return [self.source.chunk(r) for r in self.ranges[i]]
        return self.source.chunk(self.ranges[i])


# ---------------------------------------------------------------------------------------------
# The work unit


@dataclass(frozen=True)
class ChunkContext:
    mechanisms: tuple[str, ...]
    epsilons: tuple[float, ...]
    trials: int
    seed: int
    exact: frozenset[str]  # mechanisms evaluated from exact probabilities (--exact and available)
    params: dict[str, dict[str, float]]  # per mechanism


@dataclass
class ChunkResult:
    start: int
    user_ids: np.ndarray
    count: np.ndarray
    spearman: np.ndarray  # (B,)
    weighted: np.ndarray  # (B,)
    mse: np.ndarray  # (B, M, E)
    mean_selected: np.ndarray  # (B, M, E)
    exact: np.ndarray  # (M,) bool: exact probabilities were used


def _select(name: str, q: np.ndarray, sens: np.ndarray, eps: float, trials: int, seed: int,
            start: int, params: dict[str, float]) -> np.ndarray:
    """select_batch for users start..start+B−1 with their GLOBAL streams SeedSequence(seed, (b,))."""
    from recsvc.mechanisms import select_batch

    # rnmh can only be in the list when the caller named it explicitly (it is reference-only).
    return select_batch(name, q, sens, eps, trials, seed, user_offset=start,
                        allow_non_private=(name == "rnmh"), **params)


def evaluate_chunk(chunk: Chunk, ctx: ChunkContext) -> ChunkResult:
    """Every metric for one chunk of users. Pure: depends only on (chunk, ctx)."""
    from recsvc.mechanisms import probabilities

    q, sens, count = chunk.scores, chunk.sensitivities, chunk.count
    B, M, E = q.shape[0], len(ctx.mechanisms), len(ctx.epsilons)
    mse = np.empty((B, M, E))
    mean_sel = np.empty((B, M, E))
    exact_used = np.zeros(M, dtype=bool)
    # Users with equal candidate counts form runs; each run is one batched call on unpadded arrays.
    bounds = np.flatnonzero(np.diff(count)) + 1
    runs = np.split(np.arange(B), bounds)
    for mi, name in enumerate(ctx.mechanisms):
        params = ctx.params.get(name, {})
        use_exact = name in ctx.exact
        exact_used[mi] = use_exact
        for ei, eps in enumerate(ctx.epsilons):
            for run in runs:
                if len(run) == 0:
                    continue
                c = int(count[run[0]])
                qr, sr = q[run, :c], np.ascontiguousarray(sens[run, :c])
                if use_exact:
                    for b, row in zip(run, range(len(run))):
                        p = probabilities(name, qr[row], sr[row], eps, **params)
                        mse[b, mi, ei], mean_sel[b, mi, ei] = metrics.expected_stats(qr[row], p)
                else:
                    sel = _select(name, qr, sr, eps, ctx.trials, ctx.seed, chunk.start + int(run[0]), params)
                    mse[run, mi, ei], mean_sel[run, mi, ei] = metrics.selected_stats(qr, np.asarray(sel))
    return ChunkResult(
        chunk.start, chunk.user_ids, count,
        spearman_rows(q, sens, count), metrics.weighted_correlation(q, sens, count),
        mse, mean_sel, exact_used,
    )


# ---------------------------------------------------------------------------------------------
# In-order reduction


@dataclass
class EvalResult:
    """Aggregates of one run; per-user tables are in ``out`` as Parquet."""

    config: EvalConfig
    dataset: str
    mechanisms: tuple[str, ...]
    epsilons: tuple[float, ...]
    users: int
    mse: pl.DataFrame  # mechanism, epsilon, mse_mean, ci_low, ci_high, users, method
    correlation: dict[str, Any]
    log_ratio: pl.DataFrame  # epsilon, mean, median-free summary, users_defined, users_undefined
    hist_edges: np.ndarray
    hist_spearman: np.ndarray
    hist_weighted: np.ndarray
    scatter: pl.DataFrame  # sample of users: spearman, weighted, log_ratio at ratio_epsilon
    ratio_epsilon: float
    seconds: float
    out: Path | None = None
    notes: list[str] = field(default_factory=list)

    def winners(self) -> list[tuple[float, str, bool | None]]:
        """(ε, best mechanism by mean MSE, whether its CI is clear of the runner-up's; None = no CI)."""
        rows = []
        for eps in self.epsilons:
            t = self.mse.filter(pl.col("epsilon") == eps).sort("mse_mean")
            if t.height == 0:
                continue
            best = t.row(0, named=True)
            if t.height < 2:
                clear: bool | None = True
            else:
                hi, lo = best["ci_high"], t.row(1, named=True)["ci_low"]
                clear = None if not (math.isfinite(hi) and math.isfinite(lo)) else bool(hi < lo)
            rows.append((eps, best["mechanism"], clear))
        return rows


class _Reducer:
    def __init__(self, mechanisms, epsilons, total: int, seed: int, ratio_eps_idx: int, tmp: Path | None) -> None:
        self.mechanisms, self.epsilons = mechanisms, epsilons
        M, E = len(mechanisms), len(epsilons)
        self.mse = RunningMean((M, E))
        self.ratio = RunningMean((E,))
        self.ratio_undefined = np.zeros(E, dtype=np.int64)
        self.edges = np.linspace(-1.0, 1.0, HIST_BINS + 1)
        self.h_s = np.zeros(HIST_BINS, dtype=np.int64)
        self.h_w = np.zeros(HIST_BINS, dtype=np.int64)
        self.pos = {"spearman": 0, "weighted": 0}
        self.undefined = {"spearman": 0, "weighted": 0}
        self.corr_mean = RunningMean((2,))
        self.users = 0
        self.exact = np.zeros(M, dtype=bool)
        rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(2**31,)))
        pick = rng.choice(total, SCATTER_USERS, replace=False) if total > SCATTER_USERS else np.arange(total)
        self.scatter_pick = np.sort(pick)
        self.scatter: list[pl.DataFrame] = []
        self.ratio_eps_idx = ratio_eps_idx
        self.has_ratio = "gem" in mechanisms and "mgem" in mechanisms
        self.gi = mechanisms.index("gem") if self.has_ratio else -1
        self.mi = mechanisms.index("mgem") if self.has_ratio else -1
        self.writers: dict[str, pq.ParquetWriter] = {}
        self.tmp = tmp

    def _write(self, name: str, df: pl.DataFrame) -> None:
        if self.tmp is None:
            return
        table = df.to_arrow()
        if name not in self.writers:
            self.writers[name] = pq.ParquetWriter(self.tmp / f"{name}.parquet", table.schema)
        self.writers[name].write_table(table)

    def add(self, r: ChunkResult) -> None:
        B = len(r.user_ids)
        idx = np.arange(r.start, r.start + B)
        self.users += B
        self.exact |= r.exact
        self.mse.add(r.mse)
        for key, vals, hist in (("spearman", r.spearman, self.h_s), ("weighted", r.weighted, self.h_w)):
            ok = np.isfinite(vals)
            self.undefined[key] += int((~ok).sum())
            self.pos[key] += int((vals[ok] > 0).sum())
            hist += np.histogram(vals[ok], bins=self.edges)[0]
        self.corr_mean.add(np.stack([r.spearman, r.weighted], axis=1))
        lr = None
        if self.has_ratio:
            lr = metrics.log_ratio(r.mean_selected[:, self.mi, :], r.mean_selected[:, self.gi, :])  # (B, E)
            self.ratio.add(lr)
            self.ratio_undefined += (~np.isfinite(lr)).sum(axis=0)
        users = pl.DataFrame({
            "user_index": idx, "user_id": r.user_ids.astype(str), "n_candidates": r.count.astype(np.int64),
            "spearman": r.spearman, "weighted_correlation": r.weighted,
        })
        self._write("users", users)
        M, E = len(self.mechanisms), len(self.epsilons)
        self._write("selections", pl.DataFrame({
            "user_index": np.repeat(idx, M * E),
            "mechanism": np.tile(np.repeat(np.array(self.mechanisms), E), B),
            "epsilon": np.tile(np.array(self.epsilons, dtype=np.float64), B * M),
            "mse": r.mse.reshape(-1), "mean_selected": r.mean_selected.reshape(-1),
        }))
        if lr is not None:
            self._write("log_ratio", pl.DataFrame({
                "user_index": np.repeat(idx, E), "epsilon": np.tile(np.array(self.epsilons, dtype=np.float64), B),
                "log_ratio_mgem_gem": lr.reshape(-1),
            }))
        keep = np.isin(idx, self.scatter_pick)
        if keep.any():
            self.scatter.append(pl.DataFrame({
                "user_index": idx[keep], "spearman": r.spearman[keep], "weighted_correlation": r.weighted[keep],
                "log_ratio": lr[keep, self.ratio_eps_idx] if lr is not None else np.full(int(keep.sum()), np.nan),
            }))

    def close(self) -> None:
        for acc in (self.mse, self.ratio, self.corr_mean):
            acc.flush()
        for w in self.writers.values():
            w.close()


# ---------------------------------------------------------------------------------------------
# Running


def _has_exact(name: str) -> bool:
    """Whether the mechanism has exact probabilities (SPEC §2: not rs, rs_improved, rnmh, …)."""
    from recsvc.mechanisms import probabilities

    try:
        probabilities(name, np.array([0.0, 1.0]), np.array([1.0, 1.0]), 1.0)
    except NotImplementedError:
        return False
    return True


def _context(cfg: EvalConfig, mechanisms: tuple[str, ...]) -> ChunkContext:
    shared = {"beta": cfg.beta, "gamma": cfg.gamma, "corr_budget_fraction": cfg.corr_budget_fraction}
    params = {m: {k: shared[k] for k in _PARAMS_OF.get(m, ()) if shared[k] is not None} for m in mechanisms}
    exact = frozenset(m for m in mechanisms if _has_exact(m)) if cfg.exact else frozenset()
    return ChunkContext(mechanisms, tuple(float(e) for e in cfg.epsilons), int(cfg.trials), int(cfg.seed), exact, params)


def _source(cfg: EvalConfig):
    if cfg.artifacts is not None:
        return _ArtifactSource(Path(cfg.artifacts), cfg.users)
    return _ScenarioSource(str(cfg.scenario), cfg.n, cfg.users, cfg.seed, cfg.level)


def run(cfg: EvalConfig) -> EvalResult:
    """Validates everything, evaluates all users, writes ``cfg.out`` atomically (if set)."""
    mechanisms = validate(cfg)
    # A missing / corrupt artifact or a bad scenario size fails here, before any work.
    return _evaluate(cfg, mechanisms, _source(cfg))


def _evaluate(cfg: EvalConfig, mechanisms: tuple[str, ...], source: Any) -> EvalResult:
    """:func:`run` after validation, on the already built data source."""
    from recsvc.engines import chunk_ranges, make_engine

    cfg = replace(cfg, chunk_size=_chunk_size(cfg, source.total))  # the report records the size used
    ctx = _context(cfg, mechanisms)
    ranges = chunk_ranges(source.total, cfg.chunk_size)
    eps = ctx.epsilons
    ratio_idx = int(np.argmin(np.abs(np.log(np.array(eps)) - math.log(cfg.ratio_epsilon))))
    engine = make_engine(cfg.engine, cfg.workers, cfg.scheduler, progress=cfg.progress)  # validates, no I/O
    try:
        with _staged(cfg) as stage:  # only now, after every check, is anything written
            red = _Reducer(mechanisms, eps, source.total, cfg.seed, ratio_idx, None if stage is None else stage.tmp)
            t0 = time.perf_counter()
            for res in engine.map(evaluate_chunk, _LazyChunks(source, ranges), ctx, desc=f"eval {source.name}",
                                  unit="user", sizes=[len(r) for r in ranges]):
                red.add(res)
            red.close()
            result = _finish(cfg, source.name, mechanisms, red, time.perf_counter() - t0)
            if stage is not None:
                _write_outputs(result, stage.tmp)
                result.out = stage.publish()
            return result
    finally:
        engine.close()


@contextmanager
def _staged(cfg: EvalConfig) -> Iterator[StagedDir | None]:
    """``cfg.out``'s staging directory (None without ``--out``): published by the caller, removed
    with the parents it created if the run fails."""
    if cfg.out is None:
        yield None
        return
    with StagedDir(cfg.out, cfg.force, protect=_protected(cfg)) as stage:
        yield stage


def _finish(cfg: EvalConfig, dataset: str, mechanisms, red: _Reducer, seconds: float) -> EvalResult:
    mean, half = red.mse.ci()
    rows = []
    for mi, m in enumerate(mechanisms):
        method = "exact" if red.exact[mi] else "monte-carlo"
        for ei, e in enumerate(red.epsilons):
            rows.append((m, e, mean[mi, ei], mean[mi, ei] - half[mi, ei], mean[mi, ei] + half[mi, ei],
                         int(red.mse.n[mi, ei]), method))
    mse = pl.DataFrame(rows, schema={"mechanism": pl.String, "epsilon": pl.Float64, "mse_mean": pl.Float64,
                                     "ci_low": pl.Float64, "ci_high": pl.Float64, "users": pl.Int64,
                                     "method": pl.String}, orient="row")
    rmean, rhalf = red.ratio.ci()
    log_ratio = pl.DataFrame({
        "epsilon": np.array(red.epsilons, dtype=np.float64), "mean_log_ratio": rmean,
        "ci_low": rmean - rhalf, "ci_high": rmean + rhalf,
        "users_defined": red.ratio.n.astype(np.int64), "users_undefined": red.ratio_undefined,
    }) if red.has_ratio else pl.DataFrame()
    cmean, _ = red.corr_mean.ci()
    n = max(red.users, 1)
    correlation = {
        "users": red.users,
        "spearman": {"mean": float(cmean[0]), "frac_positive": red.pos["spearman"] / n,
                     "undefined": red.undefined["spearman"]},
        "weighted": {"mean": float(cmean[1]), "frac_positive": red.pos["weighted"] / n,
                     "undefined": red.undefined["weighted"]},
    }
    notes = []
    if cfg.exact:
        mc = [m for mi, m in enumerate(mechanisms) if not red.exact[mi]]
        if mc:
            notes.append(f"--exact: no exact probabilities for {', '.join(mc)}; used Monte Carlo with "
                         f"{cfg.trials} trials for them")
    if any(m == "rnmh" for m in mechanisms):
        notes.append("rnmh is NOT differentially private (paper §IV-A); shown for reference only")
    scatter = pl.concat(red.scatter) if red.scatter else pl.DataFrame()
    return EvalResult(cfg, dataset, mechanisms, red.epsilons, red.users, mse, correlation, log_ratio,
                      red.edges, red.h_s, red.h_w, scatter, red.epsilons[red.ratio_eps_idx], seconds, notes=notes)


def _write_outputs(result: EvalResult, tmp: Path) -> None:
    from eval import plots, report

    result.mse.write_parquet(tmp / "mse.parquet")
    result.mse.write_csv(tmp / "mse.csv")
    if result.log_ratio.height:
        result.log_ratio.write_parquet(tmp / "log_ratio_summary.parquet")
        result.log_ratio.write_csv(tmp / "log_ratio_summary.csv")
    pl.DataFrame({"bin_low": result.hist_edges[:-1], "bin_high": result.hist_edges[1:],
                  "spearman_users": result.hist_spearman, "weighted_users": result.hist_weighted}
                 ).write_csv(tmp / "correlation_histogram.csv")
    plots.write_all(result, tmp)
    cfg = {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(result.config).items()}
    summary = {"dataset": result.dataset, "users": result.users, "mechanisms": list(result.mechanisms),
               "epsilons": list(result.epsilons), "correlation": result.correlation, "config": cfg,
               "winners": [{"epsilon": e, "mechanism": m, "clear": c} for e, m, c in result.winners()],
               "seconds": result.seconds, "notes": result.notes}
    (tmp / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    (tmp / "report.md").write_text(report.markdown(result))


def summary(result: EvalResult | SweepResult) -> tuple[str, Path | None]:
    """The short text summary for the terminal/demo and the path of ``report.md`` (if written)."""
    from eval import report

    text = report.sweep_summary_text(result) if isinstance(result, SweepResult) else report.summary_text(result)
    return text, (result.out / "report.md" if result.out else None)


# ---------------------------------------------------------------------------------------------
# Figure 10: the sweep scenario at every level, one results directory


SWEEP_CSV = "sweep.csv"
SWEEP_PARQUET = "sweep.parquet"


@dataclass(frozen=True)
class SweepLevel:
    """One level t of the sweep: its instances' correlation, the first instance (for the
    scatter) and the full single-level evaluation over all instances."""

    level: float
    spearman: float  # median over instances of Spearman ρ(q, Δ)
    scores: np.ndarray  # (n,) the first instance's scores
    sensitivities: np.ndarray  # (n,) and its Δ
    result: EvalResult

    @property
    def dirname(self) -> str:
        return level_dirname(self.level)


@dataclass
class SweepResult:
    """Every level of the sweep; ``table`` has one row per level × mechanism × ε."""

    config: EvalConfig
    levels: list[SweepLevel]
    table: pl.DataFrame  # level, spearman, mechanism, epsilon, mse, mse_rel_rnm, method
    seconds: float
    out: Path | None = None

    @property
    def mechanisms(self) -> tuple[str, ...]:
        return self.levels[0].result.mechanisms

    @property
    def epsilons(self) -> tuple[float, ...]:
        return self.levels[0].result.epsilons

    @property
    def has_rnm(self) -> bool:
        return "rnm" in self.mechanisms

    def best_at(self, eps: float) -> list[tuple[SweepLevel, str, float, float]]:
        """Per level: (level, best mechanism by mean MSE at ε, its MSE, its MSE ÷ RNM's (NaN without rnm))."""
        rows = []
        for lv in self.levels:
            mech = next(m for e, m, _ in lv.result.winners() if e == eps)
            row = self.table.filter((pl.col("level") == lv.level) & (pl.col("epsilon") == eps)
                                    & (pl.col("mechanism") == mech)).row(0, named=True)
            rows.append((lv, mech, row["mse"], row["mse_rel_rnm"]))
        return rows


def level_dirname(level: float) -> str:
    """``t-5``, ``t-0.8``, ``t0`` …: a level's sub-directory (and −0.0 is ``t0``)."""
    return f"t{float(level) + 0.0:g}"


def _check_levels(cfg: EvalConfig, levels: Sequence[float]) -> tuple[float, ...]:
    if cfg.level is not None:
        raise ValueError(f"run_sweep takes the levels as its argument; expected cfg.level None, got {cfg.level!r}")
    if not levels:
        raise ValueError("no sweep level given; expected at least one t")
    for t in levels:
        if isinstance(t, bool) or not (isinstance(t, (int, float)) and math.isfinite(t)):
            raise ValueError(f"sweep level must be a finite number, got {t!r}")
    names = [level_dirname(t) for t in levels]
    if len(set(names)) != len(names):
        raise ValueError(f"sweep levels must be distinct (as directory names), got {list(levels)}")
    return tuple(float(t) for t in levels)


def run_sweep(cfg: EvalConfig, levels: Sequence[float] | None = None) -> SweepResult:
    """Figure 10: one evaluation per sweep level (default the paper's seven) with the same seed,
    so each level equals a single run with the same flags. Everything is checked once before any
    work; ``cfg.out`` gets ``t<level>/`` per level, ``sweep.csv``/``.parquet``, ``sweep.png`` and
    ``report.md``, written to a temp sibling and renamed into place only when all levels are done."""
    from eval.scenarios import SWEEP_LEVELS

    levels = _check_levels(cfg, SWEEP_LEVELS if levels is None else levels)
    # Flags, mechanisms and --out; --level needs the sweep scenario.
    mechanisms = validate(replace(cfg, level=levels[0]))
    sources = [_source(replace(cfg, level=t)) for t in levels]  # a bad --n / --users fails here
    t0 = time.perf_counter()
    with _staged(cfg) as stage:
        done = []
        for t, source in zip(levels, sources):
            sub = None if stage is None else stage.tmp / level_dirname(t)
            res = _evaluate(replace(cfg, level=t, out=sub, force=False), mechanisms, source)
            q0, d0 = source.sc.row(0)
            done.append(SweepLevel(t, float(np.median(source.sc.correlation())), q0, d0, res))
        result = SweepResult(cfg, done, sweep_table(done), time.perf_counter() - t0)
        if stage is not None:
            _write_sweep_outputs(result, stage.tmp)
            result.out = stage.publish()
            for lv in done:
                lv.result.out = result.out / lv.dirname
        return result


def sweep_table(levels: Sequence[SweepLevel]) -> pl.DataFrame:
    """One row per level × mechanism × ε; ``mse_rel_rnm`` = MSE ÷ RNM's MSE at that ε (NaN without rnm)."""
    frames = []
    for lv in levels:
        mse = lv.result.mse
        rnm = dict(mse.filter(pl.col("mechanism") == "rnm").select("epsilon", "mse_mean").iter_rows())
        ref = np.array([rnm.get(e, np.nan) for e in mse["epsilon"].to_list()], dtype=np.float64)
        with np.errstate(invalid="ignore", divide="ignore"):
            rel = mse["mse_mean"].to_numpy() / ref
        frames.append(pl.DataFrame({
            "level": np.full(mse.height, lv.level), "spearman": np.full(mse.height, lv.spearman),
            "mechanism": mse["mechanism"], "epsilon": mse["epsilon"], "mse": mse["mse_mean"],
            "mse_rel_rnm": rel, "method": mse["method"],
        }))
    return pl.concat(frames)


def _write_sweep_outputs(result: SweepResult, tmp: Path) -> None:
    from eval import plots, report

    result.table.write_csv(tmp / SWEEP_CSV)
    result.table.write_parquet(tmp / SWEEP_PARQUET)
    plots.sweep_figure(result, tmp / plots.SWEEP_PNG)
    (tmp / "report.md").write_text(report.sweep_markdown(result))
