import numpy as np
import pytest
from scipy.stats import spearmanr

from recsvc.rng import csprng, stream, user_stream
from recsvc.stats import spearman


def test_spearman_matches_scipy_with_ties_rowwise():
    rng = np.random.default_rng(0)
    x = rng.integers(0, 5, size=(4, 30)).astype(float)
    y = x + rng.normal(size=(4, 30))
    got = spearman(x, y)
    want = [spearmanr(a, b).statistic for a, b in zip(x, y, strict=False)]
    np.testing.assert_allclose(got, want, rtol=1e-12)
    assert spearman(np.arange(5.0), -np.arange(5.0)) == pytest.approx(-1.0)


def test_spearman_constant_is_undefined_value():
    assert spearman(np.ones(4), np.arange(4.0)) == 0.0
    assert np.isnan(spearman(np.ones(4), np.arange(4.0), undefined=np.nan))


def test_spearman_bad_input():
    with pytest.raises(ValueError, match="shapes differ"):
        spearman(np.ones(3), np.ones(4))


def test_user_stream_is_spawn_key_stream():
    a = user_stream(7, 3).random(5)
    b = np.random.Generator(np.random.PCG64(np.random.SeedSequence(7, spawn_key=(3,)))).random(5)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(user_stream(7, 4).random(5), a)


def test_stream_of_a_key_is_its_spawn_key_stream():
    """eval's streams (a user, then a tag, a mode, an ε index …) are SeedSequence(seed, spawn_key=key)."""
    a = stream(7, 3, 2**31 + 11, 1).random(5)
    b = np.random.Generator(np.random.PCG64(np.random.SeedSequence(7, spawn_key=(3, 2**31 + 11, 1)))).random(5)
    assert np.array_equal(a, b) and np.array_equal(stream(7, 3).random(5), user_stream(7, 3).random(5))
    assert not np.array_equal(stream(7, 3, 2**31 + 11, 2).random(5), a)


def test_csprng_streams_differ_and_look_uniform():
    a, b = csprng().random(20000), csprng().random(20000)
    assert not np.array_equal(a, b)
    assert abs(a.mean() - 0.5) < 0.01 and abs(b.var() - 1 / 12) < 0.005


def test_spearman_1d_fast_path_matches_rowwise_and_scipy_with_ties():
    rng = np.random.default_rng(3)
    for n in (2, 3, 17, 500, 3000):  # 3,000: the radix-sort path
        x = rng.integers(0, 4, size=n).astype(float)
        y = rng.normal(size=n).round(1)
        want = spearmanr(x, y).statistic
        got = spearman(x, y)
        if np.isnan(want):
            assert got == 0.0
        else:
            assert got == pytest.approx(want, rel=1e-12, abs=1e-12)
            assert got == pytest.approx(float(spearman(x[None, :], y[None, :])[0]), rel=1e-12, abs=1e-12)


def test_radix_argsort_is_numpys_stable_argsort():
    from recsvc.stats import RADIX_MIN_N, _argsort_radix, argsort_fast

    rng = np.random.default_rng(4)
    extremes = np.array([3.0, -1.0, 0.0, -1e300, 1e300, 1e-310, -1e-310, 2.0, -5e-324, 5e-324])
    for x in (
        rng.normal(size=5000),
        rng.normal(size=5000).round(1) + 0.0,
        np.tile(extremes, 300),
        rng.uniform(1.0, 1.0 + 1e-12, 4000),
        np.full(RADIX_MIN_N, 7.5),
    ):
        np.testing.assert_array_equal(_argsort_radix(x), np.argsort(x, kind="stable"))
        np.testing.assert_array_equal(argsort_fast(x), np.argsort(x, kind="stable"))
    z = np.array([0.0, -0.0] * RADIX_MIN_N)  # −0.0 == 0.0: only their relative order may differ
    assert (z[argsort_fast(z)] == 0.0).all()


def test_thread_csprng_is_one_generator_per_thread():
    import threading

    from recsvc.rng import thread_csprng

    mine = thread_csprng()
    assert thread_csprng() is mine
    seen = []
    t = threading.Thread(target=lambda: seen.append(thread_csprng()))
    t.start()
    t.join()
    assert seen[0] is not mine and isinstance(seen[0], np.random.Generator)


def test_spearman_rows_ragged_undefined_and_short_rows():
    from recsvc.stats import spearman_rows

    x = np.array([[1.0, 2.0, 3.0, 9.0], [5.0, 5.0, 5.0, 0.0], [1.0, 0.0, 0.0, 0.0]])
    y = np.array([3.0, 2.0, 1.0, 7.0])
    got = spearman_rows(x, y, np.array([3, 3, 1]), undefined=0.0)
    assert got[0] == pytest.approx(-1.0)  # padding (9 vs 7) ignored
    assert got[1] == 0.0  # constant over its 3 real values → undefined
    assert np.isnan(got[2])  # one candidate: no ρ at all
