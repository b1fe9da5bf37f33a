"""`recsvc prep --scheduler` on a real Dask cluster (a scheduler and two worker processes) writes
the same artifact, byte for byte, as the local engine."""

from __future__ import annotations

import json
from pathlib import Path

from recsvc.app.cli import main as recsvc_main

TINY = [
    "--dataset",
    "synthetic",
    "--preset",
    "tiny",
    "--chunk-users",
    "16",
    "--policy-users",
    "20",
    "--policy-trials",
    "5",
]


def _manifest(out: Path) -> dict:
    m = json.loads((out / "manifest.json").read_text())
    m.pop("timings_s")
    return {k: v for k, v in m.items() if k not in ("engine", "workers", "scheduler")}


def test_prep_on_a_dask_cluster_is_byte_identical_to_local(dask_scheduler: str, tmp_path: Path) -> None:
    """Both runs call the command's main in this process; the cluster's workers are processes of their own."""
    assert recsvc_main(["prep", *TINY, "--workers", "1", "--out", str(tmp_path / "local")]) == 0
    assert recsvc_main(["prep", *TINY, "--scheduler", dask_scheduler, "--out", str(tmp_path / "dask")]) == 0
    files = json.loads((tmp_path / "local" / "manifest.json").read_text())["files"]
    assert {"candidates.parquet", "items.parquet", "policy.parquet", "population.parquet"} <= set(files)
    for rel in files:
        assert (tmp_path / "dask" / rel).read_bytes() == (tmp_path / "local" / rel).read_bytes(), rel
    assert _manifest(tmp_path / "dask") == _manifest(tmp_path / "local")
