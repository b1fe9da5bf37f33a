"""Atomic output directories: the one way any part writes one (artifacts, evaluation results).

:class:`StagedDir` fills a hidden temporary sibling and renames it into place only when the
caller publishes, so a crash never leaves a half-written directory; :func:`replace_dir` swaps an
existing directory for the new one in one ``renameat2`` call. Nothing here knows what the
directory holds.

Errors name parameters, not flags (:class:`recsvc.checks.ParamError`): the output directory's
parameter (``out`` unless the caller says otherwise), ``force`` and the protected inputs' names
(``artifacts``, ``data_dir`` …); the command line shows its own flags for them.
"""

from __future__ import annotations

import errno
import os
import secrets
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Self

from recsvc.checks import ParamError

PathLike = str | os.PathLike[str]


class Terminated(BaseException):
    """SIGTERM, raised in the main thread so that cleanup runs (a BaseException, like Ctrl-C)."""


_termination_requested = False


def request_termination() -> None:
    """Called by a SIGTERM handler before it raises :class:`Terminated`. That exception can be lost
    when the signal lands inside a C callback that swallows exceptions (numba's compiler cache
    notifies LLVM through one while it compiles); then no directory is published after it:
    :meth:`StagedDir.publish` raises it again."""
    global _termination_requested
    _termination_requested = True


class OutputError(ParamError):
    """An output directory cannot be created, or would replace one without ``force``."""


def _error(template: str, param: str, protected: str | None = None, **values: object) -> OutputError:
    """``template``'s ``{out}`` stands for the output's parameter, ``{input}`` for a protected one."""
    template = template.replace("{out}", "{" + param + "}")
    if protected is not None:
        template = template.replace("{input}", "{" + protected + "}")
    return OutputError(template, **values)


def check_out(out: PathLike, force: bool, param: str = "out", protect: Mapping[str, PathLike] | None = None) -> None:
    """Pure checks of an output directory path (only stats, nothing is created), so callers can
    validate every parameter before any work: not a file, under no file, absent unless ``force``,
    and never the current directory, one containing it, or overlapping a ``protect``ed input
    (parameter name → path: the run's own inputs), since ``force`` replaces ``out`` whole."""
    out = Path(out)
    real = out.resolve()
    for name, path in (protect or {}).items():
        other = Path(path).resolve()
        if real == other or other in real.parents or real in other.parents:
            rel = "is" if real == other else ("is inside" if other in real.parents else "contains")
            raise _error(
                "{out} {out_path} {relation} the {input} directory {input_path}; expected a separate "
                "output directory ({input} is never replaced, not even with {force})",
                param,
                name,
                out_path=str(out),
                relation=rel,
                input_path=str(path),
            )
    cwd = Path.cwd().resolve()
    if real == cwd or real in cwd.parents:
        raise _error(
            "{out} {out_path} {relation} the current directory; expected a separate output directory "
            "such as results/NAME or artifacts/NAME",
            param,
            out_path=str(out),
            relation="is" if real == cwd else "contains",
        )
    if out.exists() and not out.is_dir():
        raise _error(
            "cannot create {out} {out_path}: it exists and is not a directory; expected a directory path",
            param,
            out_path=str(out),
        )
    missing = _missing_parents(Path(os.path.abspath(out)))
    ancestor = missing[-1].parent if missing else Path(os.path.abspath(out)).parent
    if not ancestor.is_dir():
        raise _error(
            "cannot create {out} {out_path}: {ancestor} is not a directory",
            param,
            out_path=str(out),
            ancestor=str(ancestor),
        )
    if out.exists() and not force:
        raise _error("{out} {out_path} already exists; pass {force} to replace it", param, out_path=str(out))


