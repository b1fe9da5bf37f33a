"""The committed gRPC stubs match the proto, and scripts/gen_proto.sh is an idempotent no-op."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from recsvc.service.testing import REPO

STUBS = ("selection_pb2.py", "selection_pb2_grpc.py", "selection_pb2.pyi")


def test_committed_stubs_match_the_proto(tmp_path: Path) -> None:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            "-Iproto",
            f"--python_out={tmp_path}",
            f"--grpc_python_out={tmp_path}",
            f"--pyi_out={tmp_path}",
            "proto/recsvc/v1/selection.proto",
        ],
        cwd=REPO,
        check=True,
    )
    for name in STUBS:
        fresh = (tmp_path / "recsvc" / "v1" / name).read_bytes()
        committed = (REPO / "recsvc" / "v1" / name).read_bytes()
        assert fresh == committed, f"recsvc/v1/{name} drifted from the proto: run scripts/gen_proto.sh"


def test_gen_proto_does_not_rewrite_unchanged_stubs() -> None:
    before = {n: (REPO / "recsvc" / "v1" / n).stat().st_mtime_ns for n in STUBS}
    out = subprocess.run(["bash", "scripts/gen_proto.sh"], cwd=REPO, check=True, capture_output=True, text=True)
    after = {n: (REPO / "recsvc" / "v1" / n).stat().st_mtime_ns for n in STUBS}
    assert before == after and "updated" not in out.stdout


def test_spec_names_are_in_the_service() -> None:
    from recsvc.v1 import selection_pb2 as pb

    svc = pb.DESCRIPTOR.services_by_name["PrivateSelection"]
    assert pb.DESCRIPTOR.package == "recsvc.v1"
    assert {m.name for m in svc.methods} == {
        "Select",
        "SelectBatch",
        "Recommend",
        "GetBudget",
        "ListMechanisms",
        "MultiSelect",
    }
    assert [f.name for f in pb.SelectRequest.DESCRIPTOR.fields][:8] == [
        "user_id",
        "candidates",
        "mechanism",
        "epsilon",
        "request_id",
        "beta",
        "gamma",
        "corr_budget_fraction",
    ]
    assert [f.name for f in pb.SelectResponse.DESCRIPTOR.fields][:5] == [
        "item_id",
        "mechanism",
        "epsilon_spent",
        "budget_remaining",
        "request_id",
    ]
    assert [f.name for f in pb.Candidate.DESCRIPTOR.fields] == ["item_id", "score"]
