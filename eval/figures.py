"""Shared by every study's figures (the main evaluation, scenarios, two candidates, bandit, feature
selection, multi-selection): matplotlib's headless pyplot, and writing a figure."""

from __future__ import annotations

from pathlib import Path


def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path: Path, dpi: int | None = None) -> None:
    """Lays out, writes and closes ``fig`` (closing frees it: pyplot keeps every open figure)."""
    fig.tight_layout()
    fig.savefig(path, **({} if dpi is None else {"dpi": dpi}))
    pyplot().close(fig)
