"""recsvc.model: the one SANSA scoring and top-k tie rule, shared by the pipeline and the service."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
import scipy.sparse as sp

from data_prep.candidates import ScoringContext, score_top_k
from recsvc.artifact import ArtifactWriter, load_artifact
from recsvc.model import Model, TopK, top_k
from recsvc.service.selection import Catalog, InvalidRequest, Recommender

# Six items; the user's history is item "a" (column 0), whose row of W2 gives the scores:
# b, d and f tie at 2, c and e tie at 1. The catalog lists the items in reverse order, so
# catalog rows differ from model columns.
IDS = ["a", "b", "c", "d", "e", "f"]
W2_ROW_A = [5.0, 2.0, 1.0, 2.0, 1.0, 2.0]


def _model() -> Model:
    w2 = np.zeros((6, 6))
    w2[0] = W2_ROW_A
    return Model(sp.identity(6, format="csr"), sp.csr_matrix(w2), np.array(IDS))


def test_top_k_ties_go_to_the_lower_column_and_short_rows_are_padded() -> None:
    s = np.array([[2.0, 1.0, 2.0, 2.0], [0.0, 0.0, 0.0, 0.0], [-np.inf, 3.0, -np.inf, -np.inf]])
    t = top_k(s, 2)
    assert t.index.tolist() == [[0, 2], [0, 1], [1, -1]]
    assert t.score[:2].tolist() == [[2.0, 2.0], [0.0, 0.0]] and t.score[2, 0] == 3.0 and np.isneginf(t.score[2, 1])
    assert t.count.tolist() == [2, 2, 1] and t.index.dtype == np.int32
    wide = top_k(s, 10)  # k > items: every column, ties by column, −inf last as padding
    assert wide.index.tolist() == [[0, 2, 3, 1], [0, 1, 2, 3], [1, -1, -1, -1]]
    empty = top_k(np.zeros((0, 4)), 2)
    assert empty.index.shape == (0, 2) and TopK.concat([t, empty]).index.tolist() == t.index.tolist()


def test_score_unseen_masks_each_users_own_items() -> None:
    x = sp.csr_matrix(np.array([[1.0, 0, 0, 0, 0, 0], [1.0, 1.0, 0, 0, 0, 0]]))
    s = _model().score_unseen(x)
    assert s[0].tolist() == [-np.inf, 2.0, 1.0, 2.0, 1.0, 2.0]
    assert s[1].tolist() == [-np.inf, -np.inf, 1.0, 2.0, 1.0, 2.0]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_score_one_equals_the_sparse_product_for_one_user(dtype) -> None:
    rng = np.random.default_rng(5)
    n = 300
    w1 = sp.random(n, n, density=0.05, random_state=1, format="csr") - sp.random(n, n, density=0.02, random_state=2)
    w2 = sp.random(n, n, density=0.05, random_state=3, format="csr")
    model = Model(sp.csr_matrix(w1, dtype=dtype), sp.csr_matrix(w2, dtype=dtype), np.array([str(i) for i in range(n)]))
    for size in (0, 1, 40, n):
        cols = np.sort(rng.choice(n, size, replace=False))
        x = sp.csr_matrix((np.ones(size), (np.zeros(size, np.int64), cols)), shape=(1, n))
        want = model.score(x)[0]
        got = model.score_one(cols)
        assert got.dtype == np.float64 and got.shape == (n,)
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12 * (1 + np.abs(want).max()))
    assert (model.score_one(np.array([], np.int64)) == 0).all()


@pytest.mark.parametrize("rank", [300, 120, 450])
def test_score_items_equals_score_one_at_those_items(rank) -> None:
    """SANSA's factors are n x r and r x n; the hidden width r need not be n."""
    rng = np.random.default_rng(6)
    n = 300
    w1 = sp.random(n, rank, density=0.05, random_state=4, format="csr") - sp.random(
        n, rank, density=0.02, random_state=5
    )
    w2 = sp.random(rank, n, density=0.05, random_state=6, format="csr")
    model = Model(sp.csr_matrix(w1), sp.csr_matrix(w2), np.array([str(i) for i in range(n)]))
    for size in (0, 1, 40, n):
        cols = np.sort(rng.choice(n, size, replace=False))
        items = rng.choice(n, 10, replace=False)
        x = sp.csr_matrix((np.ones(size), (np.zeros(size, np.int64), cols)), shape=(1, n))
        want = model.score(x)[0]
        np.testing.assert_allclose(model.score_one(cols), want, rtol=1e-12, atol=1e-12 * (1 + np.abs(want).max()))
        got = model.score_items(cols, items)
        assert got.dtype == np.float64 and got.shape == (10,)
        np.testing.assert_allclose(got, want[items], rtol=1e-12, atol=1e-12 * (1 + np.abs(want).max()))
    assert model.score_items(np.array([0, 1]), np.array([], np.int64)).shape == (0,)


