"""The typed ``manifest.json``: what the pipeline records and what consumers read.

Each record has typed fields for the keys consumers read and keeps every other key in
``extra``, so ``Manifest.from_dict(d).to_dict() == d`` for any valid manifest and the JSON the
writer produces is byte-identical to the dict it was given. Values are checked, never coerced
(an integer stays an integer), since a coercion would change the bytes. An optional field that
is None is absent from the JSON.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import MISSING, Field, dataclass, field, fields
from typing import TYPE_CHECKING, Any, ClassVar, Self

from recsvc.artifact.format import ArtifactError


@dataclass(frozen=True)
class _Kind:
    """How one field's JSON value is checked and turned into its typed value."""

    expected: str  # for messages: "an integer", "an object" …
    ok: Callable[[Any], bool]
    convert: Callable[[Any, str, str], Any] = lambda value, source, path: value


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _is_str(v: Any) -> bool:
    return isinstance(v, str)


def _map_of(expected: str, check: Callable[[Any], bool], size: Callable[[int], bool] = lambda n: True) -> _Kind:
    """A JSON object of string keys whose every value passes ``check`` and whose size passes ``size``."""
    return _Kind(
        expected,
        lambda v: isinstance(v, dict) and size(len(v)) and all(isinstance(k, str) and check(x) for k, x in v.items()),
        lambda v, s, p: dict(v),
    )


def _list_of(expected: str, check: Callable[[Any], bool], size: Callable[[int], bool] = bool) -> _Kind:
    """A JSON list whose every element passes ``check`` and whose length passes ``size``, as a tuple."""
    return _Kind(
        expected, lambda v: isinstance(v, list) and size(len(v)) and all(map(check, v)), lambda v, s, p: tuple(v)
    )


_INT = _Kind("an integer", _is_int)
_NUMBER = _Kind("a number", _is_number)
_STR = _Kind("a string", _is_str)
_STR_MAP = _map_of("an object of strings", _is_str)
_NUMBER_MAP = _map_of("an object of numbers", _is_number)
_FILES = _map_of("a non-empty object of file → sha256", _is_str, bool)
_PAIR = _list_of("a list of two numbers", _is_number, lambda n: n == 2)
_NUMBERS = _list_of("a non-empty list of numbers", _is_number)
_INTS = _list_of("a non-empty list of integers", _is_int)
_STRS = _list_of("a non-empty list of strings", _is_str)
_OBJECTS = _Kind(
    "a list of objects",
    lambda v: isinstance(v, list) and all(isinstance(x, dict) for x in v),
    lambda v, s, p: tuple(dict(x) for x in v),
)


def _section(cls: type[_Record]) -> _Kind:
    return _Kind("an object", lambda v: isinstance(v, dict), lambda v, source, path: cls._parse(v, source, path + "."))


def _required(kind: _Kind) -> Any:
    return field(metadata={"kind": kind})


def _optional(kind: _Kind) -> Any:
    return field(default=None, metadata={"kind": kind})


def _extra() -> Any:
    return field(default_factory=dict)


def _plain(value: Any) -> Any:
    """A typed value back as the JSON value it came from."""
    if isinstance(value, _Record):
        return value.to_dict()
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


class _Record:
    """A JSON object with typed fields (metadata ``kind``) and ``extra``: every other key."""

    extra: Mapping[str, Any]
    # Every record is a frozen dataclass; declared here so the type checker lets `fields()` and `cls(**...)`
    # work on the base class.
    __dataclass_fields__: ClassVar[dict[str, Field[Any]]]

    if TYPE_CHECKING:

        def __init__(self, **values: Any) -> None: ...

    @classmethod
    def _parse(cls, data: Mapping[str, Any], source: str, prefix: str = "") -> Self:
        values: dict[str, Any] = {}
        typed = [f for f in fields(cls) if "kind" in f.metadata]
        for f in typed:
            kind: _Kind = f.metadata["kind"]
            path = prefix + f.name
            if f.name not in data:
                if f.default is MISSING:
                    raise ArtifactError(f"{source}: required field {path!r} is missing; expected {kind.expected}")
                continue
            value = data[f.name]
            if not kind.ok(value):
                shown = "null" if value is None else f"a JSON {type(value).__name__} ({_short(value)})"
                raise ArtifactError(f"{source}: field {path!r} is {shown}; expected {kind.expected}")
            values[f.name] = kind.convert(value, source, path)
        names = {f.name for f in typed}
        return cls(**values, extra={k: v for k, v in data.items() if k not in names})

    def to_dict(self) -> dict[str, Any]:
        out = {
            f.name: _plain(getattr(self, f.name))
            for f in fields(self)
            if "kind" in f.metadata and getattr(self, f.name) is not None
        }
        return {**out, **self.extra}