class StagedDir:
    """The one way to write an output directory: ``with StagedDir(out, force) as s: <fill s.tmp>;
    s.publish()``.

    Construction runs :func:`check_out` (creates nothing). Entering creates ``out``'s missing
    parents and a hidden temp sibling ``.<name>.tmp-*``; :meth:`publish` renames it into place
    atomically. Leaving without a publish removes the temp dir and the parents it created (if
    still empty), so a failed run leaves the disk as it found it."""

    def __init__(
        self, out: PathLike, force: bool = False, param: str = "out", protect: Mapping[str, PathLike] | None = None
    ) -> None:
        check_out(out, force, param, protect)
        self.out = Path(out)  # as given, for messages and the return value
        self.force = force
        self.param = param
        self._path = Path(os.path.abspath(out))  # normalised: immune to chdir and to "x/.."
        self._tmp: Path | None = None
        self._created: list[Path] = []  # parents made on enter, outermost first

    def __enter__(self) -> Self:
        try:
            for d in reversed(_missing_parents(self._path)):
                try:
                    d.mkdir()
                except FileExistsError:
                    if d.is_dir():  # another run made it meanwhile: use it, never remove it
                        continue
                    raise
                self._created.append(d)
            # named before it is made: a SIGTERM between the mkdir and an assignment would leak it
            self._tmp = self._path.parent / f".{self._path.name}.tmp-{secrets.token_hex(4)}"
            self._tmp.mkdir(mode=0o700)
        except OSError as exc:
            self._tmp = None  # the mkdir failed: nothing to remove
            self._remove_created()
            raise _error(
                "cannot create {out} {out_path}: {reason} ({where})",
                self.param,
                out_path=str(self.out),
                reason=str(exc.strerror or exc),
                where=_failed_at(exc),
            ) from None
        except BaseException:  # Ctrl-C or SIGTERM on the way in: `with` will not call __exit__
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None
        self._remove_created()

    @property
    def tmp(self) -> Path:
        if self._tmp is None:
            raise RuntimeError(f"{type(self).__name__} used outside its `with` block (or after publish)")
        return self._tmp

    def publish(self) -> Path:
        """Renames the finished temp dir to ``out``. An ``out`` that another process created
        meanwhile (the checks saw it absent) is replaced only with ``force``."""
        if _termination_requested:
            raise Terminated()
        try:
            replace_dir(self.tmp, self._path, replace=self.force)
        except FileExistsError:  # created after the checks (atomic: RENAME_NOREPLACE)
            raise _error(
                "{out} {out_path} appeared while writing; not replacing it (pass {force} to replace it)",
                self.param,
                out_path=str(self.out),
            ) from None
        self._tmp = None
        self._created = []  # they hold ``out`` now
        return self.out

    def _remove_created(self) -> None:
        for d in reversed(self._created):
            try:
                d.rmdir()  # only if still empty: never removes anything this run did not make
            except OSError:
                break
        self._created = []


def _missing_parents(path: Path) -> list[Path]:
    """``path``'s ancestors that do not exist yet, innermost first."""
    missing: list[Path] = []
    parent = path.parent
    while not parent.exists():
        missing.append(parent)
        parent = parent.parent
    return missing


def _failed_at(exc: OSError) -> str:
    """The directory an OSError is about: a hidden temp dir's parent, else the path itself."""
    name = exc.filename
    if name and Path(name).name.startswith("."):
        return str(Path(name).parent)
    return str(name)


def replace_dir(tmp: Path, out: Path, replace: bool = True) -> Path:
    """Moves the finished directory ``tmp`` to ``out`` (a sibling). An existing ``out`` is
    exchanged with ``tmp`` in one atomic ``renameat2(RENAME_EXCHANGE)``, so readers, and a crash
    at any moment, see the old or the new directory, never none and never a mix. With
    ``replace=False`` an existing ``out``, even one made a moment ago, raises FileExistsError."""
    try:
        _renameat2(tmp, out, _RENAME_NOREPLACE)  # atomic: never over a directory made meanwhile
        return out
    except OSError as exc:
        if exc.errno not in (errno.EEXIST, errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):
            raise
    if out.exists() and not replace:
        raise FileExistsError(errno.EEXIST, "exists; not replacing it", str(out))
    if not out.exists():  # no RENAME_NOREPLACE here (old kernel or file system)
        os.replace(tmp, out)
        return out
    try:
        _exchange(tmp, out)
    except OSError as exc:
        if exc.errno not in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):
            raise
        _swap_by_two_renames(tmp, out)  # no RENAME_EXCHANGE here (old kernel or file system)
    else:
        shutil.rmtree(tmp, ignore_errors=True)  # tmp now holds the old directory
    return out


_RENAME_NOREPLACE = 1  # linux/fs.h
_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def _renameat2(a: Path, b: Path, flags: int) -> None:
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    renameat2 = getattr(libc, "renameat2", None)
    if renameat2 is None:
        raise OSError(errno.ENOSYS, "renameat2 is not available")
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), flags) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"cannot rename {a} to {b}: {os.strerror(err)}", str(b))


def _exchange(a: Path, b: Path) -> None:
    _renameat2(a, b, _RENAME_EXCHANGE)


def _swap_by_two_renames(tmp: Path, out: Path) -> None:
    """The fallback swap: a crash between the renames leaves the old directory at
    ``.<out>.old-<pid>``; an error puts it back."""
    old = out.with_name(f".{out.name}.old-{os.getpid()}")
    os.replace(out, old)
    try:
        os.replace(tmp, out)
    except BaseException:
        os.replace(old, out)
        raise
    shutil.rmtree(old, ignore_errors=True)
