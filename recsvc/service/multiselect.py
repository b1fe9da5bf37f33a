"""MultiSelect without the wire format: prepare → execute (docs/concepts/multi-selection.md).

The device sends its history's code by C-ary randomised response (the default) or its lattice
signal (integers), both exactly local ε-DP; the server's k items are a deterministic function of
that signal and public data (:func:`recsvc.multiselection.respond_code`,
:func:`recsvc.multiselection.respond_lattice`), so answering spends nothing beyond the device's ε. The server cannot check the noise, so it charges
the ε the device DECLARES to ``user_id`` on the same ledger as Select, under the same protocol
(:meth:`recsvc.ledger.Ledger.reserve`, then :meth:`~recsvc.ledger.Ledger.commit`): the "draw" is the response, computed outside the
write transaction, and a retry with the same request_id returns the stored items and spends
nothing. Without user_id nothing is charged, nothing is stored, and the answer says so.

Every check runs before the ledger is touched, so a refused request spends nothing.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from recsvc.artifact import Artifact
from recsvc.checks import check_epsilon
from recsvc.ledger import Drawn, Ledger, Replay, StoredAnswer
from recsvc.ledger.units import charge_units
from recsvc.multiselection import SIGNAL_LIMIT, Lattice, prototype_codes, respond_code, respond_lattice
from recsvc.service.catalog import short
from recsvc.service.config import SelectorConfig
from recsvc.service.errors import InvalidRequest, Unavailable
from recsvc.service.requests import check_id, check_min_epsilon, check_user_id

log = logging.getLogger("recsvc.service")

MECHANISM = "multiselect"  # the ledger's mechanism column for these charges (recsvc ledger export)
CODE_ANSWERS = 4096  # code answers kept: one per (code, ε, k), a pure function of public data


@dataclass(frozen=True)
class MultiPrepared:
    """A checked MultiSelect request; the signal stays out of repr() (no log line prints it)."""

    user_id: str  # "" : not charged
    request_id: str
    fingerprint: bytes
    epsilon: float
    k: int
    signal: np.ndarray = field(repr=False)  # the lattice signal; empty for a code signal
    code: int | None = field(default=None, repr=False)  # the code signal


@dataclass(frozen=True)
class MultiAnswer:
    """What the response carries: MultiSelectResponse's fields, named as there."""

    item_ids: list[str]
    epsilon_spent: float
    budget_remaining: float
    replayed: bool
    charged: bool
    request_id: str


