"""scripts/warm_kernels.py drops numba cache files older than any source, since numba's own check
looks only at the defining file (a kernel keeps another module's old callees otherwise)."""

import os
from pathlib import Path

from scripts.warm_kernels import drop_stale_kernels


def test_cache_files_older_than_the_newest_source_are_dropped_and_newer_ones_kept(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "__pycache__").mkdir(parents=True)
    caller, callee = pkg / "caller.py", pkg / "callee.py"
    caller.write_text("x = 1\n")
    callee.write_text("y = 1\n")
    old = [pkg / "__pycache__" / n for n in ("caller.f-3.py311.nbi", "caller.f-3.py311.1.nbc")]
    fresh = pkg / "__pycache__" / "callee.g-1.py311.nbi"
    for f in (*old, fresh):
        f.write_bytes(b"")
    for f in old:
        os.utime(f, (1_000, 1_000))  # written before callee.py changed
    os.utime(callee, (2_000, 2_000))
    os.utime(caller, (1_500, 1_500))
    os.utime(fresh, (3_000, 3_000))
    assert drop_stale_kernels([pkg]) == 2
    assert sorted(p.name for p in (pkg / "__pycache__").iterdir()) == [fresh.name]
    assert drop_stale_kernels([pkg]) == 0
