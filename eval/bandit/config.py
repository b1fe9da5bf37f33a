"""The bandit study's configuration (paper §IX, Appendix H) and every check that needs no work."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from eval.bandit.environment import Arms
from recsvc.checks import ParamError
from recsvc.engines import resolve_workers
from recsvc.mechanisms import check_params
from recsvc.settings import Range, setting

PRIVATE = ("krr", "rnm", "rs", "gem", "mgem")  # each selects with the recsvc.mechanisms mechanism of its name
POLICIES = ("ucb", "thompson", *PRIVATE)  # the non-private baselines, then the private policies
INIT_STEPS = 2  # steps 1 and 2 pull arms 0 and 1 once (data-independent), so every mean exists
_AT_LEAST_1 = Range(1, integer=True)
_POSITIVE = Range(0, low_open=True)


@dataclass(frozen=True)
class BanditConfig:
    """Defaults are the paper's (Appendix H); ``seeds`` independent runs 0 … seeds − 1."""

    out: Path | None = setting(None, unit="dir", help="results directory, e.g. results/bandit")
    seeds: int = setting(10, help="independent runs, seeds 0 … N−1", check=_AT_LEAST_1)
    horizon: int = setting(50_000, help="steps T (default 50,000)", check=Range(INIT_STEPS + 1, integer=True))
    shift: int = setting(
        30_000, help="the arms swap after this step, 1 ≤ shift < horizon (default 30,000)", check=_AT_LEAST_1
    )  # t ≤ shift before, t > shift after
    arms: Arms = field(default_factory=Arms)
    alpha: float = setting(math.sqrt(2.0), help="UCB optimism", check=_POSITIVE)
    epsilon_select: float = setting(1.0, help="ε_S of rnm, rs, gem, mgem", check=_POSITIVE)
    # krr needs neither means' nor quantiles' budget, so the paper gives it more
    epsilon_krr: float = setting(4.0, help="ε_S of krr", check=_POSITIVE)
    epsilon_means: float = setting(1.0, help="ε_M of the hybrid counters", check=_POSITIVE)
    epsilon_pair: float = setting(1.0, help="ε_p per (p10, p90) pair", check=_POSITIVE)
    window: int = setting(200, help="w: observations per quantile estimate (disjoint windows)", check=_AT_LEAST_1)
    beta: float = 0.05  # GEM / mGEM
    gamma: float = 0.05  # RS_γ
    policies: tuple[str, ...] = POLICIES
    workers: int | None = setting(None, help="worker processes (default: min(2, cores))")
    force: bool = setting(False, help="replace an existing --out directory")
    progress: bool | None = None

    def epsilon_of(self, policy: str) -> float:
        return self.epsilon_krr if policy == "krr" else self.epsilon_select

    def params_of(self, policy: str) -> dict[str, float]:
        """The mechanism parameters a private policy selects with: the ones its mechanism declares."""
        from recsvc.mechanisms import params_of

        own = {"beta": self.beta, "gamma": self.gamma}
        return {k: v for k, v in own.items() if k in params_of(policy)} if policy in PRIVATE else {}


def validate(cfg: BanditConfig) -> BanditConfig:
    """The checks the settings do not make; raises :class:`ParamError` naming the parameter."""
    if cfg.shift >= cfg.horizon:
        raise ParamError(
            "{shift} must be < {horizon} (the arms swap after step shift, inside the run); got "
            "shift={s} and horizon={h}",
            s=cfg.shift,
            h=cfg.horizon,
        )
    check_params({"beta": cfg.beta, "gamma": cfg.gamma})  # their specs' ranges (a MechanismParamError names them)
    unknown = [p for p in cfg.policies if p not in POLICIES]
    if unknown or not cfg.policies or len(set(cfg.policies)) != len(cfg.policies):
        raise ParamError(
            "{policies} must be distinct names among {known}, got {got}",
            known=", ".join(POLICIES),
            got=list(cfg.policies),
        )
    resolve_workers(cfg.workers)
    return cfg