class MultiSelector:
    """The artifact's client bundle and population sample, and the MultiSelect rules."""

    def __init__(self, artifact: Artifact, config: SelectorConfig) -> None:
        self.config = config
        self.available = artifact.has_client_bundle
        self.version, self.dim, self.radius = "", 0, 0.0
        self.lattice = Lattice(0.0, 0)
        self.codebook_version, self.code_size = "", 0
        self._answers: OrderedDict[tuple[int, float, int], list[str]] = OrderedDict()
        self._lock = threading.Lock()
        if not self.available:
            log.info("%s has no client bundle: MultiSelect is unavailable (rebuild with `recsvc prep`)", artifact.path)
            return
        bundle = artifact.read_client_bundle()  # checked now: a bad bundle refuses the start
        self.population = artifact.multiselect_population.warm()
        self.item_ids = bundle.item_ids
        self.version, self.dim, self.radius = bundle.version, bundle.dim, bundle.radius
        self.lattice = bundle.lattice
        # The prototypes in the device's units, rounded once: the likelihood is then exact integers.
        self.points = self.lattice.point(self.population.embeddings)
        # Each prototype's own code: what the randomised-response likelihood compares.
        self.codebook_version, self.code_size = bundle.codebook_version, bundle.code_size
        self.codes = prototype_codes(self.population, bundle.codebook)

    @property
    def max_k(self) -> int:
        """The largest k a request may ask: the server's limit, within the catalog."""
        return min(self.config.limits.max_multiselect_k, len(self.item_ids)) if self.available else 0

    def prepare(
        self,
        user_id: str,
        request_id: str,
        signal: np.ndarray,
        float_values: int,
        grid_step: float,
        embedding_version: str,
        k: int,
        epsilon: float,
        fingerprint: Callable[[], bytes],
        code: int = 0,
        codebook_version: str = "",
    ) -> MultiPrepared:
        """Every check, in order, touching no ledger; InvalidRequest (or Unavailable) names what is wrong."""
        if not self.available:
            raise Unavailable(
                "this server's artifact has no client bundle (client/), so MultiSelect is unavailable; "
                "rebuild the artifact with `recsvc prep`"
            )
        if user_id:
            check_user_id(user_id)
        check_id("request_id", request_id, required=False)
        check_epsilon(epsilon, error=InvalidRequest)
        check_min_epsilon(epsilon, self.config.limits.min_epsilon)
        charge_units(epsilon)  # the ledger's range even when nothing is charged: one ε range for every call
        if not 1 <= k <= self.max_k:
            raise InvalidRequest(
                f"k={k} is out of range; expected 1 <= k <= {self.max_k} (max_multiselect_k, within the catalog)"
            )
        if embedding_version != self.version:
            raise InvalidRequest(
                f"embedding_version {short(embedding_version)} is not this server's; expected {self.version!r} "
                "(ListMechanisms.embedding_version): re-download the client bundle"
            )
        if float_values:
            raise InvalidRequest(
                f"the request carries a float signal ({float_values} values), which is not exactly ε-DP; expected "
                "code and codebook_version (or lattice_signal and grid_step): update the device and its client bundle"
            )
        rid = request_id or uuid.uuid4().hex
        if codebook_version:
            if signal.size or grid_step:
                raise InvalidRequest(
                    "the request carries both a code signal (codebook_version) and a lattice signal (lattice_signal "
                    "or grid_step); expected exactly one kind of signal"
                )
            if codebook_version != self.codebook_version:
                raise InvalidRequest(
                    f"codebook_version {short(codebook_version)} is not this server's; expected "
                    f"{self.codebook_version!r} (ListMechanisms.codebook_version): re-download the client bundle"
                )
            if not 0 <= code < self.code_size:
                raise InvalidRequest(
                    f"code {code} is out of range; expected 0 <= code < {self.code_size} (ListMechanisms.code_size)"
                )
            return MultiPrepared(user_id, rid, fingerprint(), float(epsilon), int(k), signal, int(code))
        if code:
            raise InvalidRequest(
                f"the request carries code {code} without codebook_version; expected codebook_version "
                f"{self.codebook_version!r} (ListMechanisms.codebook_version) with a code signal"
            )
        if grid_step != self.lattice.step:
            raise InvalidRequest(
                f"grid_step {grid_step!r} is not this bundle's; expected {self.lattice.step!r} "
                "(ListMechanisms.embedding_grid_step): re-download the client bundle"
            )
        if signal.shape != (self.dim,):
            raise InvalidRequest(
                f"lattice_signal has {signal.size} values; expected exactly {self.dim} (embedding_dim, one per coordinate)"
            )
        bad = np.flatnonzero((signal > SIGNAL_LIMIT) | (signal < -SIGNAL_LIMIT))  # not abs(): −2**63 overflows it
        if bad.size:
            raise InvalidRequest(
                f"{bad.size} lattice_signal value(s) are outside ±(2**53 - 1) (first: coordinate {int(bad[0])}); "
                "expected lattice points within that range"
            )
        return MultiPrepared(user_id, rid, fingerprint(), float(epsilon), int(k), signal)

    def items(self, p: MultiPrepared) -> list[str]:
        """The k items for ``p``'s signal, best expected first."""
        if p.code is not None:
            return self._code_items(p.code, p.epsilon, p.k)
        rows = respond_lattice(self.population, self.points, p.signal, p.epsilon, self.lattice, p.k)
        return [str(i) for i in self.item_ids[rows].tolist()]

    def _code_items(self, code: int, epsilon: float, k: int) -> list[str]:
        """The answer to a code: a function of (code, ε, k) and public data, so it is computed once
        and kept (the last CODE_ANSWERS)."""
        key = (code, epsilon, k)
        with self._lock:
            hit = self._answers.get(key)
            if hit is not None:
                self._answers.move_to_end(key)
                return list(hit)
        rows = respond_code(self.population, self.codes, code, epsilon, k)
        items = [str(i) for i in self.item_ids[rows].tolist()]
        with self._lock:
            self._answers[key] = items
            if len(self._answers) > CODE_ANSWERS:
                self._answers.popitem(last=False)
        return list(items)

    def execute(self, ledger: Ledger, p: MultiPrepared) -> MultiAnswer:
        """Answers ``p``: uncharged without a user_id; otherwise reserved, computed holding no
        ledger lock, and committed with its items (a replay returns the stored items, marked, and
        computes nothing)."""
        if not p.user_id:
            return MultiAnswer(self.items(p), 0.0, 0.0, False, False, p.request_id)
        got = ledger.reserve(p.user_id, p.request_id, p.fingerprint, p.epsilon, MECHANISM)
        if isinstance(got, Replay):
            return charged_answer(got.answer, p.request_id, replayed=True)
        with got:
            charge = ledger.commit(got, Drawn(tuple(self.items(p))))
        return charged_answer(charge.answer, p.request_id, charge.replayed)


def charged_answer(stored: StoredAnswer, request_id: str, replayed: bool) -> MultiAnswer:
    """The answer to a charged MultiSelect, from what the ledger stored."""
    return MultiAnswer(list(stored.item_ids), stored.epsilon, stored.remaining, replayed, True, request_id)
