"""The one `recsvc` command: bad input and signals end in one clear line and leave nothing behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from recsvc.app import cli
from recsvc.checks import ParamError
from recsvc.engines import make_engine

REPO = Path(__file__).resolve().parents[2]
# A tiny prep whose `auto` policy table averages over 2 users with 1 trial: the default table is most
# of a tiny prep's CPU, and the signal tests that run prep to its end need every step, not the table's size.
SMALL_PREP = ["prep", "--dataset", "synthetic", "--preset", "tiny", "--policy-users", "2", "--policy-trials", "1"]


@pytest.mark.parametrize("workers", [0, -1, 1.5, True])
def test_engine_workers_must_be_a_positive_integer(workers) -> None:
    # The library names its parameter; `recsvc eval --workers 0` shows the flag (test_eval_safety).
    with pytest.raises(ParamError, match=r"^workers must be an integer ≥ 1, got "):
        make_engine("local", workers)


def test_engine_default_workers() -> None:
    engine = make_engine("local", None)
    assert engine.workers == min(2, os.cpu_count() or 1)


def _recsvc(*args: str, **kw) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "recsvc.app.cli", *args],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kw,
    )


def test_an_unusable_path_is_one_line_not_a_traceback(tmp_path: Path, one_line_error) -> None:
    """The command's main in this process (the signal tests below run it as a process of its own)."""
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    assert cli.main(["prep", "--dataset", "synthetic", "--preset", "tiny", "--out", str(blocker / "sub")]) == 2
    one_line_error(r"^recsvc prep: error:")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]


def test_no_sigterm_can_land_in_polars_loading_numpys_c_api(tmp_path: Path) -> None:
    """polars loads numpy's C API on its first array by running numpy's Python code from Rust; a
    SIGTERM raised there became a Rust panic (exit 1) instead of "terminated" (143). Every function of
    that code (numpy/lib/_version.py: NumpyVersion's methods) sends SIGTERM when it is called with
    the CLI's handler installed, from any thread: the CLI loads it before installing the handler, so
    prep is never hit there and finishes. (Wrapping those functions, not tracing every call, keeps
    the run at its normal speed.)"""
    script = textwrap.dedent("""
        import functools, os, signal, sys
        from numpy.lib import _version
        from recsvc.app import cli

        def armed(fn):
            @functools.wraps(fn)
            def call(*args, **kwargs):
                if signal.getsignal(signal.SIGTERM) is cli._terminate:
                    os.kill(os.getpid(), signal.SIGTERM)
                return fn(*args, **kwargs)
            return call

        cls = _version.NumpyVersion
        wrapped = [name for name, fn in vars(cls).items() if getattr(fn, "__code__", None)
                   and fn.__code__.co_filename == _version.__file__]
        assert "__init__" in wrapped and not [f for f in vars(_version).values()
                                              if getattr(f, "__code__", None)], "numpy's _version changed"
        for name in wrapped:
            setattr(cls, name, armed(vars(cls)[name]))
        sys.exit(cli.main(sys.argv[1:]))
    """)
    proc = subprocess.run(
        [sys.executable, "-c", script, *SMALL_PREP, "--out", str(tmp_path / "art")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0 and "panicked" not in proc.stderr, proc.stderr[-2000:]
    assert (tmp_path / "art" / "manifest.json").is_file()


@pytest.mark.parametrize(
    "swallower",
    [
        "ctypes.CFUNCTYPE(None)(lambda: os.kill(os.getpid(), signal.SIGTERM))()",  # a C callback
        "Finalized()",  # a __del__ (llvmlite's objects have them), run when the object is dropped
    ],
    ids=["c-callback", "finalizer"],
)
def test_a_sigterm_swallowed_by_a_callback_stops_the_run_quietly_before_it_publishes(
    tmp_path: Path, swallower: str
) -> None:
    """A SIGTERM that lands where Python cannot raise (a C callback: numba's compiler cache notifies
    LLVM through one while it compiles on a cold cache; a ``__del__``: llvmlite's finalizers) has its
    exception swallowed there, and the run goes on. It must still end as "terminated" (143), with
    nothing published, no temporary directory left and no traceback: here the signal arrives so
    while prep writes its items (as the artifact writer's write_items starts)."""
    script = textwrap.dedent(f"""
        import ctypes, os, signal, sys
        from recsvc.app import cli
        from recsvc.artifact.writer import ArtifactWriter

        class Finalized:
            def __del__(self):
                os.kill(os.getpid(), signal.SIGTERM)

        fired = []
        write_items = ArtifactWriter.write_items

        def swallowing_write_items(self, items):
            if not fired:
                fired.append(1)
                {swallower}  # the handler raises in there, and Python swallows it
                print("the swallower returned", file=sys.stderr)
            return write_items(self, items)

        ArtifactWriter.write_items = swallowing_write_items
        sys.exit(cli.main(sys.argv[1:]))
    """)
    proc = subprocess.run(
        [sys.executable, "-c", script, *SMALL_PREP, "--out", str(tmp_path / "art")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert "the swallower returned" in proc.stderr  # the exception was swallowed, and quietly:
    assert "Exception ignored" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert proc.returncode == 143 and "recsvc prep: terminated" in proc.stderr, proc.stderr[-2000:]
    assert list(tmp_path.iterdir()) == []


def test_sigterm_cleans_up_temporary_directories(tmp_path: Path) -> None:
    out = tmp_path / "art"
    proc = _recsvc("prep", "--dataset", "synthetic", "--preset", "tiny", "--out", str(out))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not any(p.name.startswith(".art") for p in tmp_path.iterdir()):
        time.sleep(0.02)  # wait until the run has made its temporary directory
    assert any(p.name.startswith(".art") for p in tmp_path.iterdir()), "prep never started writing"
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err
    assert "terminated" in err and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []  # no artifact, no .tmp-*, no .scratch-*
