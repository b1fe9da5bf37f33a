"""Tests of the evaluation harness (``recsvc eval``, ``eval-synthetic``, ``eval-bandit``, the
two-candidate and proportion studies, :mod:`eval`).

Tiny artifacts to evaluate come from :mod:`eval.testing` (``make_artifact``, and
``make_catalog_artifact`` for the pipelines that score the whole catalog). The ``snapshot`` and
``one_line_error`` fixtures (tests/conftest.py) check that a refused command changes nothing and
says why in one line. Exact mechanism probabilities to compare against come from the mechanisms'
reference implementations.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from eval import testing


@pytest.fixture
def unrendered_figures(monkeypatch: pytest.MonkeyPatch) -> Callable[[], None]:
    """Call it, and from then on figures are written as empty files (:func:`eval.testing.unrendered_figures`)."""
    return lambda: testing.unrendered_figures(monkeypatch)
