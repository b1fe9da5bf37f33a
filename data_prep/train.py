"""Fit SANSA (package ``sansa`` 1.1.0) on the public training users and wrap it as a :class:`Model`."""

from __future__ import annotations

import gc
import logging
from dataclasses import asdict, dataclass

import numpy as np
import scipy.sparse as sp

from recsvc.artifacts import Model

FACTORIZERS = ("cholmod", "icf")


@dataclass(frozen=True)
class SansaParams:
    l2: float
    density: float  # target density of the factors (SANSA's weight_matrix_density)
    factorizer: str = "cholmod"  # "cholmod" (exact, then sparsified) or "icf" (incomplete)
    umr_scans: int = 1
    umr_finetune_steps: int = 10

    def __post_init__(self) -> None:
        if not (np.isfinite(self.l2) and self.l2 > 0):
            raise ValueError(f"l2 must be a positive number, got {self.l2}")
        if not (0 < self.density <= 1):
            raise ValueError(f"density must be in (0, 1], got {self.density}")
        if self.factorizer not in FACTORIZERS:
            raise ValueError(f"unknown factorizer {self.factorizer!r}; expected one of {FACTORIZERS}")

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def fit(train: sp.csr_matrix, item_ids: np.ndarray, params: SansaParams, verbose: bool = False) -> Model:
    """SANSA's factors W1, W2 with scores x @ W1 @ W2; deterministic for the same input."""
    logging.getLogger("sansa").setLevel(logging.INFO if verbose else logging.ERROR)
    import sansa

    factorizer = (
        sansa.CHOLMODGramianFactorizerConfig()
        if params.factorizer == "cholmod"
        else sansa.ICFGramianFactorizerConfig()
    )
    config = sansa.SANSAConfig(
        l2=params.l2,
        weight_matrix_density=params.density,
        gramian_factorizer_config=factorizer,
        lower_triangle_inverter_config=sansa.UMRUnitLowerTriangleInverterConfig(
            scans=params.umr_scans, finetune_steps=params.umr_finetune_steps
        ),
    )
    # sansa calls gc.collect() ~25 times per fit; with numba and polars loaded each full
    # collection walks millions of long-lived objects. Freezing them makes those calls cheap.
    gc.freeze()
    try:
        model = sansa.SANSA(config).fit(sp.csr_matrix(train, dtype=np.float32))
    finally:
        gc.unfreeze()
    w1, w2 = model.weights
    return Model(w1=sp.csr_matrix(w1), w2=sp.csr_matrix(w2), item_ids=np.asarray(item_ids).astype(str))
