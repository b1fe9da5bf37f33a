"""The bandit study's configuration (paper §IX, Appendix H) and every check that needs no work."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from eval.bandit.environment import Arms
from recsvc.checks import ParamError, check_int
from recsvc.engines import resolve_workers
from recsvc.mechanisms import check_params
from recsvc.staging import check_out

# policy → the recsvc.mechanisms name it selects with (None: a non-private baseline).
POLICIES: dict[str, str | None] = {
    "ucb": None,
    "thompson": None,
    "krr": "krr",
    "rnm": "rnm",
    "rs": "rs",
    "gem": "gem",
    "mgem": "mgem",
}
MECHANISM_OF: dict[str, str] = {p: m for p, m in POLICIES.items() if m is not None}  # the private policies
PRIVATE = tuple(MECHANISM_OF)
INIT_STEPS = 2  # steps 1 and 2 pull arms 0 and 1 once (data-independent), so every mean exists


@dataclass(frozen=True)
class BanditConfig:
    """Defaults are the paper's (Appendix H); ``seeds`` independent runs 0 … seeds − 1."""

    out: Path | None = None
    seeds: int = 10
    horizon: int = 50_000
    shift: int = 30_000  # the arms swap after this step: t ≤ shift before, t > shift after
    arms: Arms = field(default_factory=Arms)
    alpha: float = math.sqrt(2.0)  # UCB optimism
    epsilon_select: float = 1.0  # ε_S of rnm, rs, gem, mgem
    epsilon_krr: float = 4.0  # ε_S of krr (it needs neither means' nor quantiles' budget, so the paper gives it more)
    epsilon_means: float = 1.0  # ε_M of the hybrid counters
    epsilon_pair: float = 1.0  # ε_p per (p10, p90) pair
    window: int = 200  # w: observations per quantile estimate (disjoint windows)
    beta: float = 0.05  # GEM / mGEM
    gamma: float = 0.05  # RS_γ
    policies: tuple[str, ...] = tuple(POLICIES)
    workers: int | None = None
    force: bool = False
    progress: bool | None = None

    def epsilon_of(self, policy: str) -> float:
        return self.epsilon_krr if policy == "krr" else self.epsilon_select

    def params_of(self, policy: str) -> dict[str, float]:
        """The mechanism parameters a private policy selects with: the ones its mechanism declares."""
        from recsvc.mechanisms import params_of

        mechanism = POLICIES.get(policy)
        own = {"beta": self.beta, "gamma": self.gamma}
        return {} if mechanism is None else {k: v for k, v in own.items() if k in params_of(mechanism)}


def _positive(param: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (math.isfinite(value) and value > 0):
        raise ParamError(f"{{{param}}} must be a finite number > 0, got {{value}}", value=repr(value))


def validate(cfg: BanditConfig) -> None:
    """Raises :class:`ParamError` (naming the parameter) for bad input; creates nothing."""
    check_int("seeds", cfg.seeds, 1)
    check_int("horizon", cfg.horizon, INIT_STEPS + 1)
    check_int("shift", cfg.shift, 1)
    if cfg.shift >= cfg.horizon:
        raise ParamError(
            "{shift} must be < {horizon} (the arms swap after step shift, inside the run); got "
            "shift={s} and horizon={h}",
            s=cfg.shift,
            h=cfg.horizon,
        )
    check_int("window", cfg.window, 1)
    for name in ("alpha", "epsilon_select", "epsilon_krr", "epsilon_means", "epsilon_pair"):
        _positive(name, getattr(cfg, name))
    check_params({"beta": cfg.beta, "gamma": cfg.gamma})  # their specs' ranges (a MechanismParamError names them)
    unknown = [p for p in cfg.policies if p not in POLICIES]
    if unknown or not cfg.policies or len(set(cfg.policies)) != len(cfg.policies):
        raise ParamError(
            "{policies} must be distinct names among {known}, got {got}",
            known=", ".join(POLICIES),
            got=list(cfg.policies),
        )
    resolve_workers(cfg.workers)
    if cfg.out is not None:
        check_out(cfg.out, cfg.force)
