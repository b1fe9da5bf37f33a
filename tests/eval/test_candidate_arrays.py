"""The memory-mapped candidate arrays (``candidates/``) and candidates.parquet read identically:
the same per-user arrays, and byte-identical eval result tables."""

from __future__ import annotations

from dataclasses import fields

import numpy as np
import pytest

from eval.evaluation.config import EvalConfig
from eval.evaluation.run import run
from eval.testing import make_artifact, without_candidate_arrays
from recsvc.artifact import load_artifact
from recsvc.artifact.candidates import MappedRows, UserRows


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """One artifact with the arrays and its copy without them (short users exercise the padding)."""
    root = tmp_path_factory.mktemp("arrays")
    mapped = make_artifact(root / "mapped", users=12, n=20, short_users=3)
    return mapped, without_candidate_arrays(mapped, root / "table")


def _same(a, b) -> None:
    for f in fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        assert x.dtype == y.dtype and x.shape == y.shape, f.name
        np.testing.assert_array_equal(x, y, err_msg=f.name)


def test_mapped_and_table_readers_give_identical_arrays(pair):
    mapped, table = (load_artifact(p) for p in pair)
    assert mapped.has_candidate_arrays and not table.has_candidate_arrays
    assert isinstance(mapped._candidate_rows, MappedRows) and isinstance(table._candidate_rows, UserRows)
    assert isinstance(mapped._candidate_rows.scores, np.memmap)
    np.testing.assert_array_equal(mapped.user_ids, table.user_ids)
    # Whole, a slice ending in the short users, a slice of only short users (narrower: n = 17), past the end.
    for users, start in ((None, 0), (5, 6), (3, 9), (4, 10), (0, 3), (7, 40)):
        m, t = mapped.candidate_matrix(users, start), table.candidate_matrix(users, start)
        _same(m, t)
    narrow = mapped.candidate_matrix(3, 9)
    assert narrow.scores.shape == (3, 17) and narrow.count.tolist() == [17, 17, 17]
    assert mapped.candidate_matrix().item_index.dtype == np.int64  # int32 on disk, int64 to callers
    # The arrays are what the table says: user u001's candidates in rank order.
    frame = table.candidates.filter(table.candidates["user_id"] == "u001").sort("rank")
    row = mapped.candidate_matrix(1, 1)
    np.testing.assert_array_equal(row.scores[0], frame["score"].to_numpy())
    items = mapped.items["item_id"].to_numpy()
    assert items[row.item_index[0]].tolist() == frame["item_id"].to_list()


def test_eval_outputs_are_byte_identical_from_either_reader(pair, tmp_path):
    digests = []
    for art, workers in zip(pair, (2, 1), strict=True):
        cfg = EvalConfig(
            artifacts=art,
            mechanisms=("rnm", "mgem", "rs"),
            epsilons=(0.5, 4.0),
            trials=8,
            seed=5,
            workers=workers,
            chunk_size=5,
            progress=False,
            out=tmp_path / art.name,
        )
        res = run(cfg)
        assert res.out is not None
        digests.append({p.name: p.read_bytes() for p in sorted(res.out.iterdir()) if p.suffix in (".parquet", ".csv")})
    tables = ["correlation_histogram.csv", "mse.csv", "mse.parquet", "selections.parquet", "users.parquet"]
    assert sorted(digests[0]) == tables and digests[0] == digests[1]