def _short(value: Any, limit: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "…"


@dataclass(frozen=True)
class SpearmanStats(_Record):
    """Spearman(q, Δ) over the sensitivity population's users; ``auto`` reads the median
    (docs/reference/specification.md §2)."""

    median: float = _required(_NUMBER)
    mean: float = _required(_NUMBER)
    frac_positive: float = _required(_NUMBER)
    users: int = _required(_INT)
    extra: Mapping[str, Any] = _extra()


@dataclass(frozen=True)
class SplitInfo(_Record):
    """User and interaction counts of the split, and its kind (strong or weak generalisation)."""

    items: int = _required(_INT)
    train_users: int = _required(_INT)
    train_interactions: int = _required(_INT)
    test_users: int = _required(_INT)
    test_input_interactions: int = _required(_INT)
    test_target_interactions: int = _required(_INT)
    kind: str = _required(_STR)
    target_fraction: float = _required(_NUMBER)
    validation_users: int | None = _optional(_INT)  # None: weak generalisation (no held-out users)
    validation_input_interactions: int | None = _optional(_INT)
    extra: Mapping[str, Any] = _extra()


@dataclass(frozen=True)
class SansaInfo(_Record):
    """The SANSA fit's parameters, how they were chosen and the grid's validation results."""

    l2: float = _required(_NUMBER)
    density: float = _required(_NUMBER)
    factorizer: str = _required(_STR)
    umr_scans: int = _required(_INT)
    umr_finetune_steps: int = _required(_INT)
    selected_on: str = _required(_STR)  # "fixed" or "validation <metric>"
    grid: tuple[Mapping[str, Any], ...] = _required(_OBJECTS)  # empty unless chosen on a grid
    extra: Mapping[str, Any] = _extra()


@dataclass(frozen=True)
class PolicyInfo(_Record):
    """How ``policy.parquet`` (the `auto` table, :mod:`recsvc.policy`) was computed."""

    epsilons: tuple[float, ...] = _required(_NUMBERS)
    ks: tuple[int, ...] = _required(_INTS)
    mechanisms: tuple[str, ...] = _required(_STRS)
    users: int = _required(_INT)  # population users averaged over
    trials: int = _required(_INT)  # Monte Carlo selections per user (mechanisms without an exact expectation)
    seed: int = _required(_INT)
    params: Mapping[str, float] = _required(_NUMBER_MAP)  # mechanism parameters given ({}: defaults)
    utility: str = _required(_STR)
    candidates: int | None = _optional(_INT)  # most candidates of a population user: the table's n
    extra: Mapping[str, Any] = _extra()


@dataclass(frozen=True)
class MultiSelectInfo(_Record):
    """Multi-selection's public embedding (``client/``) and the server's population sample
    (``multiselect/``): docs/reference/client-bundle.md."""

    embedding_version: str = _required(_STR)
    dim: int = _required(_INT)
    radius: float = _required(_NUMBER)
    radius_rule: str = _required(_STR)  # how R was chosen from the training users
    users: int = _required(_INT)  # training users sampled and aggregated into the population
    group: int = _required(_INT)  # least users per prototype
    prototypes: int = _required(_INT)  # the population's rows P, each the mean of ≥ group users
    top: int = _required(_INT)  # items kept per prototype (L)
    extra: Mapping[str, Any] = _extra()


@dataclass(frozen=True)
class Manifest(_Record):
    """``manifest.json``. Only ``format_version``, ``dataset`` and ``files`` are required: tests
    and benchmarks write artifacts with little else; the pipeline writes every field."""

    format_version: int = _required(_INT)
    dataset: str = _required(_STR)
    files: Mapping[str, str] = _required(_FILES)  # path relative to the artifact → sha256
    source: str | None = _optional(_STR)
    seed: int | None = _optional(_INT)
    split: SplitInfo | None = _optional(_section(SplitInfo))
    sansa: SansaInfo | None = _optional(_section(SansaInfo))
    accuracy: Mapping[str, float] | None = _optional(_NUMBER_MAP)  # metric → value on the test users
    accuracy_users: int | None = _optional(_INT)
    population_spearman: SpearmanStats | None = _optional(_section(SpearmanStats))
    percentiles: tuple[float, float] | None = _optional(_PAIR)
    sensitivity_population: str | None = _optional(_STR)  # "validation", "test" or "sample"
    sensitivity_population_users: int | None = _optional(_INT)
    items_without_population_scores: int | None = _optional(_INT)
    candidates_per_user: int | None = _optional(_INT)
    default_gamma: float | None = _optional(_NUMBER)  # rs γ the paper used on this data; eval's default
    versions: Mapping[str, str] | None = _optional(_STR_MAP)  # package → version
    timings_s: Mapping[str, float] | None = _optional(_NUMBER_MAP)  # pipeline step → seconds
    policy: PolicyInfo | None = _optional(_section(PolicyInfo))  # None: the artifact has no policy.parquet
    multiselect: MultiSelectInfo | None = _optional(_section(MultiSelectInfo))  # None: no client bundle
    kind: str | None = _optional(_STR)  # "serving" for a serving bundle; None for a full artifact
    extra: Mapping[str, Any] = _extra()  # engine, synthetic, … : recorded, read by no consumer

    @classmethod
    def from_dict(cls, data: Any, source: str = "manifest") -> Manifest:
        """The typed manifest of parsed JSON; ArtifactError (naming ``source``) if it is invalid."""
        if not isinstance(data, dict):
            raise ArtifactError(f"{source} holds a JSON {type(data).__name__}; expected an object")
        return cls._parse(data, source)
