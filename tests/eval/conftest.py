"""Tests of the evaluation harness (``recsvc eval``, ``eval-synthetic``, ``eval-bandit``, the
two-candidate and proportion studies, :mod:`eval`).

Tiny artifacts to evaluate come from :mod:`eval.testing` (``make_artifact``, and
``make_catalog_artifact`` for the pipelines that score the whole catalog). The ``snapshot`` and
``one_line_error`` fixtures (tests/conftest.py) check that a refused command changes nothing and
says why in one line. Exact mechanism probabilities to compare against come from the mechanisms'
reference implementations.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest


@pytest.fixture
def unrendered_figures(monkeypatch: pytest.MonkeyPatch) -> Callable[[], None]:
    """Call it, and from then on every study's figures are drawn from their data but written as
    empty files: laying them out and rendering them is most of a small run's CPU. For the later
    runs of a test whose first run rendered and checked them (a refused or ``--force`` rerun)."""

    def start() -> None:
        from eval import plots

        real = plots.save_figure

        def save(fig: Any, path: Path, dpi: int | None = None) -> None:
            path.write_bytes(b"")
            plots.pyplot().close(fig)

        for module in [m for name, m in sys.modules.items() if name == "eval" or name.startswith("eval.")]:
            if getattr(module, "save_figure", None) is real:  # each study imports it by name
                monkeypatch.setattr(module, "save_figure", save)

    return start
