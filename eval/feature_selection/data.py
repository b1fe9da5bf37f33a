"""The study's datasets and their preprocessing.

Every generator takes the caller's seeded stream, so a dataset is a function of (seed, name).
The preprocessing centres and scales with the data's own statistics: like the seed (its §4.1 and
footnote 1), the study treats these as PUBLIC bounds, as if a data owner had published each
column's centre and range; computing them privately is out of the study's scope.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

FIGURE1_SHAPE = (100, 100)  # points, features (the seed's §3)
FIGURE1_INFORMATIVE = 5
FIGURE1_NOISE_VAR = 0.1  # ε_i ~ N(0, 0.1), read as a variance
FIGURE1_OUTLIER_EVERY = 10  # 9 rows from w1, then 1 from w2: one outlier per block of 10

FAN_LV_SHAPE = (100, 2000)
FAN_LV_NONZERO = 8
FAN_LV_NOISE_VAR = 1.5
FAN_LV_SIGN_P = 0.4  # u ~ Bernoulli(0.4), w_i = (−1)^u (a + |z|)

SETTINGS = ("W1", "W1/W2")
DATASETS = ("fan-lv", "diabetes")
# Features of each dataset, known before any data is made, so k is checked before any work.
DATASET_FEATURES = {"fan-lv": FAN_LV_SHAPE[1], "diabetes": 10}


@dataclass(frozen=True)
class Dataset:
    name: str
    x: np.ndarray  # (N, d), raw
    y: np.ndarray  # (N,), raw
    informative: np.ndarray | None = None  # the planted support, where there is one


def figure1(setting: str, rng: np.random.Generator) -> Dataset:
    """The seed's §3: X ~ N(0, I_100), y = Xw1 + noise (W1); or every 10th row drawn from
    w2 = the LAST five features instead (W1/W2: 9:1 interleaved, one outlier per block)."""
    n, d = FIGURE1_SHAPE
    x = rng.standard_normal((n, d))
    w1 = np.zeros(d)
    w1[:FIGURE1_INFORMATIVE] = 1.0
    signal = x @ w1
    if setting == "W1/W2":
        outlier = np.arange(n) % FIGURE1_OUTLIER_EVERY == FIGURE1_OUTLIER_EVERY - 1
        signal[outlier] = x[outlier, d - FIGURE1_INFORMATIVE :].sum(axis=1)
    elif setting != "W1":
        raise ValueError(f"unknown setting {setting!r}; expected one of {', '.join(SETTINGS)}")
    y = signal + rng.normal(0.0, math.sqrt(FIGURE1_NOISE_VAR), n)
    return Dataset(setting, x, y, np.arange(FIGURE1_INFORMATIVE))


def fan_lv(rng: np.random.Generator, shape: tuple[int, int] = FAN_LV_SHAPE, nonzero: int = FAN_LV_NONZERO) -> Dataset:
    """Fan & Lv (2008) §3.3.1 as the seed's §5 states it: X ~ N(0, I_d), noise ~ N(0, 1.5), and
    ``nonzero`` random weights (−1)^u (a + |z|) with a = 4 log n / √n."""
    n, d = shape
    x = rng.standard_normal((n, d))
    support = np.sort(rng.choice(d, nonzero, replace=False))
    a = 4.0 * math.log(n) / math.sqrt(n)
    w = np.zeros(d)
    w[support] = np.where(rng.random(nonzero) < FAN_LV_SIGN_P, -1.0, 1.0) * (a + np.abs(rng.standard_normal(nonzero)))
    y = x @ w + rng.normal(0.0, math.sqrt(FAN_LV_NOISE_VAR), n)
    return Dataset("fan-lv", x, y, support)


def diabetes() -> Dataset:
    """scikit-learn's bundled diabetes regression data (442 patients, 10 features): shipped with
    the package, nothing is downloaded."""
    from sklearn.datasets import load_diabetes

    x, y = load_diabetes(return_X_y=True)
    return Dataset("diabetes", np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64))


def load(name: str, rng: np.random.Generator) -> Dataset:
    if name == "fan-lv":
        return fan_lv(rng)
    if name == "diabetes":
        return diabetes()
    raise ValueError(f"unknown dataset {name!r}; expected one of {', '.join(DATASETS)}")


def _centred(v: np.ndarray) -> np.ndarray:
    return v - v.mean(axis=0)


def _scaled(v: np.ndarray, scale: np.ndarray | float) -> np.ndarray:
    """v / scale, with a zero scale (a constant column) giving zeros, not NaN."""
    s = np.asarray(scale, dtype=np.float64)
    return np.divide(v, s, out=np.zeros_like(v), where=s > 0)


def max_abs(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """DP-SIS's input: columns and target centred, then scaled to max-abs 1, so every entry is
    in [−1, 1] (the bound the scores' sensitivity rests on)."""
    xc, yc = _centred(x), _centred(y)
    return _scaled(xc, np.abs(xc).max(axis=0)), _scaled(yc, np.abs(yc).max())


def standardised(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The Lasso's input: columns and target centred with unit variance, the usual scale for a
    penalty λ shared by all features (scikit-learn's λ = 0.1 on max-abs data keeps no feature
    at all on the Fan & Lv data)."""
    xc, yc = _centred(x), _centred(y)
    return _scaled(xc, xc.std(axis=0)), _scaled(yc, yc.std())
