"""Random generators: a CSPRNG for the service, seeded per-user streams for evaluation
(docs/reference/specification.md §3)."""

from __future__ import annotations

import secrets
import threading

import numpy as np
from randomgen import ChaCha


def csprng() -> np.random.Generator:
    """ChaCha20 keyed with 256 bits from the OS CSPRNG. Never log or persist its state."""
    return np.random.Generator(ChaCha(key=secrets.randbits(256), rounds=20))


_thread = threading.local()


def thread_csprng() -> np.random.Generator:
    """This thread's CSPRNG: numpy generators are not thread-safe, and keying a fresh ChaCha
    per draw would waste time. Never log or persist its state."""
    rng = getattr(_thread, "rng", None)
    if rng is None:
        rng = _thread.rng = csprng()
    return rng


def stream(seed: int, *key: int) -> np.random.Generator:
    """The reproducible stream of ``key`` under ``seed`` (``SeedSequence(seed, spawn_key=key)``):
    independent of chunking, of the engine and of every other key."""
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(seed, spawn_key=key)))


def user_stream(seed: int, user_index: int) -> np.random.Generator:
    """User ``user_index``'s reproducible stream: independent of chunking and of the engine."""
    return stream(seed, user_index)
