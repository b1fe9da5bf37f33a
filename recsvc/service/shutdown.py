"""Stop requests from SIGTERM/SIGINT that cannot deadlock, a watchdog for drains that hang, and
children that end with their parent.

A Python signal handler runs in the main thread between two bytecodes, wherever that thread is,
possibly while it holds a lock; a handler that takes a lock the interrupted code holds waits for
itself forever. `threading.Event.set` takes the Event's internal, non-reentrant lock, and the
main thread holds that lock for a few bytecodes of each `Event.wait`, so a worker whose SIGTERM
landed there would sleep forever while still serving its port via SO_REUSEPORT. The handler
therefore only increments a counter, and waiting polls that counter with time.sleep (which a
signal interrupts).

Stdlib only: the multi-worker parent imports this before it forks.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import select
import signal
import threading
import time

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
POLL_S = 0.05  # longest a waiter sleeps before it looks at the counter again
# How long a drain may overrun grace + drain_delay before the watchdog ends the process: room for
# the PostgreSQL pool's close (its 5 s timeout) and the health probe's join (2 s connect timeout).
DRAIN_MARGIN_S = 10.0
WATCHDOG_EXIT_CODE = 1
PARENT_POLL_S = 0.5  # how often a child looks whether its parent is still there (the portable check)
_PR_SET_PDEATHSIG = 1  # linux/prctl.h
# What the kernel sends a child whose parent thread ended; its handler checks that the parent is gone.
PARENT_DEATH_SIGNAL = signal.SIGUSR2


class StopSignal:
    """Counts SIGTERM/SIGINT; safe to wait on from the main thread."""

    def __init__(self) -> None:
        self.count = 0  # written only by the handler (main thread), read by anyone

    @classmethod
    def install(cls) -> StopSignal:
        """A new counter as this process's SIGTERM and SIGINT handler (main thread only)."""
        stop = cls()
        for sig in STOP_SIGNALS:
            signal.signal(sig, stop.handle)
        return stop

    def handle(self, signum: int, frame: object) -> None:
        self.count += 1  # no lock, no I/O, no logging: see the module docstring

    def wait(self, timeout: float | None = None) -> bool:
        """Blocks until a stop was requested (True) or ``timeout`` seconds passed (False)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.count:
            left = POLL_S if deadline is None else min(POLL_S, deadline - time.monotonic())
            if left <= 0:
                return False
            time.sleep(left)
        return True


class DrainWatchdog:
    """Ends this process if it is still alive ``limit_s`` seconds after its first stop signal.

    It does not depend on the main thread: besides polling ``stop``, a daemon thread reads the
    signal numbers that the C-level handler writes to `signal.set_wakeup_fd`, so it arms even when
    the main thread never runs Python code again. On expiry it writes one line and every thread's
    stack (faulthandler: no locks, no logging) to stderr, then `os._exit(1)`.
    """

    def __init__(self, stop: StopSignal, limit_s: float) -> None:
        self.limit_s = limit_s
        self._stop = stop
        self._done = threading.Event()  # set by disarm() from ordinary code, never from a handler
        self._read, self._write = os.pipe()
        os.set_blocking(self._write, False)  # set_wakeup_fd requires it; a full pipe just drops bytes
        self._previous_fd = signal.set_wakeup_fd(self._write, warn_on_full_buffer=False)
        self._thread = threading.Thread(target=self._run, name="recsvc-drain-watchdog", daemon=True)
        self._thread.start()

    def disarm(self) -> None:
        """The drain finished: stop watching and give the wakeup fd back (main thread only)."""
        self._done.set()
        with contextlib.suppress(BlockingIOError):  # a pipe full of signal numbers wakes it anyway
            os.write(self._write, b"\0")  # wakes the thread if it still waits for a signal
        self._thread.join()
        signal.set_wakeup_fd(self._previous_fd)
        os.close(self._read)
        os.close(self._write)

    def _run(self) -> None:
        stops = {int(s) for s in STOP_SIGNALS}
        while not self._stop.count:
            if self._done.is_set():
                return
            readable, _, _ = select.select([self._read], [], [], 0.5)  # the count: for a signal before the fd
            if readable and stops & set(os.read(self._read, 64)):
                break
        if self._done.wait(self.limit_s):
            return
        line = (
            f"recsvc serve: pid {os.getpid()}: the drain did not finish within {self.limit_s:g}s of the "
            f"stop signal; exiting with {WATCHDOG_EXIT_CODE} (thread stacks follow)\n"
        )
        data = line.encode() + _thread_stacks()
        while data:  # to stderr, however many writes it takes
            data = data[os.write(2, data) :]
        os._exit(WATCHDOG_EXIT_CODE)


def _thread_stacks() -> bytes:
    """Every thread's Python stack, as faulthandler prints it (no locks, works beside a deadlock);
    collected first so that workers sharing a stderr do not interleave their dumps."""
    if not hasattr(os, "memfd_create"):  # not Linux: straight to stderr
        faulthandler.dump_traceback(2, all_threads=True)
        return b""
    fd = os.memfd_create("recsvc-stacks")
    try:
        faulthandler.dump_traceback(fd, all_threads=True)
        os.lseek(fd, 0, os.SEEK_SET)
        return b"".join(iter(lambda: os.read(fd, 65536), b""))
    finally:
        os.close(fd)


def drain_limit(grace: float, drain_delay: float) -> float:
    """Seconds a drain may take before the watchdog ends the process."""
    return grace + drain_delay + DRAIN_MARGIN_S


def exit_with_parent(parent: int, sig: int = signal.SIGTERM) -> None:
    """Sends this process ``sig`` soon after its parent ``parent`` is gone, even if the parent died by
    SIGKILL: an orphaned worker would keep serving its SO_REUSEPORT port, an orphaned draw process
    would wait for work forever. Call it in the child's main thread (it installs a handler).

    Portable: a daemon thread compares os.getppid() with ``parent`` every :data:`PARENT_POLL_S`
    seconds (an orphan is re-parented to init or a subreaper). Linux, at once: the kernel's
    parent-death signal (prctl PR_SET_PDEATHSIG). The kernel sends it when the *thread* that created
    this process ends, and a request thread may spawn a draw process and end while the server runs,
    so that signal is :data:`PARENT_DEATH_SIGNAL`, whose handler passes ``sig`` on only if the
    parent process is gone.
    """

    def on_parent_death(signum: int, frame: object) -> None:
        if os.getppid() != parent:
            os.kill(os.getpid(), sig)

    signal.signal(PARENT_DEATH_SIGNAL, on_parent_death)
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, PARENT_DEATH_SIGNAL)
    except (OSError, AttributeError):  # not Linux: the thread below alone
        pass
    threading.Thread(target=watch_parent, args=(parent, sig), name="recsvc-parent-watch", daemon=True).start()
    if os.getppid() != parent:  # the parent died before either was armed
        os.kill(os.getpid(), sig)


def watch_parent(parent: int, sig: int) -> None:
    """Polls until this process's parent is no longer ``parent``, then sends this process ``sig``."""
    while os.getppid() == parent:
        time.sleep(PARENT_POLL_S)
    os.kill(os.getpid(), sig)
