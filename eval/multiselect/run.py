"""`recsvc eval-multiselect --artifacts`: runs :mod:`eval.multiselect.eval` over each artifact's
test users on an engine; eval.study writes ``multiselect.csv``, the plots and ``report.md`` atomically."""

from __future__ import annotations

import math
import time
from contextlib import closing
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import polars as pl

from eval.metrics import RunningMean
from eval.multiselect import plots
from eval.multiselect.data import DatasetConfig, DatasetSource, validate
from eval.multiselect.eval import (
    MEASURES,
    SELECT_CANDIDATES,
    TRUST,
    AutoPolicy,
    Context,
    evaluate_chunk,
    rows,
)
from eval.study import Output, Study, execute

CSV = "multiselect.csv"
REPORT = "report.md"  # written by eval.study
SCHEMA = {
    "dataset": pl.String,
    "mode": pl.String,
    "mechanism": pl.String,
    "end_to_end_dp": pl.Boolean,
    "k": pl.Int64,
    "epsilon": pl.Float64,
    "users": pl.Int64,
    **{f"{m}{s}": pl.Float64 for m in MEASURES for s in ("", "_ci")},
}


@dataclass
class DatasetResult:
    config: DatasetConfig
    table: pl.DataFrame
    seconds: float
    users: dict[str, int]  # dataset → users evaluated
    out: Path | None = None


def _mechanism(mode: str, eps: float, auto: AutoPolicy, catalog: int) -> str:
    """The CSV's mechanism column. For Select, what `auto` runs among a full top 500 (a user with
    fewer candidates could resolve otherwise; the run uses each user's own count)."""
    if mode == "recommend-auto":
        return auto.choose(eps, catalog)[0]
    if mode == "select-top500-auto":
        return auto.choose(eps, min(SELECT_CANDIDATES, catalog))[0]
    labels = {"multiselect": "greedy", "multiselect-baseline": "top-k for the signal", "multiselect-code": "greedy"}
    return labels.get(mode, "argmax")


def _evaluate(cfg: DatasetConfig, source: DatasetSource) -> pl.DataFrame:
    from eval.evaluation.sources import LazyChunks
    from recsvc.engines import chunk_ranges, make_engine

    ctx = Context.of(source, cfg.ks, cfg.epsilons, cfg.trials, cfg.seed)
    keys = rows(ctx.ks, ctx.epsilons)
    acc = RunningMean((len(keys), len(MEASURES)))
    ranges = chunk_ranges(source.total, cfg.chunk_size)
    with closing(make_engine("local", cfg.workers, progress=cfg.progress)) as engine:
        for res in engine.map(
            evaluate_chunk,
            LazyChunks(source, ranges),  # type: ignore[arg-type]  # any source with .chunk(range)
            ctx,
            desc=f"eval-multiselect {source.name}",
            unit="user",
            sizes=[len(r) for r in ranges],
        ):
            acc.add(res)
    acc.flush()
    mean, half = acc.ci()
    out = []
    for i, r in enumerate(keys):
        mechanism = _mechanism(r.mode, r.epsilon, ctx.auto, source.artifact.items.height)
        e2e = r.mode not in ("select-top500-auto", "nonprivate")
        cells = (float(x) for pair in zip(mean[i], half[i], strict=True) for x in pair)  # each measure, then its CI
        out.append((source.name, r.mode, mechanism, e2e, r.k, r.epsilon, int(acc.n[i, 0]), *cells))
    return pl.DataFrame(out, schema=SCHEMA, orient="row")


def compute(cfg: DatasetConfig) -> DatasetResult:
    """Opens every artifact (all its checks before any output), then evaluates."""
    sources = [DatasetSource(a, cfg.users, cfg.ks) for a in cfg.artifacts]
    for s in sources:  # `auto` resolves, or the run stops here, before any output
        AutoPolicy.of(s).choose(cfg.epsilons[0], s.artifact.items.height)
    names = [s.name for s in sources]
    if len(set(names)) != len(names):
        raise ValueError(f"--artifacts: two artifacts of the same dataset {names}; expected one per dataset")
    t0 = time.perf_counter()
    table = pl.concat([_evaluate(cfg, s) for s in sources])
    return DatasetResult(cfg, table, time.perf_counter() - t0, {s.name: s.total for s in sources})


