"""Refactors keep behaviour: a tiny synthetic artifact and an eval run on it hash to recorded bytes.

Only wall-clock times (the manifest's timings, the report's run time, the summary's seconds) and
the summary's echo of the run's own config are left out; everything else, data files and the manifest's content included, must
match to the byte. If a change is MEANT to change these outputs, re-record the hashes in the
same commit and say why there.
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

RECSVC = str(Path(sys.executable).with_name("recsvc"))

ARTIFACT_FILES = {
    "candidates.parquet": "7dc044a2175ee6343e29acf732c703fb8437a821899ad9a57bd32ce155faa9f6",
    "items.parquet": "3f1d0244a83b6ea63c98380f9ac807fbda10ec412e390fd1216e85d110ec2323",
    "model/W1.npz": "e485c1e31a3564332b1552c90dd563f9c7d8a87b4b8ab4f2a9469a45b29cba20",
    "model/W2.npz": "f76c106bce16460cb84d9fb60ae8ee7eb35fee817215d2a4713025042590af6b",
    "model/items.parquet": "6314536692de7ac5a3f65a3784c61f7d18509cb818c93b1f6ea44f6ab578ba20",
    "test_inputs.parquet": "f75ff828be6b89c702b7b6c1ccb04f4a5bd14d18eb673607fa4e8ea24628e0b7",
    "test_targets.parquet": "c05caaf9802845ac48cd6ef7c4b6b445a12a9f186c10204ee364c4a7724cf32a",
}
# The manifest's files map lists every data file (test_inputs.parquet, test_targets.parquet, policy.parquet,
# population.parquet, client/ and multiselect/ included), and the manifest holds the policy and
# multiselect sections.
MANIFEST_WITHOUT_TIMINGS = "1c5eb7a301ae169b68839a377cd51977f79cb12b83da43221456501cc6d92271"
RESULT_FILES = {
    "correlation_histogram.csv": "7a5bca009369c3edd77a57b534552d19f525275ec0101bc52ce3f59b21b650dc",
    "log_ratio.parquet": "1c950c1ce576527249591e5d2eadc3d47e118878510f2414e8d61d42809fc00f",
    "log_ratio_summary.csv": "85f6bf0fbf2476d3b67f8ca291d9fc13f83675d87e76a6c5b963c3f52110737b",
    "log_ratio_summary.parquet": "bae5c2776a9c1eca46ec199a52fe505d15dcbe3a08a3c4336182e733183356d7",
    "mse.csv": "cba6c0eab0ccfdbdd89a57a102350716ac1c223ec83f168f0c37358a3975c73a",
    "mse.parquet": "05d12e4c364079a77867fa2a3cd3f9c4c545d7543eb7f49e02744b4e98091747",
    "selections.parquet": "904ec41c2982d5f055f9828be892a8a5d03c1eb8c5e018ddeb9e319c726a89af",
    "users.parquet": "816a779735429c02a82183cd4536bd6e4226b5620afe5bbc5fdb4fd47055e220",
}
# mse.*, selections.parquet, the report and the summary include the `auto` rows, section and entry.
REPORT_WITHOUT_SECONDS = "884bc826ffe887a6cea4c8625dccc63a117446f6bd0ef02cde2c54bc29cfcd6f"
SUMMARY_WITHOUT_CONFIG = "2d23c5cd1b99d25622e0474eb4134e06e1786c2ef41c5e7b1f67a5aa578de7ad"


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _json_sha(obj: object) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> tuple[Path, Path]:
    work = tmp_path_factory.mktemp("unchanged")

    def run(*a: str) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run([RECSVC, *a], cwd=work, check=True, capture_output=True)

    run("prep", "--dataset", "synthetic", "--preset", "tiny", "--out", "a")
    run(
        "eval",
        "--artifacts",
        "a",
        "--out",
        "r",
        "--trials",
        "5",
        "--epsilons",
        "0.1",
        "1",
        "--seed",
        "3",
        "--workers",
        "1",
    )
    return work / "a", work / "r"


def test_artifact_bytes_are_unchanged(runs):
    art, _ = runs
    assert {rel: _sha(art / rel) for rel in ARTIFACT_FILES} == ARTIFACT_FILES
    manifest = json.loads((art / "manifest.json").read_text())
    manifest.pop("timings_s")
    assert _json_sha(manifest) == MANIFEST_WITHOUT_TIMINGS


def test_eval_results_are_bit_identical(runs):
    _, res = runs
    assert {rel: _sha(res / rel) for rel in RESULT_FILES} == RESULT_FILES
    report = re.sub(r"; [0-9.]+ s\.$", "; <seconds> s.", (res / "report.md").read_text(), count=1, flags=re.M)
    assert hashlib.sha256(report.encode()).hexdigest() == REPORT_WITHOUT_SECONDS
    summary = json.loads((res / "summary.json").read_text())
    summary.pop("seconds")
    summary.pop("config")
    assert _json_sha(summary) == SUMMARY_WITHOUT_CONFIG
