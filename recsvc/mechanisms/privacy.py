"""What each mechanism promises, and how budgets are split among the steps of a selection.

A registry entry carries a :class:`Privacy` declaration, in the manner of OpenDP's measurements:

* ``privacy_map``: ε requested → ε consumed (pure ε-DP; ``math.inf`` for a mechanism that is not
  differentially private at any ε);
* ``neighbouring``: the relation between inputs under which the map holds;
* ``audit``: how the test suite proves the map (``exact``, ``statistical`` or ``none``) and the
  parameter settings it proves it at;
* ``proof``: where the argument is written (``docs/concepts/privacy-proofs.md#<mechanism>``).

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
    so the parts add up to ε), spread evenly over its steps. ``fraction_name`` names the
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

    def budgets(self, epsilon: float) -> tuple[float, ...]:
        """Each stage's total ε: fᵢ·ε, and ε minus those for the last; refused when a part rounds to 0."""
        parts = [f * epsilon for f in self.fractions]
        parts.append(epsilon - sum(parts))
        if not all(p > 0.0 for p in parts):  # subnormal ε
            shown = ", ".join(f"{f!r}" for f in self.fractions)
            raise MechanismInputError(
                f"epsilon={epsilon!r} is too small to split ({self.fraction_name}={shown}): "
                "a part rounds to 0; expected a larger epsilon"
            )
        return tuple(parts)

    def stage_epsilons(self, epsilon: float) -> tuple[float, ...]:
        """The ε of one step of each stage (what the sampler runs at); refused when one rounds to 0."""
        return _stage_epsilons(self, epsilon)

    def _stage_epsilons(self, epsilon: float) -> tuple[float, ...]:
        out = []
        for stage, budget in zip(self.stages, self.budgets(epsilon), strict=False):
            step = budget / stage.steps
            if not step > 0.0:
                raise MechanismInputError(
                    f"{stage.label} = {budget!r}/{stage.steps} rounds to 0; expected a larger epsilon"
                )
            out.append(step)
        return tuple(out)

    def consumed(self, epsilon: float) -> float:
        """Σ_stages steps · map(step ε): the composed privacy map at ``epsilon``.

        Computed in exact rational arithmetic on the nominal budgets (fᵢ·ε, the rest, each over
        its steps), so stages whose maps are all :func:`pure` consume exactly ``epsilon``. The
        floating-point step ε the sampler runs at differ from these by one rounding, far below
        the precision with which any mechanism computes with ε. A :class:`~fractions.Fraction`
        in gives a Fraction out (nested splits stay exact)."""
        exact = isinstance(epsilon, Fraction)
        eps = Fraction(epsilon)
        total = Fraction(0)
        rest = eps
        for i, stage in enumerate(self.stages):
            budget = eps * Fraction(self.fractions[i]) if i < len(self.fractions) else rest
            rest -= budget
            used = stage.privacy_map(budget / stage.steps)  # type: ignore[arg-type]  # a Fraction: maps are arithmetic
            if used == math.inf:
                return math.inf
            total += stage.steps * Fraction(used)
        return total if exact else float(total)  # type: ignore[return-value]  # Fraction in, Fraction out


# A sampler asks for its split's step ε on every draw (combined GEM twice); requests repeat a few ε.
# A refusal raises and is never cached.
@functools.lru_cache(maxsize=4096)
def _stage_epsilons(split: Split, epsilon: float) -> tuple[float, ...]:
    return split._stage_epsilons(epsilon)
