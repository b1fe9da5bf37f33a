"""What each mechanism promises, and how budgets are split among the steps of a selection.

A registry entry carries a :class:`Privacy` declaration, in the manner of OpenDP's measurements:

* ``privacy_map``: ε requested → ε consumed (pure ε-DP; ``math.inf`` for a mechanism that is not
  differentially private at any ε);
* ``neighbouring``: the relation between inputs under which the map holds;
* ``audit``: how the test suite proves the map (``exact``, ``statistical`` or ``none``) and the
  parameter settings it proves it at;
* ``proof``: where the argument is written (``docs/concepts/privacy-proofs.md#<mechanism>``);
* ``distance_map``: the map in OpenDP's d_in → d_out form (:class:`DistanceMap`), with what
  else the proof depends on (ε, the slate size k, the parameters) as arguments; the service
  charges it at d_in = 1.

A :class:`Split` is the ONE description of a budget divided among stages run one after another
(slates, two-stage selection, combined GEM's correlation bit): it gives each step's ε for the
sampler (:meth:`Split.stage_epsilons`) and the ε the whole run consumes by basic adaptive
composition (:meth:`Split.consumed`), which is what the service charges.
"""

from __future__ import annotations

import enum
import functools
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from types import MappingProxyType
from typing import Protocol

from recsvc.mechanisms.validation import MechanismInputError

# ε requested → ε consumed. Called with a float, or with a Fraction by Split.consumed (exact
# accounting); a map written with + − × / returns the same type it is given.
PrivacyMap = Callable[[float], float]
ParamSetting = Mapping[str, float]

PROOFS = "docs/concepts/privacy-proofs.md"


def pure(epsilon: float) -> float:
    """The map of an ε-DP mechanism run at ε: it consumes exactly what it is given."""
    return epsilon


def not_private(epsilon: float) -> float:
    """The map of a mechanism that is not ε′-DP for any finite ε′."""
    return math.inf


class Neighbouring(enum.Enum):
    """Which score vectors over the same candidates are neighbours (one user's history changed)."""

    BOUNDED = "scores move by at most Δ_a per candidate: |q_a − q′_a| ≤ Δ_a for every a"
    ANY = "any two score vectors over the same candidates (the output ignores how far they move)"


class AuditKind(enum.Enum):
    """How the test suite proves a declared map (``recsvc.mechanisms.testing.audit``)."""

    EXACT = "exact"  # exact output probabilities on neighbouring box vertices: worst loss ≤ map(ε)
    STATISTICAL = "statistical"  # sampled outputs: a certified lower bound on the loss ≤ map(ε)
    NONE = "none"  # nothing to prove: the map is infinite


@dataclass(frozen=True)
class Audit:
    """How a mechanism's map is audited. ``settings``: the mechanism-parameter values the audit
    runs at (``{}`` = the defaults). ``reach`` (exact audits): the share of map(ε) the worst
    box-vertex loss must attain, evidence that the audit meets near-worst cases rather than
    passing vacuously. ``draws`` (statistical audits): samples per input."""

    kind: AuditKind
    settings: tuple[ParamSetting, ...] = ({},)
    reach: float = 0.0
    draws: int = 100_000

    def __post_init__(self) -> None:
        if not self.settings:
            raise ValueError("an audit needs at least one parameter setting ({} = the defaults)")
        object.__setattr__(self, "settings", tuple(MappingProxyType(dict(s)) for s in self.settings))
        if not 0.0 <= self.reach <= 1.0:
            raise ValueError(f"reach is a share of the map's ε in [0, 1], got {self.reach!r}")
        if self.reach and self.kind is not AuditKind.EXACT:
            raise ValueError("reach applies to exact audits only")
        if self.draws < 1:
            raise ValueError(f"draws must be >= 1, got {self.draws!r}")


