"""The offline pipeline's configuration (docs/reference/specification.md §4): every `recsvc prep`
option as one dataclass, with its constraints checked once, before anything is loaded."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from data_prep import datasets
from data_prep.datasets.synthetic import config_for
from data_prep.memory import parse_size
from data_prep.sensitivities import validate_percentiles
from data_prep.train import FACTORIZERS
from recsvc.checks import ParamError, check_int
from recsvc.policy import DEFAULT_TRIALS as DEFAULT_POLICY_TRIALS
from recsvc.policy import DEFAULT_USERS as DEFAULT_POLICY_USERS

POPULATIONS = ("validation", "test")
ENGINES = ("local", "dask")
SELECTION_METRIC = "ndcg@100"
DEFAULT_PRESET = "small"
DEFAULT_POPULATION_USERS = 10_000
DEFAULT_EMBEDDING_DIM = 32
DEFAULT_MULTISELECT_USERS = 5000
DEFAULT_MULTISELECT_GROUP = 5
DEFAULT_MULTISELECT_TOP = 100


@dataclass
class PrepConfig:
    dataset: str = "ml-100k"
    data_dir: Path | None = None  # None: ml-100k from the embedded RecBole copy
    out: Path | None = None  # None: artifacts/<dataset> (artifacts/synthetic-<preset>)
    force: bool = False
    seed: int = 42
    sensitivity_population: str | None = None  # "validation" (None) or "test" (the paper); amazon-book: a sample
    percentiles: tuple[float, float] = (1.0, 99.0)
    l2: tuple[float, ...] | None = None  # None: the dataset's default; > 1 value: grid on validation
    density: tuple[float, ...] | None = None
    factorizer: str | None = None  # None: the dataset's default
    preset: str | None = None  # synthetic only; None: "small"
    users: int | None = None
    items: int | None = None
    interactions: int | None = None
    test_users: int | None = None  # None: the dataset's (or preset's) default
    val_users: int | None = None
    population_users: int | None = None  # amazon-book only (its seeded sample); None: 10,000
    engine: str | None = None  # None: "dask" with a scheduler, else "local"
    workers: int | None = None
    scheduler: str | None = None
    chunk_users: int = 1000
    policy_users: int = DEFAULT_POLICY_USERS  # population users the `auto` policy table averages (seeded sample)
    policy_trials: int = DEFAULT_POLICY_TRIALS  # its Monte Carlo selections per user (rs, rs_improved, rnm_laplace)
    # Multi-selection (client/ and multiselect/): the public embedding's d (None: 32, or less on a
    # dataset too small for it), the training users sampled for the server's population, the least
    # users per prototype (no row of multiselect/ is one user's), and the items kept per prototype.
    embedding_dim: int | None = None
    multiselect_users: int = DEFAULT_MULTISELECT_USERS
    multiselect_group: int = DEFAULT_MULTISELECT_GROUP
    multiselect_top: int = DEFAULT_MULTISELECT_TOP
    progress: bool | None = None  # None: bars only on a terminal
    verbose: bool = False
    memory_limit: str | None = None  # e.g. "12GiB": refuse up front a run estimated to need more

    def memory_limit_bytes(self) -> int | None:
        return None if self.memory_limit is None else parse_size(self.memory_limit)

    def output_dir(self) -> Path:
        if self.out is not None:
            return Path(self.out)
        if self.dataset != "synthetic":
            return Path("artifacts") / self.dataset
        custom = any(v is not None for v in (self.users, self.items, self.interactions))
        preset = self.preset_name()
        return Path("artifacts") / (f"synthetic-{preset}-custom" if custom else f"synthetic-{preset}")

    def embedding_dim_for(self, users: int, items: int) -> int:
        """The embedding's d on a training matrix of ``users`` × ``items``: as given (refused by
        :func:`data_prep.embedding.fit_embedding` if too large), else the default within min − 1."""
        if self.embedding_dim is not None:
            return self.embedding_dim
        return max(1, min(DEFAULT_EMBEDDING_DIM, min(users, items) - 1))

    def preset_name(self) -> str:
        return DEFAULT_PRESET if self.preset is None else self.preset

    def engine_name(self) -> str:
        if self.engine is not None:
            return self.engine
        return "dask" if self.scheduler else "local"

    def validate(self) -> None:
        """Checks every input without touching the disk or the network's expensive parts, so bad
        input fails before any directory exists. Errors are ParamErrors naming the field."""
        if self.dataset not in datasets.DATASETS:
            raise ParamError(
                "unknown {dataset} {value}; expected one of {names}",
                value=repr(self.dataset),
                names=", ".join(datasets.DATASETS),
            )
        info = datasets.INFO[self.dataset]
        check_int("seed", self.seed, 0)
        if self.sensitivity_population is not None and self.sensitivity_population not in POPULATIONS:
            raise ParamError(
                "unknown {sensitivity_population} {value}; expected one of {names}",
                value=repr(self.sensitivity_population),
                names=", ".join(POPULATIONS),
            )
        lo, hi = self.percentiles
        if not (0.0 <= lo < hi <= 100.0):  # also false for NaN
            raise ParamError("{percentiles} must satisfy 0 ≤ lo < hi ≤ 100, got {lo} {hi}", lo=lo, hi=hi)
        self.percentiles = validate_percentiles(self.percentiles)
        if self.factorizer is not None and self.factorizer not in FACTORIZERS:
            raise ParamError(
                "unknown {factorizer} {value}; expected one of {names}",
                value=repr(self.factorizer),
                names=", ".join(FACTORIZERS),
            )
        for param, values, ok, expected in (
            ("l2", self.l2, lambda v: math.isfinite(v) and v > 0, "a positive number"),
            ("density", self.density, lambda v: math.isfinite(v) and 0 < v <= 1, "in (0, 1]"),
        ):
            if values is None:
                continue
            if len(values) == 0:
                raise ParamError(f"{{{param}}} needs at least one value")
            for v in values:
                if not ok(float(v)):
                    raise ParamError(
                        f"{param} must be {{expected}}, got {{value}} ({{{param}}})", expected=expected, value=v
                    )
        check_int("chunk_users", self.chunk_users, 1)
        self.memory_limit_bytes()
        check_int("policy_users", self.policy_users, 1)
        check_int("policy_trials", self.policy_trials, 1)
        check_int("multiselect_users", self.multiselect_users, 1)
        check_int("multiselect_group", self.multiselect_group, 2)
        check_int("multiselect_top", self.multiselect_top, 1)
        for param, value, least in (
            ("workers", self.workers, 1),
            ("embedding_dim", self.embedding_dim, 1),
            ("population_users", self.population_users, 1),
            ("test_users", self.test_users, 1),
            ("val_users", self.val_users, 0),
        ):
            if value is not None:
                check_int(param, value, least)
        self._validate_applicable(info)
        self._validate_engine()
        if self.data_dir is not None:
            d = Path(self.data_dir)
            if not d.exists():
                raise ParamError(
                    "{data_dir} {path} does not exist; expected a directory with the dataset's files", path=str(d)
                )
            if not d.is_dir():
                raise ParamError(
                    "{data_dir} {path} is not a directory; expected a directory with the dataset's files", path=str(d)
                )
        if self.dataset == "synthetic":  # preset name and sizes: pure checks, no data generated
            config_for(self.preset_name(), self.users, self.items, self.interactions)

    def _validate_applicable(self, info: datasets.DatasetInfo) -> None:
        """A parameter that would be silently ignored is refused instead."""
        if self.dataset != "synthetic":
            given = [
                p
                for p, v in (
                    ("preset", self.preset),
                    ("users", self.users),
                    ("items", self.items),
                    ("interactions", self.interactions),
                )
                if v is not None
            ]
            if given:
                verb = "applies" if len(given) == 1 else "apply"
                raise ParamError(
                    f"{_fields(given)} only {verb} to {{dataset}} synthetic, got {{dataset}} {{name}}",
                    name=self.dataset,
                )
        elif self.data_dir is not None:
            raise ParamError("{data_dir} does not apply to {dataset} synthetic (its data is generated); drop it")
        if self.population_users is not None and not info.weak_generalisation:
            raise ParamError(
                "{population_users} only applies to {dataset} amazon-book (a sample of its training users), "
                "got {dataset} {name}; use {sensitivity_population} validation|test instead",
                name=self.dataset,
            )
        if info.weak_generalisation:
            given = [
                p
                for p, v in (
                    ("test_users", self.test_users),
                    ("val_users", self.val_users),
                    ("sensitivity_population", self.sensitivity_population),
                )
                if v is not None
            ]
            if given:
                raise ParamError(
                    f"{_fields(given)} {'does' if len(given) == 1 else 'do'} not apply to {{dataset}} {{name}} "
                    "(fixed train/test files); drop it",
                    name=self.dataset,
                )

    def _validate_engine(self) -> None:
        if self.engine is not None and self.engine not in ENGINES:
            raise ParamError(
                "unknown {engine} {value}; expected one of {names}", value=repr(self.engine), names=", ".join(ENGINES)
            )
        if self.scheduler is None:
            return
        if self.engine == "local":
            raise ParamError("{scheduler} needs {engine} dask (or no {engine}), got {engine} local")
        from distributed.comm import parse_address, parse_host_port
        from distributed.comm.registry import backends

        try:
            protocol, location = parse_address(self.scheduler)
            if protocol != "inproc":
                parse_host_port(location)
            if protocol not in backends:
                raise ValueError(f"unknown protocol {protocol!r}")
        except ValueError as exc:
            raise ParamError(
                "{scheduler} {value} is not a Dask scheduler address ({reason}); expected e.g. tcp://HOST:8786",
                value=repr(self.scheduler),
                reason=str(exc),
            ) from None


def _fields(params: list[str]) -> str:
    """``"{a}, {b}"``: the parameters as ParamError fields, for a message that lists several."""
    return ", ".join("{" + p + "}" for p in params)
