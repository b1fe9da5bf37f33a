"""The offline pipeline's configuration (docs/reference/specification.md §4): each setting of
`recsvc prep`, `recsvc policy` and `recsvc serving-bundle` declared once (recsvc.settings: its
flag, default, constraint and help), and what relates them checked once, before anything is loaded."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from data_prep import DATASETS, FACTORIZERS, datasets
from data_prep.datasets.synthetic import config_for
from data_prep.memory import parse_size
from recsvc.checks import ParamError
from recsvc.policy import DEFAULT_TRIALS as DEFAULT_POLICY_TRIALS
from recsvc.policy import DEFAULT_USERS as DEFAULT_POLICY_USERS
from recsvc.settings import Each, OneOf, Range, check, setting

POPULATIONS = ("validation", "test")
ENGINES = ("local", "dask")
SELECTION_METRIC = "ndcg@100"
DEFAULT_PRESET = "small"
DEFAULT_POPULATION_USERS = 10_000
DEFAULT_EMBEDDING_DIM = 32
DEFAULT_MULTISELECT_USERS = 5000
DEFAULT_MULTISELECT_GROUP = 5
DEFAULT_MULTISELECT_TOP = 100
POSITIVE_INT = Range(1, integer=True)
POSITIVE_INT_OR_NONE = Range(1, integer=True, none=True)  # None: the dataset's, preset's or machine's own


@dataclass
class PrepConfig:
    """Every `recsvc prep` setting, in the order of its --help; a None default means the dataset's
    (or preset's) own. The synthetic sizes are checked by the preset they override (config_for)."""

    dataset: str = setting("ml-100k", help="dataset to prepare (ml-100k: the embedded copy)", check=OneOf(DATASETS))
    data_dir: Path | None = setting(None, help="directory with the dataset's original files")
    out: Path | None = setting(None, help="artifact directory (default artifacts/<dataset>)")
    force: bool = setting(False, help="replace an existing artifact directory")
    seed: int = setting(42, help="seed of the split, the samples and the noise", check=Range(0, integer=True))
    sensitivity_population: str | None = setting(
        None,
        help="users whose scores give the clip ranges: validation (default) or test (the paper); "
        "amazon-book always uses a sample (--population-users)",
        check=OneOf(POPULATIONS, none=True),
    )
    percentiles: tuple[float, float] = setting(
        (1.0, 99.0), unit="percent", nargs=2, help="clip range of the scores: LO HI percentiles"
    )
    l2: tuple[float, ...] | None = setting(
        None,
        nargs="+",
        type=float,
        help="SANSA l2 (default: the dataset's); several values → chosen on validation users",
        check=Each(Range(0, low_open=True), none=True),
    )
    density: tuple[float, ...] | None = setting(
        None,
        nargs="+",
        type=float,
        help="SANSA factor density (default: the dataset's); several → chosen on validation",
        check=Each(Range(0, 1, low_open=True), none=True),
    )
    factorizer: str | None = setting(
        None, help="default: the dataset's paper setting", check=OneOf(FACTORIZERS, none=True)
    )
    preset: str | None = setting(None, help="netflix-shape | ml20m-shape | small | tiny (default small)")
    users: int | None = setting(None, help="override the preset's user count (≥ 1)")
    items: int | None = setting(None, help="override the preset's item count (≥ 20)")
    interactions: int | None = setting(None, help="override the preset's interaction count (≥ 5 × users)")
    test_users: int | None = setting(None, help="test users (default: the dataset's)", check=POSITIVE_INT_OR_NONE)
    val_users: int | None = setting(
        None, help="validation users (default: the dataset's)", check=Range(0, integer=True, none=True)
    )
    population_users: int | None = setting(
        None,
        help="amazon-book only: size of the sensitivity sample of training users (default 10000)",
        check=POSITIVE_INT_OR_NONE,
    )
    engine: str | None = setting(
        None, help="default: dask with --scheduler, else local", check=OneOf(ENGINES, none=True)
    )
    workers: int | None = setting(None, help="≥ 1 (default: min(2, CPUs))", check=POSITIVE_INT_OR_NONE)
    scheduler: str | None = setting(
        None,
        help="Dask scheduler address, e.g. tcp://HOST:8786 (implies --engine dask; "
        "refused with --engine local); connected before any work starts",
    )
    chunk_users: int = setting(1000, help="users scored per task", check=POSITIVE_INT)
    memory_limit: str | None = setting(  # e.g. "12GiB", checked by parse_size
        None,
        unit="size",
        help="refuse, before writing anything, a run estimated to need more memory than SIZE "
        "(e.g. 12GiB; default: no limit)",
    )
    policy_users: int = setting(
        DEFAULT_POLICY_USERS,
        help="population users it averages over: a seeded sample of larger populations",
        check=POSITIVE_INT,
    )
    policy_trials: int = setting(
        DEFAULT_POLICY_TRIALS,
        help="Monte Carlo selections per user for rs, rs_improved, rnm_laplace",
        check=POSITIVE_INT,
    )
    embedding_dim: int | None = setting(
        None,
        help="d of the public embedding, < min(training users, items) (default 32, or min − 1 on a smaller dataset)",
        check=POSITIVE_INT_OR_NONE,
    )
    multiselect_users: int = setting(
        DEFAULT_MULTISELECT_USERS,
        help="training users sampled, seeded, for the server's population",
        check=POSITIVE_INT,
    )
    multiselect_group: int = setting(
        DEFAULT_MULTISELECT_GROUP,
        help="least training users per population prototype, ≥ 2: no row of multiselect/ is one user's",
        check=Range(2, integer=True),
    )
    multiselect_top: int = setting(
        DEFAULT_MULTISELECT_TOP, help="top items by mean SANSA score kept per population prototype", check=POSITIVE_INT
    )
    progress: bool | None = None  # None: bars only on a terminal
    verbose: bool = False

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
        input fails before any directory exists: each setting's constraint, then what relates
        settings or needs the dataset. Errors are ParamErrors naming the field."""
        check(self)
        lo, hi = (float(v) for v in self.percentiles)
        if not (0.0 <= lo < hi <= 100.0):  # also false for NaN
            raise ParamError("{percentiles} must satisfy 0 ≤ lo < hi ≤ 100, got {lo} {hi}", lo=lo, hi=hi)
        self.percentiles = (lo, hi)
        self.memory_limit_bytes()
        self._validate_applicable(datasets.INFO[self.dataset])
        self._validate_scheduler()
        if self.data_dir is not None:
            d = Path(self.data_dir)
            if not d.is_dir():
                what = "is not a directory" if d.exists() else "does not exist"
                raise ParamError(
                    "{data_dir} {path} " + what + "; expected a directory with the dataset's files", path=str(d)
                )
        if self.dataset == "synthetic":  # preset name and sizes: pure checks, no data generated
            config_for(self.preset_name(), self.users, self.items, self.interactions)

    def _validate_applicable(self, info: datasets.DatasetInfo) -> None:
        """A parameter that would be silently ignored is refused instead."""
        if self.dataset != "synthetic":
            given = self._given("preset", "users", "items", "interactions")
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
            given = self._given("test_users", "val_users", "sensitivity_population")
            if given:
                raise ParamError(
                    f"{_fields(given)} {'does' if len(given) == 1 else 'do'} not apply to {{dataset}} {{name}} "
                    "(fixed train/test files); drop it",
                    name=self.dataset,
                )

    def _given(self, *names: str) -> list[str]:
        """Those of the settings ``names`` that were given (not None)."""
        return [n for n in names if getattr(self, n) is not None]

    def _validate_scheduler(self) -> None:
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


@dataclass(frozen=True)
class PolicyConfig:
    """`recsvc policy`: :func:`data_prep.rebuild_policy.rebuild`'s arguments."""

    artifacts: Path = setting(help="artifact directory, e.g. artifacts/ml-100k")
    users: int = setting(
        DEFAULT_POLICY_USERS, help="population users to average over, a seeded sample", check=POSITIVE_INT
    )
    trials: int = setting(
        DEFAULT_POLICY_TRIALS,
        help="Monte Carlo selections per user for mechanisms without an exact expectation",
        check=POSITIVE_INT,
    )
    seed: int | None = setting(
        None,
        help="seed of the sample and the Monte Carlo streams (default: the artifact's seed, as `recsvc prep` used)",
        check=Range(0, integer=True, none=True),
    )
    workers: int | None = setting(None, help="≥ 1 (default: min(2, CPUs))", check=POSITIVE_INT_OR_NONE)


@dataclass(frozen=True)
class BundleConfig:
    """`recsvc serving-bundle`: :func:`recsvc.artifact.write_serving_bundle`'s arguments."""

    artifacts: Path = setting(help="the full artifact directory `recsvc prep` wrote")
    out: Path = setting(help="the bundle directory to create")
    force: bool = setting(False, help="replace an existing bundle directory")


def _fields(params: list[str]) -> str:
    """``"{a}, {b}"``: the parameters as ParamError fields, for a message that lists several."""
    return ", ".join("{" + p + "}" for p in params)
