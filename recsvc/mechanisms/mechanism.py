"""One selection mechanism as the registry holds it: its samplers, exact laws, parameters and
privacy declaration (:class:`Mechanism`), and the signatures of the functions it carries."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np

from recsvc.mechanisms.params import ParamSpec, ParamValues, param_specs
from recsvc.mechanisms.privacy import AuditKind, DistanceMap, Privacy, group_map

# sample(q, Δ, ε, own params, rng, size) -> (size,) int64 indices; log_p(q, Δ, ε, own params) -> (n,)
SampleFn = Callable[[np.ndarray, np.ndarray, float, ParamValues, np.random.Generator, int], np.ndarray]
LogProbFn = Callable[[np.ndarray, np.ndarray, float, ParamValues], np.ndarray]
# expectation(q, Δ, ε, own params, values ≥ 0) -> E[values[output]], exactly and cheaply
ExpectationFn = Callable[[np.ndarray, np.ndarray, float, ParamValues, np.ndarray], float]
# top_k(q, Δ, ε, own params, rng, k) -> (k,) int64 distinct indices: a whole k-item slate at ε, one pass
TopKFn = Callable[[np.ndarray, np.ndarray, float, ParamValues, np.random.Generator, int], np.ndarray]
# peel(q, Δ, ε_step, own params, rng, k) -> (k,) int64 distinct indices: k peeled selections at
# ε_step each, drawn natively (same law as k ``sample`` calls on the survivors, fewer draws)
PeelFn = Callable[[np.ndarray, np.ndarray, float, ParamValues, np.random.Generator, int], np.ndarray]
# peel_work(q, Δ, ε_step, own params, k) -> the native peel's expected cost, in random draws' worth
PeelWorkFn = Callable[[np.ndarray, np.ndarray, float, ParamValues, int], float]
# batch(q (B, n), Δ (B, n), ε, own params, stream, trials) -> (B, trials) int64: row b is
# ``sample(q[b], Δ[b], ε, params, stream(b), trials)``, the same function of that stream
BatchFn = Callable[[np.ndarray, np.ndarray, float, ParamValues, Callable[[int], np.random.Generator], int], np.ndarray]
# rows(q (N,), Δ (N,), lengths (B,), ε (B,), own params, rng) -> (B,) int64: one selection per row
# of a ragged batch from ONE generator, row b with ``sample``'s law on its row, rows independent
RowsFn = Callable[[np.ndarray, np.ndarray, np.ndarray, np.ndarray, ParamValues, np.random.Generator], np.ndarray]
# slate_log_p(q, Δ, ε, own params, k) -> log P(slate) for every ordered k-tuple (small n)
SlateLogProbFn = Callable[[np.ndarray, np.ndarray, float, ParamValues, int], dict[tuple[int, ...], float]]


FLOAT_EXACT = "pure ε-DP, exact: sampled exactly at every ε (δ = 0)"
FLOAT_UNMEASURED = "float64 sampling; δ(ε) not measured"


@dataclass(frozen=True)
class Mechanism:
    """One selection mechanism. ``privacy`` declares what it promises and how that is proven
    (``private`` is False only for ``rnmh``, whose map is infinite); it is ``exact`` when it
    has ``log_probabilities_fn``; ``params`` maps each parameter it takes to its spec;
    ``expectation_fn`` (exact mechanisms only) is a cheap exact E[values[output]], declared where
    one exists: the `auto` policy table needs millions of expected errors (rnm_laplace has none,
    its exact probabilities cost ~40 ms at n = 500).

    ``top_k`` (one-shot mechanisms only) draws a whole k-item slate at ε in one pass, and
    ``privacy`` then states what that slate consumes: slates run it instead of peeling, and are
    charged ``privacy_map(ε)`` once. ``sample`` must be its k = 1 case, drawing the same stream;
    ``slate_log_probabilities_fn`` gives its exact slate law where tractable. ``peel_fn`` (peeled
    mechanisms only) draws a peeled slate natively, with the law of k ``sample`` steps, and
    ``peel_work_fn`` says what that costs (a service prices heavy work with it). ``default``: whether
    the mechanism is in the default set, the one the evaluation harness runs and `auto`'s policy
    table ranks when no mechanisms are named (:func:`default_mechanisms`). ``batch`` (optional)
    is ``select_batch``'s path: each row the same function of its user's stream as ``sample``,
    sharing across rows what does not depend on the scores. ``rows`` (optional) is
    :func:`~recsvc.mechanisms.rows.select_rows`' path: many users' single selections drawn in one
    pass from one generator (a service's batch)."""

    name: str
    description: str  # one line
    sample: SampleFn = field(repr=False, compare=False)
    log_probabilities_fn: LogProbFn | None = field(default=None, repr=False, compare=False)
    params: Mapping[str, ParamSpec] = field(default_factory=param_specs, compare=False)
    expectation_fn: ExpectationFn | None = field(default=None, repr=False, compare=False)
    privacy: Privacy = field(kw_only=True)
    top_k: TopKFn | None = field(default=None, repr=False, compare=False, kw_only=True)
    slate_log_probabilities_fn: SlateLogProbFn | None = field(default=None, repr=False, compare=False, kw_only=True)
    peel_fn: PeelFn | None = field(default=None, repr=False, compare=False, kw_only=True)
    peel_work_fn: PeelWorkFn | None = field(default=None, repr=False, compare=False, kw_only=True)
    batch: BatchFn | None = field(default=None, repr=False, compare=False, kw_only=True)
    rows: RowsFn | None = field(default=None, repr=False, compare=False, kw_only=True)
    default: bool = field(default=True, kw_only=True)
    # What the float64 implementation delivers against the declared map: FLOAT_EXACT when the
    # sampler follows the exact law at every ε (δ = 0), else the measured δ(ε) or that none was.
    float_level: str = field(default=FLOAT_UNMEASURED, kw_only=True, compare=False)

    def __post_init__(self) -> None:
        if not self.name or not self.description or "\n" in self.description:
            raise ValueError(f"mechanism {self.name!r} needs a name and a one-line description")
        if self.expectation_fn is not None and self.log_probabilities_fn is None:
            raise ValueError(f"mechanism {self.name!r}: an expectation_fn needs log_probabilities_fn (exact)")
        if self.slate_log_probabilities_fn is not None and (self.top_k is None or not self.exact):
            raise ValueError(f"mechanism {self.name!r}: exact slate probabilities need top_k and log_probabilities_fn")
        if self.peel_fn is not None and self.top_k is not None:
            raise ValueError(f"mechanism {self.name!r}: a one-shot mechanism is never peeled, so it takes no peel_fn")
        if (self.peel_fn is None) != (self.peel_work_fn is None):
            raise ValueError(f"mechanism {self.name!r}: a native peel_fn and its peel_work_fn come together")
        if any(k != spec.name for k, spec in self.params.items()):
            raise ValueError(f"mechanism {self.name!r}: params must map each spec's own name to it")
        object.__setattr__(self, "params", param_specs(*self.params.values()))  # a read-only copy
        if not isinstance(self.privacy, Privacy):
            raise ValueError(f"mechanism {self.name!r} needs a Privacy declaration, got {self.privacy!r}")
        if self.privacy.audit.kind is AuditKind.EXACT and not self.exact:
            raise ValueError(f"mechanism {self.name!r}: an exact audit needs log_probabilities_fn")
        declared = self.privacy.distance_map
        if declared is not None and declared.one_shot != self.one_shot:
            raise ValueError(
                f"mechanism {self.name!r}: its privacy map composes a slate "
                f"{'in one run' if declared.one_shot else 'by peeling'}, its sampler "
                f"{'in one run' if self.one_shot else 'by peeling'}"
            )
        for setting in self.privacy.audit.settings:
            if not set(setting) <= set(self.params):
                raise ValueError(
                    f"mechanism {self.name!r}: its audit sets {sorted(set(setting) - set(self.params))}, "
                    "which it does not take"
                )

    @property
    def exact(self) -> bool:
        return self.log_probabilities_fn is not None

    @property
    def private(self) -> bool:
        return self.privacy.private

    @property
    def distance_map(self) -> DistanceMap:
        """The privacy map d_in → d_out (ε, k and parameters as arguments): the declared one, or
        for a declaration of ε ↦ ε′ only, its group-privacy extension (:func:`group_map`)."""
        declared = self.privacy.distance_map
        return group_map(self.privacy, self.one_shot) if declared is None else declared

    @property
    def one_shot(self) -> bool:
        """Whether a slate is one run of ``top_k`` (else k peeled selections at ε/k each)."""
        return self.top_k is not None