@dataclass(frozen=True, eq=False)  # identity equality: cheap to hash as a cache key
class Privacy:
    """A mechanism's privacy declaration. ``split`` (optional): the mechanism's own budget split
    among the sub-mechanisms it runs (combined GEM), as a function of its parameters; when
    declared, the charge is that split's composition and ``privacy_map`` states what it amounts
    to for every parameter value (the suite checks that they agree)."""

    privacy_map: PrivacyMap
    neighbouring: Neighbouring
    audit: Audit
    proof: str
    split: Callable[[Mapping[str, float]], Split] | None = field(default=None, repr=False)
    # The map d_in → d_out with ε, k and the parameters as arguments (what the service charges at
    # d_in = 1); None: derived from ``privacy_map`` by group privacy (:func:`group_map`).
    distance_map: DistanceMap | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if not self.proof.startswith(f"{PROOFS}#") or len(self.proof) == len(PROOFS) + 1:
            raise ValueError(f"proof must link a section of {PROOFS} (…#anchor), got {self.proof!r}")
        if (self.audit.kind is AuditKind.NONE) != (not self.private):
            raise ValueError("an audit of kind 'none' is for a mechanism with an infinite map, and only for it")

    @property
    def private(self) -> bool:
        """Whether the map is finite (checked at ε = 1; a pure-DP map is finite at every ε or none)."""
        return math.isfinite(self.privacy_map(1.0))

    @property
    def label(self) -> str:
        return "ε-DP" if self.private else "NOT DP"

    def consumed(self, epsilon: float, params: Mapping[str, float]) -> float:
        """ε consumed by one run at ``epsilon`` with ``params`` (the mechanism's own, checked)."""
        if self.split is not None:
            return self.split(params).consumed(epsilon)
        return self.privacy_map(epsilon)


@dataclass(frozen=True)
class Stage:
    """One stage of a :class:`Split`: ``steps`` runs of a mechanism with map ``privacy_map``,
    each at the stage's ε / steps. ``label`` names one step's ε in a refusal (``epsilon/k``)."""

    label: str
    steps: int = 1
    privacy_map: PrivacyMap = pure

    def __post_init__(self) -> None:
        if self.steps < 1:
            raise ValueError(f"a stage has at least one step, got {self.steps!r}")


