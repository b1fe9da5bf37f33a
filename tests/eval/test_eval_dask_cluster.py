"""`recsvc eval --scheduler` on a real Dask cluster (a scheduler and two worker processes) writes
the same result tables as the local engine."""

from __future__ import annotations

from pathlib import Path

import polars as pl

from eval.testing import make_artifact
from recsvc.app.cli import main as recsvc_main

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
    """Both runs call the command's main in this process; the cluster's workers are processes of their own."""
    art = make_artifact(tmp_path / "art", users=12, n=20)
    assert recsvc_main(["eval", "--artifacts", str(art), *ARGS, "--workers", "1", "--out", str(tmp_path / "l")]) == 0
    remote = ["eval", "--artifacts", str(art), *ARGS, "--scheduler", dask_scheduler, "--out", str(tmp_path / "d")]
    assert recsvc_main(remote) == 0
    for name in ("selections", "users", "mse"):
        ref = pl.read_parquet(tmp_path / "l" / f"{name}.parquet")
        assert ref.height > 0
        assert pl.read_parquet(tmp_path / "d" / f"{name}.parquet").equals(ref), name