def _fmt(x: float, ci: float, pct: bool = True) -> str:
    if not math.isfinite(x):
        return "–"
    return f"{100 * x:.1f} ± {100 * ci:.1f}" if pct else f"{x:.3g} ± {ci:.2g}"


def headline(table: pl.DataFrame, epsilon: float = 1.0) -> list[str]:
    """Per dataset at ε (nearest in the grid): each mode's utility fraction, multi-selection at
    each k: the numbers the companion paper's 97 % / 91 % compare to."""
    lines = []
    for (name,) in table.select("dataset").unique(maintain_order=True).iter_rows():
        t = table.filter(pl.col("dataset") == name)
        grid = sorted(set(t.filter(pl.col("epsilon").is_finite() & (pl.col("epsilon") > 0))["epsilon"].to_list()))
        eps = min(grid, key=lambda e: abs(math.log(e) - math.log(epsilon)))
        at = t.filter(pl.col("epsilon") == eps)
        parts = []
        for mode, label in (
            ("multiselect-code", "code greedy"),
            ("multiselect", "lattice greedy"),
            ("multiselect-baseline", "baseline"),
        ):
            m = at.filter(pl.col("mode") == mode).sort("k")
            parts.append(
                f"{label} "
                + ", ".join(f"k={k} {100 * u:.1f}%" for k, u in m.select("k", "utility_fraction").iter_rows())
            )
        for mode in ("recommend-auto", "select-top500-auto"):
            u = at.filter(pl.col("mode") == mode)["utility_fraction"]
            parts.append(f"{mode} {100 * u[0]:.1f}%")
        lines.append(f"{name} at ε = {eps:g}, utility fraction: " + "; ".join(parts))
    return lines


def report(result: DatasetResult) -> str:
    """report.md's body: how the run was made, and one table per dataset (values in %, MSE as is)."""
    cfg = result.config
    lines = [
        f"`recsvc eval-multiselect` on {', '.join(f'{n} ({u} test users)' for n, u in result.users.items())}; "
        f"ε ∈ {{{', '.join(f'{e:g}' for e in cfg.epsilons)}}}, k ∈ {{{', '.join(map(str, cfg.ks))}}}, "
        f"{cfg.trials} signals (and selections) per user and ε, seed {cfg.seed}; {result.seconds:.0f} s.",
        "",
        "Each cell is the mean over users ± the half-width of its normal 95% CI. Utility fraction and "
        "hit rate in %. ε = inf is the response to the noise-free embedding (the embedding's ceiling); "
        "ε = 0 is the greedy response to no signal (the same k items for every user).",
        "",
        *(f"- `{m}`: {t}" for m, t in TRUST.items()),
        "",
        *(f"- {line}" for line in headline(result.table)),
    ]
    for (name,) in result.table.select("dataset").unique(maintain_order=True).iter_rows():
        t = result.table.filter(pl.col("dataset") == name)
        lines += [
            "",
            f"## {name}",
            "",
            "| mode | mechanism | k | ε | utility fraction | hit rate | MSE |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in t.iter_rows(named=True):
            lines.append(
                f"| {r['mode']} | {r['mechanism']} | {r['k']} | {r['epsilon']:g} | "
                f"{_fmt(r['utility_fraction'], r['utility_fraction_ci'])} | {_fmt(r['hit_rate'], r['hit_rate_ci'])} | "
                f"{_fmt(r['mse'], r['mse_ci'], pct=False)} |"
            )
    return "\n".join(lines) + "\n"


def summary(result: DatasetResult) -> str:
    lines = [
        f"eval-multiselect: {result.table.height} rows over {', '.join(f'{n} ({u} users)' for n, u in result.users.items())} "
        f"in {result.seconds:.1f} s",
        *headline(result.table),
    ]
    if result.out is not None:
        lines.append(f"written: {result.out / CSV}, {result.out / REPORT}, {plots.UTILITY_PNG}, {plots.HIT_RATE_PNG}")
    return "\n".join(lines)


STUDY = Study(
    title="Multi-selection against the central modes",
    config=DatasetConfig,
    run=compute,
    outputs=(Output(CSV, lambda r: r.table, SCHEMA),),
    report=report,
    plots=lambda r: plots.dataset_figures(r.table),
    validate=validate,
)

run_datasets = partial(execute, STUDY)
