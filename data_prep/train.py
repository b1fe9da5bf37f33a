"""Fit SANSA (package ``sansa`` 1.1.0) on the public training users and wrap it as a :class:`Model`."""

from __future__ import annotations

import gc
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
from tqdm.auto import tqdm

from data_prep import FACTORIZERS
from recsvc.model import Model


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


# SANSA logs (INFO) one of these as each stage of a fit ends: the factorization, every UMR scan
# and finetune step, and the inverse. They are the only progress it reports.
_STAGE_ENDS = (
    "Computing approximate inverse of L",
    "Performing UMR scan",
    "Performing UMR finetune step",
    "Constructing W",
)


class _FitProgress(logging.Handler):
    """Advances a tqdm bar on SANSA's own log records (the library has no progress hook)."""

    def __init__(self, bar: tqdm) -> None:
        super().__init__(logging.INFO)
        self.bar = bar

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage().strip()
        if message.startswith(_STAGE_ENDS):
            self.bar.update(1)
        if message and "\n" not in message and not message.startswith("Current maximum residual"):
            self.bar.set_postfix_str(message.rstrip(".")[:60], refresh=False)  # the stage now running


def fit_stages(params: SansaParams) -> int:
    """Units of the fit's progress bar: factorization, UMR scans, finetune steps, inverse."""
    return 2 + params.umr_scans + params.umr_finetune_steps


@contextmanager
def _progress(params: SansaParams, verbose: bool, progress: bool | None) -> Iterator[tqdm]:
    """SANSA's INFO records drive the bar; they reach the console only with ``verbose``."""
    logger = logging.getLogger("sansa")
    saved = logger.level, logger.propagate
    bar = tqdm(
        total=fit_stages(params),
        desc=f"SANSA fit ({params.factorizer})",
        unit="stage",
        leave=False,
        disable=None if progress is None else not progress,
    )
    handler = _FitProgress(bar)
    logger.setLevel(logging.INFO)
    logger.propagate = verbose
    logger.addHandler(handler)
    try:
        yield bar
        bar.update(bar.total - bar.n)  # finetuning may stop early when the residual settles
    finally:
        logger.removeHandler(handler)
        logger.setLevel(saved[0])
        logger.propagate = saved[1]
        bar.close()


def fit(
    train: sp.csr_matrix, item_ids: np.ndarray, params: SansaParams, verbose: bool = False, progress: bool | None = None
) -> Model:
    """SANSA's factors W1, W2 with scores x @ W1 @ W2; deterministic for the same input.

    ``progress``: a tqdm bar over the fit's stages (None: only on a terminal)."""
    import sansa

    factorizer = (
        sansa.CHOLMODGramianFactorizerConfig() if params.factorizer == "cholmod" else sansa.ICFGramianFactorizerConfig()
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
        with _progress(params, verbose, progress):
            model = sansa.SANSA(config).fit(sp.csr_matrix(train, dtype=np.float32))
    finally:
        gc.unfreeze()
    w1, w2 = model.weights
    return Model(w1=sp.csr_matrix(w1), w2=sp.csr_matrix(w2), item_ids=np.asarray(item_ids).astype(str))
