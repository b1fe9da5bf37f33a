"""The device's local choice among the server's k items, as docs/reference/client-bundle.md fixes
it, so that a device in any language keeps the same item. Its noise is the lattice signal's
(:mod:`.lattice`, :mod:`.discrete`)."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from recsvc.checks import ParamError


def local_choice(scores: npt.ArrayLike) -> int:
    """The index of the best of the server's k items by the device's true scores (−∞ for an item
    in the history), ties to the earlier item in the server's order. When every item is −∞ (all
    k are in the history) the first is kept: the server's best guess."""
    s = np.asarray(scores, dtype=np.float64)
    if s.ndim != 1 or s.shape[0] == 0:
        raise ParamError(
            "scores must be a non-empty 1-D array (one per returned item); got shape {shape}", shape=str(s.shape)
        )
    if np.isnan(s).any():
        raise ParamError("scores must not be NaN")
    return int(np.argmax(s))  # argmax keeps the first maximum
