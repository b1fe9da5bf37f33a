"""The bandit study's two private primitives: the hybrid continual counter (Chan,
Shi & Song 2010) and the exponential-mechanism quantile. Exact privacy audits on neighbouring
inputs, exact output distributions, and accuracy on known streams."""

from __future__ import annotations

import math

import numpy as np
import pytest

from eval.bandit import counter, quantiles

EPS = 1.0


def _covered(nodes: list) -> list[int]:
    return [i for node in nodes for i in counter.node_items(node)]


@pytest.mark.parametrize("n", range(1, 300))
def test_release_nodes_partition_the_prefix(n: int) -> None:
    # The release at n is the true prefix sum plus noise only if its nodes cover 1..n exactly once.
    assert sorted(_covered(counter.release_nodes(n))) == list(range(1, n + 1))


def test_node_noise_scales_and_per_item_budget_make_the_counter_eps_dp() -> None:
    """Node by node: log nodes get Laplace(2/ε), segment k's p-sums Laplace(2k/ε); an item that is
    not a power of two lies in 1 log node + k p-sums (ε/2 + k·ε/(2k) = ε), a power of two in the
    log node only (ε/2). So the vector of all noisy nodes is ε-DP for values in [0, 1]."""
    horizon = 1024
    nodes = counter.nodes_up_to(horizon)
    assert counter.node_scale(("log", 5), EPS) == 2.0
    assert counter.node_scale(("bin", 7, 3, 0), EPS) == 14.0
    assert counter.node_scale(("bin", 7, 3, 0), 0.5, value_range=2.0) == 56.0
    loss = dict.fromkeys(range(1, horizon + 1), 0.0)
    touched = dict.fromkeys(loss, 0)
    for node in nodes:
        for i in counter.node_items(node):
            if i <= horizon:
                loss[i] += 1.0 / counter.node_scale(node, EPS)
                touched[i] += 1
    for i in loss:
        k = counter.segment(i)
        power_of_two = i & (i - 1) == 0
        assert touched[i] <= (1 if power_of_two else 1 + k)
        assert loss[i] <= EPS + 1e-12
    # The bound is tight: an item whose p-sums complete on every level spends all of ε; p-sums
    # that would end past their segment are never released (the last item of segment 9 is in one).
    assert loss[3] == pytest.approx(EPS) and loss[513] == pytest.approx(EPS) and loss[512] == pytest.approx(EPS / 2)
    assert touched[513] == 1 + 9  # segment 9: 1 log node + 9 p-sum levels
    assert touched[1023] == 1 + 1 and loss[1023] == pytest.approx(EPS / 2 + EPS / 18)


def _node_sums(x: np.ndarray, nodes: list) -> np.ndarray:
    return np.array([sum(x[i - 1] for i in counter.node_items(node) if i <= x.size) for node in nodes])


def test_exact_audit_on_neighbouring_streams_of_length_16() -> None:
    """For Laplace nodes the privacy loss of the released node vector is at most
    Σ_node |s_node(x) − s_node(x')| / b_node, with equality for outputs beyond both sums. Every
    position of streams of length 16, changed by the most a value in [0, 1] can change (0 ↔ 1)."""
    horizon = 16
    nodes = counter.nodes_up_to(horizon)
    scales = np.array([counter.node_scale(node, EPS) for node in nodes])
    rng = np.random.default_rng(0)
    losses = []
    for _ in range(20):
        x = rng.uniform(0, 1, horizon)
        for i in range(horizon):
            a, b = x.copy(), x.copy()
            a[i], b[i] = 0.0, 1.0
            losses.append(float(np.sum(np.abs(_node_sums(a, nodes) - _node_sums(b, nodes)) / scales)))
    assert max(losses) == pytest.approx(EPS)
    assert all(v <= EPS + 1e-12 for v in losses)
    # positions 1, 2, 4, 8, 16 (powers of two) sit in one log node only: ε/2
    per_position = np.array(losses).reshape(20, horizon)
    assert np.allclose(per_position[:, [0, 1, 3, 7, 15]], EPS / 2)
    assert np.allclose(per_position[:, [2, 4, 8]], EPS)  # 3, 5, 9: the first item of a segment


def test_statistical_audit_privacy_loss_never_exceeds_eps() -> None:
    """Sampled outputs of the node vector on x and its neighbour x' (position 9 changed 0 → 1):
    the log-likelihood ratio never exceeds ε and reaches it (the bound is attained)."""
    horizon = 16
    nodes = counter.nodes_up_to(horizon)
    scales = np.array([counter.node_scale(node, EPS) for node in nodes])
    rng = np.random.default_rng(7)
    x = rng.uniform(0, 1, horizon)
    x[8] = 0.0  # item 9 = 2^3 + 1 is in a log node and in a p-sum on each of segment 3's 3 levels
    y = x.copy()
    y[8] = 1.0
    sx, sy = _node_sums(x, nodes), _node_sums(y, nodes)
    out = sx + rng.laplace(0.0, scales, (20_000, scales.size))
    llr = ((np.abs(out - sy) - np.abs(out - sx)) / scales).sum(axis=1)
    assert llr.max() <= EPS + 1e-9
    assert llr.max() == pytest.approx(EPS)


