"""`recsvc eval --scheduler` on a real Dask cluster (a scheduler and two worker processes) writes
the same result tables as the local engine."""

from __future__ import annotations

from pathlib import Path

import polars as pl

from eval.testing import make_artifact
from recsvc.service.testing import run_recsvc

ARGS = [
    "--mechanisms",
    "rnm",
    "gem",
    "rs",
    "--epsilons",
    "0.1",
    "1",
    "--trials",
    "10",
    "--seed",
    "3",
    "--chunk-size",
    "4",
]


def test_eval_on_a_dask_cluster_matches_local(dask_scheduler: str, tmp_path: Path) -> None:
    art = make_artifact(tmp_path / "art", users=12, n=20)
    local = run_recsvc("eval", "--artifacts", str(art), *ARGS, "--workers", "1", "--out", str(tmp_path / "l"))
    assert local.returncode == 0, local.stderr
    remote = run_recsvc(
        "eval", "--artifacts", str(art), *ARGS, "--scheduler", dask_scheduler, "--out", str(tmp_path / "d")
    )
    assert remote.returncode == 0, remote.stderr
    for name in ("selections", "users", "mse"):
        ref = pl.read_parquet(tmp_path / "l" / f"{name}.parquet")
        assert ref.height > 0
        assert pl.read_parquet(tmp_path / "d" / f"{name}.parquet").equals(ref), name
