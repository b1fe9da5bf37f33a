"""Refactors keep behaviour: a tiny synthetic artifact and an eval run on it match a recorded fingerprint.

What is determined is held to the byte: integer and string arrays and columns, schemas, file names,
row orders, JSON keys and every non-float value. Float values are the results of SVD, BLAS and
numpy's SIMD loops, whose last bits differ between CPUs (AVX2 against AVX-512, one OpenBLAS kernel
against another), so each float array or column is held to a sketch (count, sum, sum of squares, an
index-weighted sum, min, max) within ``RTOL`` of its scale, and each number printed in a CSV,
Markdown or JSON file within one unit of its last printed digit. Across CPUs the floats observed
differ by at most 3e-14 on values of order 1, five orders of magnitude inside ``RTOL``; a change of
behaviour moves them by far more. Wall-clock times and the summary's echo of the run's own config
are left out, and so are the SHA-256s that the manifests take of float files.

If a change is MEANT to change these outputs, re-record with
``RECSVC_RECORD_UNCHANGED=1 .venv/bin/python -m pytest tests/architecture/test_unchanged.py`` in the
same commit and say why there.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest

from recsvc.app import cli

pytestmark = pytest.mark.float_paths  # its floats come from BLAS, numpy's SIMD loops or numba

REFERENCE = Path(__file__).with_name("unchanged.json")
# 3e-14 observed across CPUs (SVD embeddings, BLAS scores) on values of order 1; a sum over n values
# moves by at most n times that, and n ≤ 10⁴ here: 1e-9 of the scale leaves five orders of margin.
RTOL = 1e-9
NUMBER = re.compile(r"-?\d+(?:\.(\d+))?(?:[eE]([-+]?\d+))?")
# Hashes of float bytes (the manifests' file maps, the embedding's version) differ between CPUs;
# the files they hash are each fingerprinted on their own.
VOLATILE_KEYS = {"timings_s", "seconds", "config", "embedding_version", "version"}


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _sketch(x: np.ndarray) -> dict[str, Any]:
    """What a float array is held to: its shape, where its NaNs and infinities are, and five
    statistics of its finite values that a change of any value, or of their order, moves."""
    v = np.asarray(x, dtype=np.float64).ravel()
    finite = np.isfinite(v)
    kinds = np.where(finite, 0, np.where(np.isnan(v), 1, np.where(v > 0, 2, 3))).astype(np.int8)
    f = np.where(finite, v, 0.0)
    return {
        "shape": list(np.shape(x)),
        "nonfinite": _sha(kinds.tobytes()),
        "scale": float(np.abs(f).sum()),
        "sum": float(f.sum()),
        "weighted": float((f * np.arange(1, v.size + 1) / max(v.size, 1)).sum()),
        "sumsq": float((f * f).sum()),
        "max_abs": float(np.abs(f).max(initial=0.0)),
    }


def _array(x: np.ndarray) -> dict[str, Any]:
    if np.issubdtype(x.dtype, np.floating):
        return {"float": _sketch(x)}
    return {"dtype": str(x.dtype), "shape": list(x.shape), "sha": _sha(np.ascontiguousarray(x).tobytes())}


def _frame(df: pl.DataFrame) -> dict[str, Any]:
    out: dict[str, Any] = {"schema": [f"{n}:{t}" for n, t in df.schema.items()]}
    for name in df.columns:
        col = df[name]
        if col.dtype.is_float():
            out[name] = {"float": _sketch(col.to_numpy())}
        else:
            out[name] = {"sha": _sha(json.dumps(col.to_list(), default=str).encode())}
    return out


def _json(obj: Any) -> Any:
    """The JSON value with volatile keys dropped and a file map reduced to its names."""
    if isinstance(obj, dict):
        return {
            k: (sorted(v) if k == "files" and isinstance(v, dict) else _json(v))
            for k, v in sorted(obj.items())
            if k not in VOLATILE_KEYS
        }
    if isinstance(obj, list):
        return [_json(v) for v in obj]
    return obj


def _text(text: str) -> dict[str, Any]:
    """Printed numbers apart from the text around them."""
    return {"shape": _sha(NUMBER.sub("#", text).encode()), "numbers": [m.group(0) for m in NUMBER.finditer(text)]}


def fingerprint(root: Path) -> dict[str, Any]:
    """Every file under ``root`` (PNG figures excepted: their bytes carry matplotlib's float paths)."""
    out: dict[str, Any] = {}
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        rel, suffix = path.relative_to(root).as_posix(), path.suffix
        if suffix == ".png":
            out[rel] = "png"
        elif suffix == ".npy":
            out[rel] = _array(np.load(path))
        elif suffix == ".npz":
            with np.load(path) as z:
                out[rel] = {k: _array(z[k]) for k in sorted(z.files)}
        elif suffix == ".parquet":
            out[rel] = _frame(pl.read_parquet(path))
        elif suffix == ".json":
            out[rel] = {"json": _json(json.loads(path.read_text()))}
        else:
            text = re.sub(r"; [0-9.]+ s\.$", "; <seconds> s.", path.read_text(), count=1, flags=re.M)
            out[rel] = {"text": _text(text)}
    return out


def _close_number(got: str, want: str) -> bool:
    """Integers exactly; a decimal within one unit of its last printed digit (a last-bit change
    can carry across a rounding boundary) or ``RTOL`` of its value, whichever is larger."""
    m = NUMBER.fullmatch(want)
    if got == want or m is None or NUMBER.fullmatch(got) is None or not (m.group(1) or m.group(2)):
        return got == want
    unit = 10.0 ** (int(m.group(2) or 0) - len(m.group(1) or ""))
    return abs(float(got) - float(want)) <= max(unit * (1 + RTOL), RTOL * abs(float(want)))


def differences(got: Any, want: Any, where: str = "") -> list[str]:
    """Where ``got`` departs from the recorded ``want`` beyond what the CPU may change."""
    if isinstance(want, dict) and "float" in want and isinstance(got, dict) and "float" in got:
        g, w = got["float"], want["float"]
        bad = [k for k in ("shape", "nonfinite") if g[k] != w[k]]
        bad += [k for k in ("scale", "sum", "weighted") if abs(g[k] - w[k]) > RTOL * w["scale"]]
        bad += [k for k in ("sumsq", "max_abs") if abs(g[k] - w[k]) > RTOL * w[k]]
        return [f"{where}: float {k} {g[k]!r} != {w[k]!r}" for k in bad]
    if isinstance(want, dict) and "numbers" in want and isinstance(got, dict) and "numbers" in got:
        if got["shape"] != want["shape"] or len(got["numbers"]) != len(want["numbers"]):
            return [f"{where}: text differs beyond its numbers"]
        pairs = enumerate(zip(got["numbers"], want["numbers"], strict=True))
        return [f"{where}: number {i}: {g} != {w}" for i, (g, w) in pairs if not _close_number(g, w)]
    if isinstance(want, dict) and isinstance(got, dict):
        if set(got) != set(want):
            return [f"{where}: keys {sorted(set(got) ^ set(want))} added or missing"]
        return [d for k in want for d in differences(got[k], want[k], f"{where}/{k}")]
    if isinstance(want, list) and isinstance(got, list) and len(got) == len(want):
        return [d for i, (g, w) in enumerate(zip(got, want, strict=True)) for d in differences(g, w, f"{where}[{i}]")]
    if isinstance(want, float) and isinstance(got, float):  # a JSON float, printed in full
        return [] if abs(got - want) <= RTOL * abs(want) else [f"{where}: {got!r} != {want!r}"]
    return [] if got == want else [f"{where}: {got!r} != {want!r}"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    work = tmp_path_factory.mktemp("unchanged")

    def run(*a: str) -> None:
        """The command's main in this process, in ``work`` (what it writes is under test, not its process)."""
        with pytest.MonkeyPatch.context() as mp:
            mp.chdir(work)
            assert cli.main(list(a)) == 0

    run("prep", "--dataset", "synthetic", "--preset", "tiny", "--out", "a")
    run(
        "eval",
        "--artifacts",
        "a",
        "--out",
        "r",
        "--trials",
        "5",
        "--epsilons",
        "0.1",
        "1",
        "--seed",
        "3",
        "--workers",
        "1",
    )
    got = {"artifact": fingerprint(work / "a"), "results": fingerprint(work / "r")}
    if os.environ.get("RECSVC_RECORD_UNCHANGED") == "1":
        REFERENCE.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
    return got


def test_artifact_is_unchanged(runs: dict[str, Any]) -> None:
    want = json.loads(REFERENCE.read_text())["artifact"]
    assert differences(runs["artifact"], want) == []


def test_eval_results_are_unchanged(runs: dict[str, Any]) -> None:
    want = json.loads(REFERENCE.read_text())["results"]
    assert differences(runs["results"], want) == []


def test_the_fingerprint_holds_determined_bytes_and_floats_to_their_tolerance(tmp_path: Path) -> None:
    """The comparison forgives a last-bit change of a float and catches a change of behaviour: a
    float moved by 1e-6 of its size, two values swapped, an integer changed, a printed digit changed."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal(1000)
    ints = np.arange(10, dtype=np.int32)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "i.npy", ints)
    (tmp_path / "r.csv").write_text("a,b\n0.123,7\n")
    want = fingerprint(tmp_path)

    def after(change: dict[str, Any]) -> list[str]:
        for name, value in change.items():
            if name.endswith(".npy"):
                np.save(tmp_path / name, value)
            else:
                (tmp_path / name).write_text(value)
        found = differences(fingerprint(tmp_path), want)
        np.save(tmp_path / "x.npy", x)
        np.save(tmp_path / "i.npy", ints)
        (tmp_path / "r.csv").write_text("a,b\n0.123,7\n")
        return found

    assert after({"x.npy": x * (1 + 4e-16 * rng.standard_normal(x.size))}) == []  # a few ulps: forgiven
    assert after({"r.csv": "a,b\n0.124,7\n"}) == []  # one unit of the last printed digit
    nudged = x.copy()
    nudged[3] += 1e-6 * np.abs(x).max()
    swapped = x.copy()
    swapped[[0, 1]] = swapped[[1, 0]]
    assert after({"x.npy": nudged}) and after({"x.npy": swapped})
    assert after({"i.npy": ints + (ints == 4)})
    assert after({"r.csv": "a,b\n0.126,7\n"}) and after({"r.csv": "a,b\n0.123,8\n"})


def test_numba_kernels_keep_ieee_semantics() -> None:
    """scripts/other_cpu.sh leaves numba's target CPU alone because no kernel lets LLVM reassociate
    or contract floats: fastmath (and parallel reductions, whose order depends on the threads) would
    make a kernel's bits depend on the CPU."""
    root = Path(__file__).resolve().parents[2]
    sources = [p for part in ("recsvc", "data_prep", "eval") for p in (root / part).rglob("*.py")]
    assert len(sources) > 50
    loose = [
        str(p.relative_to(root)) for p in sources if re.search(r"fastmath|parallel\s*=\s*True|prange", p.read_text())
    ]
    assert loose == []