def test_vectorised_noise_equals_the_sum_of_node_noises() -> None:
    noise = counter.draw_noise(300, EPS, np.random.default_rng(3))
    seq = counter.noise_sequence(noise)
    assert seq[0] == 0.0
    for n in range(1, 301):
        assert seq[n] == pytest.approx(sum(noise.value(node) for node in counter.release_nodes(n)), abs=1e-9)


def test_counter_accuracy_on_a_known_stream() -> None:
    """Releases are unbiased with exactly the variance Σ 2b² of their nodes; with a huge ε they
    are the prefix sums."""
    stream = (np.arange(1, 701) % 3 == 0).astype(float)  # 0, 0, 1, 0, 0, 1, …
    truth = np.cumsum(stream)
    np.testing.assert_allclose(counter.release(stream, 1e9, np.random.default_rng(0)), truth, atol=1e-5)
    rng = np.random.default_rng(1)
    reps = 2000
    errors = np.array([counter.release(stream, EPS, rng) - truth for _ in range(reps)])
    for n in (1, 3, 512, 600, 700):
        var = sum(2 * counter.node_scale(node, EPS) ** 2 for node in counter.release_nodes(n))
        assert abs(errors[:, n - 1].mean()) < 4 * math.sqrt(var / reps)
        assert errors[:, n - 1].var() == pytest.approx(var, rel=0.15)  # ≈ 3 standard errors
    # n = 512 is a power of two: only the 10 log nodes, Laplace(2) each: variance 80.
    assert sum(2 * counter.node_scale(node, EPS) ** 2 for node in counter.release_nodes(512)) == 80.0


def test_counter_refuses_values_outside_the_range() -> None:
    with pytest.raises(ValueError, match=r"values in \[0, 1\]"):
        counter.release(np.array([0.5, 1.5]), EPS, np.random.default_rng(0))


def test_em_quantile_exact_distribution_on_a_tiny_input() -> None:
    """x = (0.2, 0.5) on [0, 1], median, ε = 1: intervals [0, .2], [.2, .5], [.5, 1] with utilities
    −1, 0, −1, so P ∝ 0.2 e^{−1/2}, 0.3, 0.5 e^{−1/2}; sampling matches it."""
    edges, logp = quantiles.interval_log_probs(np.array([0.5, 0.2]), 0.5, 1.0, 0.0, 1.0)
    np.testing.assert_allclose(edges, [0.0, 0.2, 0.5, 1.0])
    w = np.array([0.2 * math.exp(-0.5), 0.3, 0.5 * math.exp(-0.5)])
    np.testing.assert_allclose(np.exp(logp), w / w.sum(), rtol=1e-12)
    rng = np.random.default_rng(11)
    draws = np.array([quantiles.em_quantile(np.array([0.5, 0.2]), 0.5, 1.0, rng) for _ in range(20_000)])
    freq = np.histogram(draws, bins=edges)[0] / draws.size
    np.testing.assert_allclose(freq, w / w.sum(), atol=0.012)
    # uniform inside an interval: the density is flat on [0.5, 1]
    inside = draws[draws > 0.5]
    assert abs(inside.mean() - 0.75) < 0.01


def test_em_quantile_exact_dp_audit_on_neighbouring_windows() -> None:
    """The output density is piecewise constant; on the merged breakpoints of neighbouring windows
    (one value replaced) the log-density ratio never exceeds ε, and comes close to it."""
    rng = np.random.default_rng(5)
    worst = 0.0
    for trial in range(400):
        x = rng.uniform(0, 1, 10)
        y = x.copy()
        y[rng.integers(10)] = rng.choice([0.0, 1.0, rng.uniform()]) if trial % 2 else 1.0 - x.min()
        q = rng.choice([0.1, 0.5, 0.9])
        eps = rng.choice([0.5, 1.0, 2.0])
        cuts = np.unique(np.concatenate(([0.0, 1.0], x, y)))
        mid = (cuts[:-1] + cuts[1:]) / 2
        px = quantiles.density(x, q, eps, 0.0, 1.0, mid)
        py = quantiles.density(y, q, eps, 0.0, 1.0, mid)
        assert (px > 0).all() and (py > 0).all()  # every merged piece has positive width
        ratio = np.abs(np.log(px) - np.log(py)) / eps
        worst = max(worst, float(ratio.max()))
    assert worst <= 1.0 + 1e-9
    assert worst > 0.9


def test_quantile_pair_is_accurate_on_a_window_of_200() -> None:
    """The study's setting: 200 rewards N(0.2, 0.1²) in [0, 1], ε_p = 1 per pair (0.5 each): the
    estimates centre on the true p10 = 0.072 and p90 = 0.328, but the wide empty interval above
    the largest reward (≈ 0.6 wide, 20 ranks off) still wins about one draw in ten for p90."""
    rng = np.random.default_rng(2)
    est = np.array([quantiles.quantile_pair(np.clip(rng.normal(0.2, 0.1, 200), 0, 1), 1.0, rng) for _ in range(400)])
    err = np.abs(est - [0.072, 0.328])
    assert np.median(err[:, 0]) < 0.02 and np.median(err[:, 1]) < 0.025
    assert 0.7 <= np.mean((err < 0.06).all(axis=1)) < 0.95
    assert 0.03 < np.mean(est[:, 1] > 0.55) < 0.2  # the top-interval draws