@dataclass(frozen=True)
class Split:
    """ε divided among stages that run one after another, each seeing the earlier outputs.

    Stage i gets ``fractions[i]``·ε; the last stage gets the rest (ε minus the earlier stages,
    rounded so that the parts add up to at most ε on the reals), spread evenly over its steps. ``fraction_name`` names the
    parameter the fractions come from, in refusals. By basic adaptive composition the whole
    run consumes Σ_stages steps · map(step ε) (:meth:`consumed`).
    """

    stages: tuple[Stage, ...]
    fractions: tuple[float, ...] = ()
    fraction_name: str = ""

    def __post_init__(self) -> None:
        if len(self.fractions) != len(self.stages) - 1:
            raise ValueError(
                f"{len(self.stages)} stages take {len(self.stages) - 1} fraction(s), got {len(self.fractions)}"
            )
        if not all(0.0 < f < 1.0 for f in self.fractions) or sum(self.fractions) >= 1.0:
            raise ValueError(f"fractions must lie in (0, 1) and leave a share for the last stage, got {self.fractions}")

    # A sampler asks for its split's step ε on every draw (combined GEM once per call, a batch
    # once); requests repeat a few ε, and the exact check costs a few Fraction operations. A
    # refusal raises and is never cached.
    @functools.lru_cache(maxsize=4096)  # noqa: B019  # Splits are immutable and few: the cache may keep them
    def budgets(self, epsilon: float) -> tuple[float, ...]:
        """Each stage's total ε: fᵢ·ε, and ε minus those for the last, rounded down
        (:func:`at_most`) so that they add up to at most ε on the reals; refused when a part
        rounds to 0."""
        parts = [f * epsilon for f in self.fractions]
        rest = Fraction(epsilon) - sum((Fraction(p) for p in parts), Fraction(0))
        parts.append(at_most(epsilon - sum(parts), rest))
        if not all(p > 0.0 for p in parts):  # subnormal ε
            shown = ", ".join(f"{f!r}" for f in self.fractions)
            raise MechanismInputError(
                f"epsilon={epsilon!r} is too small to split ({self.fraction_name}={shown}): "
                "a part rounds to 0; expected a larger epsilon"
            )
        return tuple(parts)

    @functools.lru_cache(maxsize=4096)  # noqa: B019  # as budgets'
    def stage_epsilons(self, epsilon: float) -> tuple[float, ...]:
        """The ε of one step of each stage (what the sampler runs at): its budget over its steps,
        rounded down so that steps · step ≤ budget on the reals (:func:`at_most`), hence
        Σ steps · step ≤ ε exactly; refused when one rounds to 0."""
        out = []
        for stage, budget in zip(self.stages, self.budgets(epsilon), strict=False):
            step = at_most(budget / stage.steps, Fraction(budget), stage.steps)
            if not step > 0.0:
                raise MechanismInputError(
                    f"{stage.label} = {budget!r}/{stage.steps} rounds to 0; expected a larger epsilon"
                )
            out.append(step)
        return tuple(out)

    def exact_budgets(self, epsilon: Fraction) -> tuple[Fraction, ...]:
        """Each stage's nominal total ε in exact arithmetic: fᵢ·ε, and ε minus those for the last
        (what the composition sums; the samplers run at :meth:`stage_epsilons`' floats)."""
        parts = [epsilon * Fraction(f) for f in self.fractions]
        rest = epsilon
        for part in parts:
            rest -= part
        return (*parts, rest)

    def consumed(self, epsilon: float) -> float:
        """Σ_stages steps · map(step ε): the composed privacy map at ``epsilon``.

        Computed in exact rational arithmetic on the nominal budgets (fᵢ·ε, the rest, each over
        its steps), so stages whose maps are all :func:`pure` consume exactly ``epsilon``. The
        floating-point step ε the sampler runs at (:meth:`stage_epsilons`) are rounded so that
        Σ steps · step ≤ ε on the reals: what the run spends is at most this charge, not one
        rounding above it. A :class:`~fractions.Fraction` in gives a Fraction out (nested
        splits stay exact)."""
        exact = isinstance(epsilon, Fraction)
        total = Fraction(0)
        for stage, budget in zip(self.stages, self.exact_budgets(Fraction(epsilon)), strict=True):
            used = stage.privacy_map(budget / stage.steps)  # type: ignore[arg-type]  # a Fraction: maps are arithmetic
            if used == math.inf:
                return math.inf
            total += stage.steps * Fraction(used)
        return total if exact else float(total)  # type: ignore[return-value]  # Fraction in, Fraction out


def at_most(x: float, bound: Fraction, times: int = 1) -> float:
    """``x`` (a float ≥ 0 computed to approximate bound/times), stepped toward 0 one float at a
    time until times·x ≤ bound holds on the real numbers the floats denote. A split's parts come
    from rounded products, differences and quotients, each of which may round up by half an ulp;
    this makes the composition they enter hold exactly, not up to a rounding. One or two steps
    at most for a correctly rounded x; 0 when bound ≤ 0."""
    while x > 0.0 and times * Fraction(x) > bound:
        x = math.nextafter(x, 0.0)
    return x


# --- privacy maps d_in → d_out ------------------------------------------------------------------

Budget = Fraction | float  # an exact ε, or math.inf (the one float a map returns)


class StepMap(Protocol):
    """The map of ONE run of a mechanism: (d_in, the run's ε, its parameters) → the ε it consumes."""

    def __call__(self, d_in: Fraction, epsilon: Fraction, params: Mapping[str, float], /) -> Budget: ...


def scaled(d_in: Fraction, epsilon: Fraction, params: Mapping[str, float]) -> Budget:
    """A run whose loss is linear in how far the scores move: d_in·ε (noise or exponent scaled
    to the declared Δ: every score moving by d_in·Δ_a is d_in neighbour steps' worth)."""
    return d_in * epsilon


