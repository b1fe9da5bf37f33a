"""Writes synthetic rating files in the real datasets' ORIGINAL formats, at full size, for the
loaders' scale benchmark (scripts/bench/loaders.py):

* ``--format netflix``: Netflix Prize ``combined_data_1..4.txt`` (a ``MovieID:`` line, then
  ``CustomerID,Rating,Date`` lines), from the netflix-shape preset (480,189 customers with ids
  spread over 1..2,649,429 as in the Prize, 17,770 movies, 100,480,507 ratings as in the Prize);
* ``--format ml20m``: GroupLens ``ratings.csv`` (``userId,movieId,rating,timestamp``), from the
  ml20m-shape preset (20,000,263 ratings: the real file's size).

Ratings follow the Prize's overall shares of 1..5 stars (half stars for ML-20M), dates and
timestamps are uniform over the datasets' years. Everything is seeded.

    .venv/bin/python -m scripts.bench.gen_ratings --format netflix --out data/netflix-synthetic
    .venv/bin/python -m scripts.bench.gen_ratings --format ml20m --out data/ml20m-synthetic
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
import time
from pathlib import Path

import numpy as np
import polars as pl
import scipy.sparse as sp

from data_prep.datasets.synthetic import config_for, generate_matrix

STAR_SHARES = np.array([0.046, 0.101, 0.287, 0.336, 0.230])  # Netflix Prize training set, 1..5 stars
NETFLIX_MAX_CUSTOMER = 2_649_429
NETFLIX_FIRST_DAY = dt.date(1999, 11, 11)
NETFLIX_DAYS = 2_243  # … 2005-12-31


OVERDRAW = 1.4  # the generator drops 15–22% of its draws as duplicates; the surplus is trimmed


def _exactly(x: sp.csr_matrix, n: int, rng: np.random.Generator) -> sp.csr_matrix:
    """``x`` with a seeded random ``n`` of its entries kept (all if it has fewer)."""
    if x.nnz <= n:
        print(f"only {x.nnz:,} distinct ratings were drawn (asked for {n:,})", file=sys.stderr)
        return x
    keep = np.zeros(x.nnz, dtype=bool)
    keep[rng.choice(x.nnz, size=n, replace=False)] = True
    coo = x.tocoo()
    return sp.csr_matrix((coo.data[keep], (coo.row[keep], coo.col[keep])), shape=x.shape)


def _stars(rng: np.random.Generator, n: int) -> np.ndarray:
    return (rng.choice(5, size=n, p=STAR_SHARES) + 1).astype(np.int8)


def write_netflix(out: Path, ratings: int, seed: int) -> list[Path]:
    cfg = config_for("netflix-shape", None, None, int(ratings * OVERDRAW))
    rng = np.random.default_rng(seed)
    by_movie = sp.csc_matrix(_exactly(generate_matrix(cfg, seed), ratings, rng))  # users of each movie
    customer = np.sort(rng.choice(NETFLIX_MAX_CUSTOMER, size=cfg.users, replace=False) + 1)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    bounds = np.linspace(0, cfg.items, 5).astype(int)
    for part in range(4):
        lo, hi = int(bounds[part]), int(bounds[part + 1])
        start, stop = int(by_movie.indptr[lo]), int(by_movie.indptr[hi])
        n = stop - start
        per_movie = np.diff(by_movie.indptr[lo : hi + 1])
        movie_rows = np.repeat(np.arange(lo, hi), per_movie)
        # Each movie's header sits before its ratings: sort key = ratings before it + movie index.
        header_at = np.concatenate([[0], np.cumsum(per_movie)[:-1]]) + np.arange(hi - lo)
        rating_at = np.arange(n) + (movie_rows - lo) + 1
        rated = pl.DataFrame(
            {
                "at": rating_at,
                "customer": customer[by_movie.indices[start:stop]],
                "stars": _stars(rng, n),
                "day": rng.integers(0, NETFLIX_DAYS, n, dtype=np.int32),
            }
        ).select(
            "at",
            pl.concat_str(
                pl.col("customer"),
                pl.lit(","),
                pl.col("stars"),
                pl.lit(","),
                (pl.lit(NETFLIX_FIRST_DAY) + pl.duration(days=pl.col("day"))).cast(pl.String),
            ).alias("line"),
        )
        headers = pl.DataFrame({"at": header_at, "line": [f"{m + 1}:" for m in range(lo, hi)]})
        lines = pl.concat([headers, rated]).sort("at").select("line")
        path = out / f"combined_data_{part + 1}.txt"
        lines.write_csv(path, include_header=False, quote_style="never")
        paths.append(path)
        del rated, lines
    return paths


def write_ml20m(out: Path, interactions: int, seed: int) -> Path:
    users = min(136_677, interactions // 20)  # the real file's users at 20 M; fewer for small files
    cfg = config_for("ml20m-shape", users, None, int(interactions * OVERDRAW))
    rng = np.random.default_rng(seed)
    x = _exactly(generate_matrix(cfg, seed), interactions, rng).tocoo()
    half_stars = (_stars(rng, x.nnz) * 2 - rng.integers(0, 2, x.nnz)).astype(np.float32) / 2
    out.mkdir(parents=True, exist_ok=True)
    path = out / "ratings.csv"
    pl.DataFrame(
        {
            "userId": x.row.astype(np.int32) + 1,
            "movieId": x.col.astype(np.int32) + 1,
            "rating": half_stars,
            "timestamp": rng.integers(789_652_009, 1_427_784_002, x.nnz),
        }
    ).write_csv(path, float_precision=1)
    return path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--format", choices=("netflix", "ml20m"), required=True)
    ap.add_argument("--out", type=Path, required=True, help="directory to write the file(s) into")
    ap.add_argument(
        "--ratings",
        type=int,
        help="ratings to write (default: the real files' 100,480,507 for netflix, 20,000,263 for ml20m)",
    )
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    t0 = time.perf_counter()
    if args.format == "netflix":
        paths = write_netflix(args.out, args.ratings or 100_480_507, args.seed)
    else:
        paths = [write_ml20m(args.out, args.ratings or 20_000_263, args.seed)]
    size = sum(p.stat().st_size for p in paths) / 2**30
    print(f"wrote {', '.join(map(str, paths))} ({size:.2f} GiB) in {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
