"""recsvc.multiselection.device: the device's local choice among the server's k items, exactly as
docs/reference/client-bundle.md specifies it for every language (its noise: test_multiselection_lattice.py)."""

from __future__ import annotations

import numpy as np
import pytest

from recsvc.checks import ParamError
from recsvc.multiselection import local_choice


def test_local_choice_keeps_the_best_ties_to_the_earlier_item() -> None:
    assert local_choice([0.2, 0.9, 0.9, 0.1]) == 1
    assert local_choice([-np.inf, 0.3, 0.5]) == 2
    assert local_choice([-np.inf, -np.inf]) == 0  # every item seen: the server's first
    with pytest.raises(ParamError, match="non-empty 1-D"):
        local_choice([])
    with pytest.raises(ParamError, match="NaN"):
        local_choice([0.1, np.nan])
