"""Hand-computable checks: item percentiles / Δ (exact zeros counted, own items excluded),
top-k ranking with ties, accuracy metrics, the block store and population Spearman."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from data_prep.candidates import ScoringContext, score_population, score_top_k
from data_prep.metrics import accuracy, bars_recall_at, hit_matrix, ndcg_at, recall_at
from data_prep.sensitivities import BlockStore, item_ranges, percentiles_along_rows, population_spearman
from recsvc.engines import LocalEngine, chunk_ranges
from recsvc.model import Model, TopK, top_k

pytestmark = pytest.mark.float_paths  # its floats come from BLAS, numpy's SIMD loops or numba

# Score = x @ I @ M: each input item contributes its row of M.
M = np.array([[0.0, 1.0, 2.0, 0.0], [0.0, 0.0, 4.0, 0.0], [3.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
INPUTS = sp.csr_matrix(np.array([[1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 0]], dtype=np.float32))


def _model() -> Model:
    return Model(
        sp.identity(4, format="csr", dtype=np.float32), sp.csr_matrix(M, dtype=np.float32), np.array(list("abcd"))
    )


def _ranges(tmp_path, chunk: int, q=(1.0, 99.0)):
    ctx = ScoringContext(_model(), INPUTS, k=4)
    chunks = chunk_ranges(4, chunk)
    store = BlockStore.create(tmp_path / "s.f64", 4, 4)
    store.block = 3  # force two item blocks, one of them ragged
    tops = []
    for rows, (scores, top) in zip(
        chunks, LocalEngine(1, progress=False).map(score_population, chunks, ctx), strict=False
    ):
        store.write_rows(rows.start, scores)
        tops.append(top)
    return item_ranges(store, q), TopK.concat(tops)


@pytest.mark.parametrize("chunk", [1, 3, 4])
def test_percentiles_exclude_own_items_and_count_zeros(tmp_path, chunk: int) -> None:
    r, _ = _ranges(tmp_path, chunk)
    # item a: users 1,2,3 (user 0 has it) score 0, 3, 0 → sorted [0,0,3]: p1 = 0, p99 = 3 - 3·0.02 = 2.94
    # item b: users 0,2,3 → [1,0,0]: p1 = 0, p99 = 0.98
    # item c: users 0,1,3 → [2,4,0]: p1 = 0.04, p99 = 3.96
    # item d: nobody scores it → 0, 0 → Δ = 1e-6
    np.testing.assert_allclose(r.lo, [0.0, 0.0, 0.04, 0.0], atol=1e-12)
    np.testing.assert_allclose(r.hi, [2.94, 0.98, 3.96, 0.0], atol=1e-12)
    np.testing.assert_allclose(r.sensitivity, [2.94, 0.98, 3.92, 1e-6], atol=1e-12)
    assert list(r.count) == [3, 3, 3, 4]


def test_percentiles_configurable(tmp_path) -> None:
    r, _ = _ranges(tmp_path, 2, q=(0.0, 50.0))
    np.testing.assert_allclose(r.lo, [0, 0, 0, 0])
    np.testing.assert_allclose(r.hi, [0, 0, 2, 0])


def test_percentiles_match_numpy_nanpercentile() -> None:
    rng = np.random.default_rng(0)
    v = np.where(rng.random((301, 40)) < 0.3, 0.0, rng.normal(size=(301, 40)))
    v[rng.random(v.shape) < 0.25] = np.nan
    lo, hi, count = percentiles_along_rows(v, (1.0, 99.0))
    ref = np.nanpercentile(v, [1.0, 99.0], axis=0)
    assert np.array_equal(lo, ref[0]) and np.array_equal(hi, ref[1])
    assert np.array_equal(count, (~np.isnan(v)).sum(axis=0))


def test_block_store_roundtrip(tmp_path) -> None:
    rng = np.random.default_rng(1)
    full = rng.normal(size=(7, 10))
    store = BlockStore.create(tmp_path / "x", 7, 10)
    store.block = 4
    for rows in chunk_ranges(7, 3):
        store.write_rows(rows.start, full[rows.start : rows.stop])
    got = np.concatenate([store.read_block(c) for c in store.blocks()], axis=1)
    assert np.array_equal(got, full)


def test_top_k_ranks_unseen_with_ties_by_lower_column() -> None:
    s = np.array([[1.0, 3.0, 3.0, 0.0, -np.inf], [2.0, 1.0, 1.0, 1.0, 1.0], [-np.inf, 1.0, -np.inf, -np.inf, -np.inf]])
    t = top_k(s, 3)
    assert t.index.tolist() == [[1, 2, 0], [0, 1, 2], [1, -1, -1]]
    assert t.score[0].tolist() == [3.0, 3.0, 1.0] and t.count.tolist() == [3, 3, 1]


def test_score_top_k_masks_seen_items() -> None:
    t = score_top_k(range(4), ScoringContext(_model(), INPUTS, k=2))
    # user 0 (has a): scores b=1, c=2, d=0 → c, b.  user 3: all zero → a, b by column.
    assert t.index.tolist() == [[2, 1], [2, 0], [0, 1], [0, 1]]
    assert t.score.tolist() == [[2.0, 1.0], [4.0, 0.0], [3.0, 0.0], [0.0, 0.0]]


def test_metrics_hand_computed() -> None:
    top = np.array([[3, 1, 0, 2], [0, 1, -1, -1]])
    targets = sp.csr_matrix(np.array([[0, 1, 1, 0, 0], [0, 0, 0, 0, 1]], dtype=np.float32))
    hits = hit_matrix(top, targets)
    assert hits.tolist() == [[False, True, False, True], [False, False, False, False]]
    n_t = np.array([2, 1])
    np.testing.assert_allclose(recall_at(hits, n_t, 1), [0.0, 0.0])
    np.testing.assert_allclose(recall_at(hits, n_t, 2), [0.5, 0.0])  # 1 hit / min(2, 2)
    np.testing.assert_allclose(recall_at(hits, n_t, 20), [1.0, 0.0])  # 2 hits / min(20, 2)
    ideal = 1 + 1 / np.log2(3)
    np.testing.assert_allclose(ndcg_at(hits, n_t, 100), [(1 / np.log2(3) + 1 / np.log2(5)) / ideal, 0.0])
    acc = accuracy(top, targets)
    assert acc["recall@20"] == pytest.approx(0.5) and acc["users"] == 2
    assert acc["ndcg@100"] == pytest.approx((1 / np.log2(3) + 1 / np.log2(5)) / ideal / 2)
    # A user without targets is skipped, not counted as zero.
    acc2 = accuracy(np.vstack([top, [[0, 1, 2, 3]]]), sp.vstack([targets, sp.csr_matrix((1, 5))]).tocsr())
    assert acc2["users"] == 2 and acc2["recall@20"] == pytest.approx(0.5)


def test_population_spearman(tmp_path) -> None:
    r, tops = _ranges(tmp_path, 2)
    stats = population_spearman(tops, r)
    # Every user has 3 unseen items; ρ per user computed by hand from clipped scores vs Δ.
    from recsvc.stats import spearman

    expect: list[float] = []
    for b in range(4):
        n = int(tops.count[b])
        idx = tops.index[b, :n]
        q = np.clip(tops.score[b, :n], r.lo[idx], r.hi[idx])
        expect.append(float(spearman(q, r.sensitivity[idx])))  # 1-D inputs: one ρ
    assert stats["users"] == 4
    assert stats["median"] == pytest.approx(float(np.median(expect)))
    assert stats["frac_positive"] == pytest.approx(float(np.mean(np.array(expect) > 0)))
    assert stats["mean"] == pytest.approx(float(np.mean(expect)))


# --- SANSA fit progress --------------------------------------------------------------------


def test_sansa_fit_reports_every_stage_and_restores_the_sansa_logger(capsys, caplog) -> None:
    import logging

    from data_prep.train import SansaParams, fit, fit_stages

    x = sp.random(400, 120, density=0.08, random_state=3, format="csr", dtype=np.float32)
    x.data[:] = 1.0
    params = SansaParams(l2=10.0, density=0.5, factorizer="cholmod", umr_scans=2, umr_finetune_steps=3)
    logger = logging.getLogger("sansa")
    before = (logger.level, logger.propagate, list(logger.handlers))
    with caplog.at_level(logging.INFO):
        model = fit(x, np.arange(120), params, verbose=False, progress=True)
    err = capsys.readouterr().err
    assert fit_stages(params) == 7
    assert "SANSA fit (cholmod)" in err and "/7 [" in err  # a bar over the 7 stages
    assert not [r for r in caplog.records if r.name.startswith("sansa")]  # quiet unless verbose
    assert (logger.level, logger.propagate, list(logger.handlers)) == before
    assert model.w1.shape == (120, 120) and model.w2.shape == (120, 120)

    with caplog.at_level(logging.INFO):
        fit(x, np.arange(120), params, verbose=True, progress=False)
    records = [r for r in caplog.records if r.name.startswith("sansa")]  # verbose: forwarded
    assert capsys.readouterr().err == ""  # progress=False: no bar
    # Every stage end is recognised in sansa's real records (not only the final fill-up).
    from data_prep.train import _FitProgress

    class Bar:
        n, postfix = 0, ""

        def update(self, k: int) -> None:
            self.n += k

        def set_postfix_str(self, s: str, refresh: bool = True) -> None:
            self.postfix = s

    bar = Bar()
    handler = _FitProgress(bar)
    for r in records:
        handler.emit(r)
    assert bar.n == fit_stages(params)
    assert bar.postfix == "Dividing columns of W by diagonal entries"


def test_bars_recall_divides_by_all_targets_and_ndcg20_by_the_capped_ideal() -> None:
    """A user with 30 targets whose top 20 are all hits: Recall@20 = 1 (capped), BARS Recall@20 =
    20/30, nDCG@20 = 1; a user with 2 targets hit at ranks 1 and 3: BARS = 2/2, nDCG@20 as DCG/IDCG."""
    n_items = 60
    top = np.vstack([np.arange(20), np.r_[[40, 0, 41], np.arange(1, 18)]])
    targets = sp.csr_matrix(
        (np.ones(32), (np.r_[np.zeros(30, int), [1, 1]], np.r_[np.arange(30), [40, 41]])), shape=(2, n_items)
    )
    hits = hit_matrix(top, targets)
    n_t = np.array([30, 2])
    np.testing.assert_allclose(recall_at(hits, n_t, 20), [1.0, 1.0])
    np.testing.assert_allclose(bars_recall_at(hits, n_t, 20), [20 / 30, 1.0])
    np.testing.assert_allclose(ndcg_at(hits, n_t, 20), [1.0, (1 + 1 / np.log2(4)) / (1 + 1 / np.log2(3))])
    acc = accuracy(top, targets)
    assert acc["bars_recall@20"] == pytest.approx((20 / 30 + 1.0) / 2)
    assert acc["ndcg@20"] == pytest.approx((1.0 + (1 + 1 / np.log2(4)) / (1 + 1 / np.log2(3))) / 2)
