"""Synthetic implicit-feedback data with power-law item popularity and user activity.

For scale and speed work, not accuracy claims. Items fall into latent clusters and each user
draws most of their items from one cluster (popularity-weighted), so SANSA has structure to
learn; the rest come from global popularity. Everything is vectorised and seeded.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import polars as pl

from data_prep.datasets.base import Interactions
from recsvc.checks import ParamError


@dataclass(frozen=True)
class SyntheticConfig:
    users: int
    items: int
    interactions: int  # drawn with replacement; duplicates that top-up rounds cannot replace are dropped
    test_users: int
    val_users: int
    item_exponent: float = 1.0  # popularity ∝ rank^-exponent
    user_exponent: float = 1.5  # Pareto shape of user activity
    clusters: int = 50
    in_cluster: float = 0.7  # share of a user's items drawn from their own cluster
    min_per_user: int = 5


PRESETS: dict[str, SyntheticConfig] = {
    "ml20m-shape": SyntheticConfig(136_677, 20_720, 11_500_000, 10_000, 10_000),
    "small": SyntheticConfig(5_000, 2_000, 250_000, 500, 500, clusters=20),
    "tiny": SyntheticConfig(400, 150, 12_000, 60, 60, clusters=5),
}


def config_for(preset: str, users: int | None, items: int | None, interactions: int | None) -> SyntheticConfig:
    """The preset's sizes, overridden by the sizes that are given (None: the preset's; 0 is an error)."""
    if preset not in PRESETS:
        raise ParamError(
            "unknown synthetic preset {name}; expected {preset} one of {names}",
            name=repr(preset),
            names=", ".join(PRESETS),
        )
    for param, value in (("users", users), ("items", items), ("interactions", interactions)):
        if value is not None and value < 1:  # `value or default` would turn 0 into the default silently
            raise ParamError(f"{{{param}}} must be ≥ 1, got {{value}}", value=value)
    base = PRESETS[preset]
    cfg = replace(
        base,
        users=base.users if users is None else users,
        items=base.items if items is None else items,
        interactions=base.interactions if interactions is None else interactions,
    )
    if cfg.items < 4 * cfg.min_per_user:
        raise ParamError(
            "synthetic data needs {items} ≥ {least}, got {value}", least=4 * cfg.min_per_user, value=cfg.items
        )
    if cfg.interactions < cfg.users * cfg.min_per_user:
        raise ParamError(
            "synthetic sizes {users} {n_users} {interactions} {n_interactions} are unusable; "
            "expected {interactions} ≥ {per_user} × {users} = {least}",
            n_users=cfg.users,
            n_interactions=cfg.interactions,
            per_user=cfg.min_per_user,
            least=cfg.min_per_user * cfg.users,
        )
    return cfg


def _activity(cfg: SyntheticConfig, rng: np.random.Generator) -> np.ndarray:
    """Per-user interaction counts: Pareto-tailed, ≥ min_per_user, capped at half the catalogue."""
    raw = rng.pareto(cfg.user_exponent, cfg.users) + 1.0
    extra = cfg.interactions - cfg.min_per_user * cfg.users
    counts = cfg.min_per_user + np.floor(raw / raw.sum() * extra).astype(np.int64)
    return np.minimum(counts, cfg.items // 2)


def generate(cfg: SyntheticConfig, seed: int) -> Interactions:
    rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(0x5E17,)))
    # Item popularity by a random rank permutation; cluster membership is random too.
    pop = 1.0 / np.arange(1, cfg.items + 1) ** cfg.item_exponent
    pop = pop[rng.permutation(cfg.items)]
    cluster = rng.integers(0, cfg.clusters, cfg.items)
    order = np.argsort(cluster, kind="stable")  # items grouped by cluster
    cdf_grouped = np.cumsum(pop[order]) / pop.sum()
    # Cluster c is the CDF segment [bounds[c], bounds[c+1]) (empty if c has no items).
    starts = np.searchsorted(cluster[order], np.arange(cfg.clusters + 1), side="left")
    bounds = np.concatenate([[0.0], cdf_grouped])[starts]
    cdf_global = np.cumsum(pop) / pop.sum()

    counts = _activity(cfg, rng)

    def draw(users: np.ndarray) -> np.ndarray:
        home = user_home[users]
        u = rng.random(users.size)
        own = rng.random(users.size) < cfg.in_cluster
        # Inverse-CDF sampling: inside the user's cluster segment, or over all items.
        lo, hi = bounds[home], bounds[home + 1]
        own &= hi > lo
        pos_own = np.searchsorted(cdf_grouped, lo + u * (hi - lo), side="right")
        pos_glob = np.searchsorted(cdf_global, u, side="right")
        return np.where(own, order[np.minimum(pos_own, cfg.items - 1)], np.minimum(pos_glob, cfg.items - 1))

    user_home = rng.integers(0, cfg.clusters, cfg.users)
    pairs = pl.DataFrame(schema={"user": pl.Int64, "item": pl.Int64, "limit": pl.Int64})
    deficit = counts.copy()
    for _ in range(3):  # sampling with replacement, then top up the users that lost duplicates
        need = np.flatnonzero(deficit > 0)
        if need.size == 0:
            break
        users = np.repeat(need, deficit[need] + deficit[need] // 2 + 1)
        fresh = pl.DataFrame(
            {"user": users.astype(np.int64), "item": draw(users).astype(np.int64), "limit": counts[users]}
        )
        pairs = (
            pl.concat([pairs, fresh])
            .unique(["user", "item"], maintain_order=True)
            .filter(pl.int_range(pl.len()).over("user") < pl.col("limit"))
        )
        have = np.bincount(pairs["user"].to_numpy(), minlength=cfg.users)
        deficit = counts - have
    pairs = pairs.sort("user", maintain_order=True)

    df = pairs.select(
        pl.col("user").cast(pl.String),
        pl.col("item").cast(pl.String),
        pl.lit(5.0).alias("rating"),  # explicit "liked" ratings, so the ≥ 4 filter keeps them
    )
    return Interactions(
        df, source=f"synthetic(users={cfg.users}, items={cfg.items}, interactions={cfg.interactions}, seed={seed})"
    )