@pytest.fixture()
def artifact(tmp_path):
    lo = np.zeros(6)
    hi = np.full(6, 3.0)
    with ArtifactWriter(tmp_path / "art") as w:
        w.write_items(pl.DataFrame({"item_id": IDS[::-1], "lo": lo, "hi": hi, "sensitivity": hi - lo}))
        w.write_candidates(
            pl.DataFrame({"user_id": ["u"], "rank": [0], "item_id": ["a"], "score": [1.0]}).cast({"rank": pl.Int32})
        )
        w.write_model(_model())
        return load_artifact(w.commit({"dataset": "ties"}))


def test_pipeline_ranks_tied_scores_by_the_lower_column(artifact) -> None:
    for k, want in ((2, ["b", "d"]), (3, ["b", "d", "f"]), (4, ["b", "d", "f", "c"]), (10, ["b", "d", "f", "c", "e"])):
        top = score_top_k(range(1), ScoringContext(artifact.model, sp.csr_matrix(np.eye(6)[:1]), k))
        assert [IDS[c] for c in top.index[0, : top.count[0]]] == want, k
        assert top.score[0, : top.count[0]].tolist() == [2.0, 2.0, 2.0, 1.0, 1.0][: len(want)]


def test_recommender_scores_the_whole_catalog_in_catalog_order_seen_items_included(artifact) -> None:
    rec = Recommender(artifact, Catalog(artifact))
    catalog = artifact.items["item_id"].to_list()
    assert catalog == IDS[::-1] and rec.col_of_row is not None  # rows differ from model columns
    want = [dict(zip(IDS, W2_ROW_A, strict=False))[i] for i in catalog]  # "a" is seen and keeps its score 5
    assert rec.scores(["a"]).tolist() == want == [2.0, 1.0, 2.0, 1.0, 2.0, 5.0]
    with pytest.raises(
        InvalidRequest, match=r"duplicate item_id 'a' in history \(positions 0 and 2\); expected each item once"
    ):
        rec.scores(["a", "b", "a"])  # a history is a set, as Select's candidates are
    assert rec.scores(["b", "a"]).tolist() == rec.scores(["a", "b"]).tolist()  # its order does not matter
    assert rec.scores([]).tolist() == [0.0] * 6 and rec.scores(IDS).shape == (6,)  # nothing left "unseen": fine
    with pytest.raises(InvalidRequest, match="unknown item_id 'zz' in history \\(position 1\\)"):
        rec.scores(["a", "zz"])


def test_a_catalog_item_without_a_model_column_scores_a_constant_zero(tmp_path) -> None:
    ids = ["z", *IDS]  # "z" has a clip range but no model column
    with ArtifactWriter(tmp_path / "art") as w:
        w.write_items(
            pl.DataFrame(
                {"item_id": ids, "lo": np.full(7, -1.0), "hi": np.full(7, 3.0), "sensitivity": np.full(7, 4.0)}
            )
        )
        w.write_candidates(
            pl.DataFrame({"user_id": ["u"], "rank": [0], "item_id": ["a"], "score": [1.0]}).cast({"rank": pl.Int32})
        )
        w.write_model(_model())
        art = load_artifact(w.commit({"dataset": "extra"}))
    rec = Recommender(art, Catalog(art))
    assert rec.scores(["a"]).tolist() == [0.0, *W2_ROW_A]
