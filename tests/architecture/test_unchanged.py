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
    "candidates.parquet": "09f9ea6ee4d2f5353a65149b40466a01f6a9c5166e42d041b6389210f3928c2d",
    "candidates/item_index.npy": "557e70881e6decdc4966bbe726ab96a93c8b2cfb28a9404c24b5fcb3b144ac01",
    "candidates/scores.npy": "f08e7387774c205454475d135bcde7810425403ce5fd939800033f4d60bde820",
    "candidates/user_ids.npy": "cbeacb449f617eb36863bbf98bff5e604c426380abc3488ab159104e935dd09c",
    "items.parquet": "d6bdbc69d64f93dedaa7a3114709f38b16ff24c62f263d07bda79c91ae8bc351",
    "model/W1.npz": "90789c428536bf4ae002eebbb9ffd828211fa49329d23881625c28bfc7f359f8",
    "model/W2.npz": "a483263024ff6de38adf31b7ab58e1a36cba799ab9eb2bff176e18ce33643c54",
    "model/items.parquet": "6314536692de7ac5a3f65a3784c61f7d18509cb818c93b1f6ea44f6ab578ba20",
    "test_inputs.parquet": "db555f1def2f331f929c49ca9d11ebd85fd350912758433989df9295ce106661",
    "test_targets.parquet": "54762796cd057d4bb7d9b309184bb395fc2f32c0a8f107fb8e670ce3d28d0cbb",
}
# The manifest's files map lists every data file (test_inputs.parquet, test_targets.parquet, policy.parquet,
# population.parquet, candidates/, client/ and multiselect/ included), and the manifest holds the policy and
# multiselect sections.
MANIFEST_WITHOUT_TIMINGS = "222f4aef37c2acd2f2c9595bd2c259f820b70e18aaf0e172c0e4628607883095"
RESULT_FILES = {
    "correlation_histogram.csv": "28ef6c107d7cbb3b69a43535d338024e3966129b1af058efa91c838ad9cd9ddc",
    "log_ratio.parquet": "9bec8df1b5162d6a38af16bb4241800fe6a94ac982ba75164a1b57ee17e9a463",
    "log_ratio_summary.csv": "ee8aa08da22a44c2b1891b40258997f96b007ce9c80831c9deed018e4ff4a44b",
    "log_ratio_summary.parquet": "6fc70765c10bf9e0d89983427bbb2568868dbb17ffba79fe886191812968bee2",
    "mse.csv": "2f6861970f9bf4763d7f973b2e818d8e45d45bc95bfe2b69538ad55797e7f867",
    "mse.parquet": "491be41f30f214b65418a0b2a327c331ce07a38271bca7abceb4b743009201fc",
    "selections.parquet": "834a8a2246194da5b5a594b6bbbc6d805e7cb7285465d535b58a3cad73051c6c",
    "users.parquet": "43359c71861d38f8d758900774445c287b05756ddd420dbb4f2d570038a580f8",
}
# mse.*, selections.parquet, the report and the summary include the `auto` rows, section and entry.
REPORT_WITHOUT_SECONDS = "0bb5fa62636e675db88951d923060fe8a2ea67f7b153bca76a48ec1a748be426"
SUMMARY_WITHOUT_CONFIG = "3e6b2596a64edc02f38a1e9e7a0fa3a5448079a7bd7ab7c6f6969d13ffb19cca"


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
