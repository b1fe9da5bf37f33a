"""Private continual counting: the hybrid mechanism of Chan, Shi & Song (2010, §4.2).

The stream x_1, x_2, … (values in [0, R]; R = ``value_range``) has no known length, so the
hybrid mechanism combines two counters, each with ε/2:

* the *logarithmic* mechanism: log node k covers the items (2^{k−1}, 2^k] (node 0: item 1) and
  gets Laplace(2R/ε); the release at n = 2^k is the sum of log nodes 0 … k;
* for each segment k ≥ 1, a *binary* mechanism over the items 2^k + τ, τ ∈ [1, 2^k − 1]: the
  dyadic p-sums of τ, k levels, each with Laplace(2kR/ε).

The release at n = 2^k + τ is the sum of the noisy log nodes 0 … k plus the noisy p-sums of the
dyadic decomposition of [1, τ]. These nodes partition [1, n], so the release is the true prefix
sum plus the sum of their noises (:func:`noise_sequence` computes that sum for every n at once).

Privacy (replace one x_i by another value in [0, R]): item i lies in one log node (Laplace 2R/ε:
costs ε/2) and, unless it is a power of two, in at most one released p-sum per level of its
segment (≤ k levels of Laplace 2kR/ε: ≤ ε/2 together), so the vector of all noisy nodes is ε-DP
and every released sequence, a function of it, is too. ``tests/eval/test_eval_bandit_primitives.py`` checks this node by node.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

# ("log", k) or ("bin", k, level, index): bin node (k, j, i) covers the local items
# [i·2^j + 1, (i+1)·2^j] of segment k, i.e. the items 2^k + those.
Node = tuple


def segment(n: int) -> int:
    """k = ⌊log2 n⌋: the release at n uses the log nodes 0 … k and segment k's p-sums."""
    if n < 1:
        raise ValueError(f"stream positions start at 1, got {n}")
    return n.bit_length() - 1


def release_nodes(n: int) -> list[Node]:
    """The nodes whose noisy sums add up to the release at position n (they partition [1, n])."""
    k = segment(n)
    tau = n - (1 << k)
    nodes: list[Node] = [("log", j) for j in range(k + 1)]
    nodes += [("bin", k, j, (tau >> j) - 1) for j in range(k - 1, -1, -1) if (tau >> j) & 1]
    return nodes


def node_items(node: Node) -> range:
    """The stream positions a node sums."""
    if node[0] == "log":
        k = node[1]
        return range(1, 2) if k == 0 else range((1 << (k - 1)) + 1, (1 << k) + 1)
    _, k, j, i = node
    start = (1 << k) + i * (1 << j) + 1
    return range(start, start + (1 << j))


def node_scale(node: Node, epsilon: float, value_range: float = 1.0) -> float:
    """The Laplace scale of a node: 2R/ε for log nodes, 2kR/ε for segment k's p-sums."""
    return 2.0 * value_range / epsilon * (1 if node[0] == "log" else node[1])


def nodes_up_to(horizon: int) -> list[Node]:
    """Every node some release at n ≤ horizon uses (the only ones ever drawn), without repeats."""
    return list(dict.fromkeys(node for n in range(1, horizon + 1) for node in release_nodes(n)))


@dataclass(frozen=True)
class NodeNoise:
    """The Laplace noise of every node released up to ``horizon``: ``log[k]`` and
    ``bins[(k, j)][i]`` (only the p-sums that complete within the horizon)."""

    horizon: int
    log: np.ndarray
    bins: dict[tuple[int, int], np.ndarray]

    def value(self, node: Node) -> float:
        return float(self.log[node[1]] if node[0] == "log" else self.bins[(node[1], node[2])][node[3]])


def _max_tau(k: int, horizon: int) -> int:
    return min((1 << k) - 1, horizon - (1 << k))


def draw_noise(horizon: int, epsilon: float, rng: np.random.Generator, value_range: float = 1.0) -> NodeNoise:
    """All node noises for a stream of at most ``horizon`` items, drawn in a fixed order."""
    if horizon < 1 or epsilon <= 0 or not math.isfinite(epsilon) or value_range <= 0:
        raise ValueError(f"need horizon ≥ 1, ε > 0 and R > 0; got {horizon}, {epsilon}, {value_range}")
    top = segment(horizon)
    log = rng.laplace(0.0, 2.0 * value_range / epsilon, top + 1)
    bins = {}
    for k in range(1, top + 1):
        tmax = _max_tau(k, horizon)
        for j in range(k):
            bins[(k, j)] = rng.laplace(0.0, 2.0 * k * value_range / epsilon, tmax >> j)
    return NodeNoise(horizon, log, bins)


def noise_sequence(noise: NodeNoise) -> np.ndarray:
    """E[n] = the total noise of the release at n, for n = 0 … horizon (E[0] = 0), vectorised."""
    out = np.zeros(noise.horizon + 1)
    log_sums = np.cumsum(noise.log)
    for k in range(segment(noise.horizon) + 1):
        tau = np.arange(0, _max_tau(k, noise.horizon) + 1)
        part = np.full(tau.shape, log_sums[k])
        for j in range(k):
            on = ((tau >> j) & 1).astype(bool)
            part[on] += noise.bins[(k, j)][(tau[on] >> j) - 1]
        out[(1 << k) + tau] = part
    return out


def release(stream: np.ndarray, epsilon: float, rng: np.random.Generator, value_range: float = 1.0) -> np.ndarray:
    """The hybrid mechanism's releases of the prefix sums of ``stream`` (values in [0, R])."""
    x = np.asarray(stream, dtype=np.float64)
    if x.ndim != 1 or x.size == 0 or not np.all((x >= 0) & (x <= value_range)):
        raise ValueError(f"stream must be a non-empty 1-D array of values in [0, {value_range:g}]")
    return np.cumsum(x) + noise_sequence(draw_noise(x.size, epsilon, rng, value_range))[1:]