def any_change(d_in: Fraction, epsilon: Fraction, params: Mapping[str, float]) -> Budget:
    """A run that is ε-DP between ANY two inputs: ε once the scores move at all, however far."""
    return epsilon if d_in > 0 else Fraction(0)


def unbounded(d_in: Fraction, epsilon: Fraction, params: Mapping[str, float]) -> Budget:
    """A run that is not ε′-DP for any finite ε′ (``rnmh``)."""
    return math.inf if d_in > 0 else Fraction(0)


def split_step(split: Callable[[Mapping[str, float]], Split], steps: tuple[StepMap, ...]) -> StepMap:
    """The map of one run that spends its ε by ``split(params)`` (stage i runs ``steps[i]`` at
    its share): Σ_stages stage steps · map_i(d_in, share / steps), by basic adaptive composition."""

    def step(d_in: Fraction, epsilon: Fraction, params: Mapping[str, float]) -> Budget:
        s = split(params)
        total = Fraction(0)
        for stage, run, budget in zip(s.stages, steps, s.exact_budgets(epsilon), strict=True):
            used = run(d_in, budget / stage.steps, params)
            if used == math.inf:
                return math.inf
            total += stage.steps * Fraction(used)
        return total

    return step


@dataclass(frozen=True)
class DistanceMap:
    """A mechanism's privacy map in OpenDP's form, d_in → d_out, with everything else the proof
    depends on as arguments: ``map(d_in, epsilon, k, params)``.

    * ``d_in``: how far apart two score vectors over the same candidates are, in units of the
      declared sensitivities: ``max_a |q_a − q′_a| / Δ_a`` (the bounded neighbours are d_in ≤ 1);
    * ``epsilon``: the ε the mechanism runs at; ``k``: the slate size; ``params``: its declared
      parameters (combined GEM's split, random stopping's γ, …), checked;
    * the result ``d_out``: the ε the proof guarantees for one selection (k = 1) or one k-slate,
      exactly (a :class:`~fractions.Fraction`; ``math.inf`` where no finite ε holds).

    ``step`` is the map of one run. A ``one_shot`` mechanism draws a k-slate in one run at ε
    (d_out = step(d_in, ε)); any other peels k runs at ε/k (d_out = k·step(d_in, ε/k), basic
    adaptive composition). ``tight``: the proof's bound is attained at d_in = 1 (in the limit of
    a far gap), which the tests require of the exact law. ``text`` states the map for the docs."""

    step: StepMap
    one_shot: bool = False
    tight: bool = False
    text: str = ""

    def __call__(
        self, d_in: Budget | int, epsilon: Budget | int, k: int = 1, params: Mapping[str, float] | None = None
    ) -> Budget:
        d, eps = Fraction(d_in), Fraction(epsilon)
        if d < 0 or eps < 0 or k < 1:
            raise ValueError(f"a privacy map takes d_in ≥ 0, ε ≥ 0 and k ≥ 1, got {d_in!r}, {epsilon!r}, {k!r}")
        p = MappingProxyType({}) if params is None else params
        if self.one_shot or k == 1:
            return self.step(d, eps, p)
        used = self.step(d, eps / k, p)
        return math.inf if used == math.inf else k * Fraction(used)


def group_map(privacy: Privacy, one_shot: bool) -> DistanceMap:
    """The map of a declaration that states only ε ↦ ε′ at d_in = 1 (``privacy.consumed``): by
    group privacy along ⌈d_in⌉ neighbour steps (the bounded relation is convex: q → q′ in
    ⌈d_in⌉ moves of at most Δ_a each), d_out = ⌈d_in⌉·ε′."""

    def step(d_in: Fraction, epsilon: Fraction, params: Mapping[str, float]) -> Budget:
        if d_in == 0:
            return Fraction(0)
        used = privacy.consumed(epsilon, params)  # type: ignore[arg-type]  # a Fraction: maps are arithmetic
        return math.inf if used == math.inf else math.ceil(d_in) * Fraction(used)

    return DistanceMap(step, one_shot, text="⌈d_in⌉·map(ε) (group privacy)")
