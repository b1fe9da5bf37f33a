"""Lines of Python in the house at git revisions, as a Markdown table (issue 38: "the house gets
smaller, not bigger"): each part, eval, and the command lines and configs with the settings module
that declares them. Generated protobuf stubs are not counted; tests and scripts are not the house.

    python scripts/house_size.py 5d515b3 HEAD
"""

from __future__ import annotations

import argparse
import re
import subprocess
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PARTS = ("recsvc", "data_prep", "eval")
_CLI_OR_CONFIG = re.compile(r"(^|/)([a-z_]*_)?(cli|config)\.py$")
GROUPS: dict[str, Callable[[str], bool]] = {
    "recsvc": lambda p: p.startswith("recsvc/"),
    "data_prep": lambda p: p.startswith("data_prep/"),
    "eval": lambda p: p.startswith("eval/"),
    "CLIs and configs (`*cli.py`, `*config.py`, `recsvc/settings.py`)": lambda p: (
        bool(_CLI_OR_CONFIG.search(p)) or p == "recsvc/settings.py"
    ),
    "all three parts": lambda p: True,
}


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, check=True, capture_output=True, text=True).stdout


def line_counts(rev: str) -> dict[str, int]:
    """Each group's lines of Python at ``rev``."""
    files = [p for p in _git("ls-tree", "-r", "--name-only", rev, *PARTS).split() if p.endswith(".py")]
    files = [p for p in files if "_pb2" not in p]
    lines = {p: _git("show", f"{rev}:{p}").count("\n") for p in files}
    return {name: sum(n for p, n in lines.items() if keep(p)) for name, keep in GROUPS.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("revs", nargs="+", metavar="REV", help="git revisions, oldest first")
    revs = parser.parse_args().revs
    counts = [line_counts(r) for r in revs]
    print("| lines of Python | " + " | ".join(f"`{r}`" for r in revs) + " | change |")
    print("|---" * (len(revs) + 2) + "|")
    for name in GROUPS:
        cells = [f"{c[name]:,}" for c in counts]
        change = counts[-1][name] - counts[0][name]
        print(f"| {name} | " + " | ".join(cells) + f" | {change:+,} ({change / counts[0][name]:+.1%}) |")


if __name__ == "__main__":
    main()
