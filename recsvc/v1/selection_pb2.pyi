from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Candidate(_message.Message):
    __slots__ = ("item_id", "score")
    ITEM_ID_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    item_id: str
    score: float
    def __init__(self, item_id: _Optional[str] = ..., score: _Optional[float] = ...) -> None: ...

class SelectRequest(_message.Message):
    __slots__ = ("user_id", "candidates", "mechanism", "epsilon", "request_id", "beta", "gamma", "corr_budget_fraction", "item_ids", "scores", "k", "item_rows", "catalog_version", "loss_weight")
    USER_ID_FIELD_NUMBER: _ClassVar[int]
    CANDIDATES_FIELD_NUMBER: _ClassVar[int]
    MECHANISM_FIELD_NUMBER: _ClassVar[int]
    EPSILON_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    BETA_FIELD_NUMBER: _ClassVar[int]
    GAMMA_FIELD_NUMBER: _ClassVar[int]
    CORR_BUDGET_FRACTION_FIELD_NUMBER: _ClassVar[int]
    ITEM_IDS_FIELD_NUMBER: _ClassVar[int]
    SCORES_FIELD_NUMBER: _ClassVar[int]
    K_FIELD_NUMBER: _ClassVar[int]
    ITEM_ROWS_FIELD_NUMBER: _ClassVar[int]
    CATALOG_VERSION_FIELD_NUMBER: _ClassVar[int]
    LOSS_WEIGHT_FIELD_NUMBER: _ClassVar[int]
    user_id: str
    candidates: _containers.RepeatedCompositeFieldContainer[Candidate]
    mechanism: str
    epsilon: float
    request_id: str
    beta: float
    gamma: float
    corr_budget_fraction: float
    item_ids: _containers.RepeatedScalarFieldContainer[str]
    scores: _containers.RepeatedScalarFieldContainer[float]
    k: int
    item_rows: _containers.RepeatedScalarFieldContainer[int]
    catalog_version: str
    loss_weight: float
    def __init__(self, user_id: _Optional[str] = ..., candidates: _Optional[_Iterable[_Union[Candidate, _Mapping]]] = ..., mechanism: _Optional[str] = ..., epsilon: _Optional[float] = ..., request_id: _Optional[str] = ..., beta: _Optional[float] = ..., gamma: _Optional[float] = ..., corr_budget_fraction: _Optional[float] = ..., item_ids: _Optional[_Iterable[str]] = ..., scores: _Optional[_Iterable[float]] = ..., k: _Optional[int] = ..., item_rows: _Optional[_Iterable[int]] = ..., catalog_version: _Optional[str] = ..., loss_weight: _Optional[float] = ...) -> None: ...

class SelectResponse(_message.Message):
    __slots__ = ("item_id", "mechanism", "epsilon_spent", "budget_remaining", "request_id", "replayed", "item_ids", "item_rows")
    ITEM_ID_FIELD_NUMBER: _ClassVar[int]
    MECHANISM_FIELD_NUMBER: _ClassVar[int]
    EPSILON_SPENT_FIELD_NUMBER: _ClassVar[int]
    BUDGET_REMAINING_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    REPLAYED_FIELD_NUMBER: _ClassVar[int]
    ITEM_IDS_FIELD_NUMBER: _ClassVar[int]
    ITEM_ROWS_FIELD_NUMBER: _ClassVar[int]
    item_id: str
    mechanism: str
    epsilon_spent: float
    budget_remaining: float
    request_id: str
    replayed: bool
    item_ids: _containers.RepeatedScalarFieldContainer[str]
    item_rows: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, item_id: _Optional[str] = ..., mechanism: _Optional[str] = ..., epsilon_spent: _Optional[float] = ..., budget_remaining: _Optional[float] = ..., request_id: _Optional[str] = ..., replayed: _Optional[bool] = ..., item_ids: _Optional[_Iterable[str]] = ..., item_rows: _Optional[_Iterable[int]] = ...) -> None: ...

class SelectBatchRequest(_message.Message):
    __slots__ = ("requests",)
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    requests: _containers.RepeatedCompositeFieldContainer[SelectRequest]
    def __init__(self, requests: _Optional[_Iterable[_Union[SelectRequest, _Mapping]]] = ...) -> None: ...

class Error(_message.Message):
    __slots__ = ("code", "code_name", "message")
    CODE_FIELD_NUMBER: _ClassVar[int]
    CODE_NAME_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    code: int
    code_name: str
    message: str
    def __init__(self, code: _Optional[int] = ..., code_name: _Optional[str] = ..., message: _Optional[str] = ...) -> None: ...

class SelectResult(_message.Message):
    __slots__ = ("response", "error")
    RESPONSE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    response: SelectResponse
    error: Error
    def __init__(self, response: _Optional[_Union[SelectResponse, _Mapping]] = ..., error: _Optional[_Union[Error, _Mapping]] = ...) -> None: ...

class SelectBatchResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[SelectResult]
    def __init__(self, results: _Optional[_Iterable[_Union[SelectResult, _Mapping]]] = ...) -> None: ...

class RecommendRequest(_message.Message):
    __slots__ = ("user_id", "history", "mechanism", "epsilon", "request_id", "beta", "gamma", "corr_budget_fraction", "num_candidates", "k", "candidate_fraction", "candidate_mechanism", "loss_weight")
    USER_ID_FIELD_NUMBER: _ClassVar[int]
    HISTORY_FIELD_NUMBER: _ClassVar[int]
    MECHANISM_FIELD_NUMBER: _ClassVar[int]
    EPSILON_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    BETA_FIELD_NUMBER: _ClassVar[int]
    GAMMA_FIELD_NUMBER: _ClassVar[int]
    CORR_BUDGET_FRACTION_FIELD_NUMBER: _ClassVar[int]
    NUM_CANDIDATES_FIELD_NUMBER: _ClassVar[int]
    K_FIELD_NUMBER: _ClassVar[int]
    CANDIDATE_FRACTION_FIELD_NUMBER: _ClassVar[int]
    CANDIDATE_MECHANISM_FIELD_NUMBER: _ClassVar[int]
    LOSS_WEIGHT_FIELD_NUMBER: _ClassVar[int]
    user_id: str
    history: _containers.RepeatedScalarFieldContainer[str]
    mechanism: str
    epsilon: float
    request_id: str
    beta: float
    gamma: float
    corr_budget_fraction: float
    num_candidates: int
    k: int
    candidate_fraction: float
    candidate_mechanism: str
    loss_weight: float
    def __init__(self, user_id: _Optional[str] = ..., history: _Optional[_Iterable[str]] = ..., mechanism: _Optional[str] = ..., epsilon: _Optional[float] = ..., request_id: _Optional[str] = ..., beta: _Optional[float] = ..., gamma: _Optional[float] = ..., corr_budget_fraction: _Optional[float] = ..., num_candidates: _Optional[int] = ..., k: _Optional[int] = ..., candidate_fraction: _Optional[float] = ..., candidate_mechanism: _Optional[str] = ..., loss_weight: _Optional[float] = ...) -> None: ...

class GetBudgetRequest(_message.Message):
    __slots__ = ("user_id",)
    USER_ID_FIELD_NUMBER: _ClassVar[int]
    user_id: str
    def __init__(self, user_id: _Optional[str] = ...) -> None: ...

class GetBudgetResponse(_message.Message):
    __slots__ = ("user_id", "budget", "spent", "remaining", "requests", "window_start_unix", "window_end_unix")
    USER_ID_FIELD_NUMBER: _ClassVar[int]
    BUDGET_FIELD_NUMBER: _ClassVar[int]
    SPENT_FIELD_NUMBER: _ClassVar[int]
    REMAINING_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    WINDOW_START_UNIX_FIELD_NUMBER: _ClassVar[int]
    WINDOW_END_UNIX_FIELD_NUMBER: _ClassVar[int]
    user_id: str
    budget: float
    spent: float
    remaining: float
    requests: int
    window_start_unix: int
    window_end_unix: int
    def __init__(self, user_id: _Optional[str] = ..., budget: _Optional[float] = ..., spent: _Optional[float] = ..., remaining: _Optional[float] = ..., requests: _Optional[int] = ..., window_start_unix: _Optional[int] = ..., window_end_unix: _Optional[int] = ...) -> None: ...

class ListMechanismsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class MechanismInfo(_message.Message):
    __slots__ = ("name", "private", "allowed")
    NAME_FIELD_NUMBER: _ClassVar[int]
    PRIVATE_FIELD_NUMBER: _ClassVar[int]
    ALLOWED_FIELD_NUMBER: _ClassVar[int]
    name: str
    private: bool
    allowed: bool
    def __init__(self, name: _Optional[str] = ..., private: _Optional[bool] = ..., allowed: _Optional[bool] = ...) -> None: ...

class AutoPolicyEntry(_message.Message):
    __slots__ = ("epsilon", "k", "mechanism", "expected_mse")
    EPSILON_FIELD_NUMBER: _ClassVar[int]
    K_FIELD_NUMBER: _ClassVar[int]
    MECHANISM_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_MSE_FIELD_NUMBER: _ClassVar[int]
    epsilon: float
    k: int
    mechanism: str
    expected_mse: float
    def __init__(self, epsilon: _Optional[float] = ..., k: _Optional[int] = ..., mechanism: _Optional[str] = ..., expected_mse: _Optional[float] = ...) -> None: ...

class ListMechanismsResponse(_message.Message):
    __slots__ = ("mechanisms", "default_mechanism", "auto_resolves_to", "auto_threshold", "population_spearman_median", "budget", "max_candidates", "max_slate", "min_candidates", "catalog_size", "auto_policy", "catalog_version", "default_candidate_mechanism", "embedding_version", "embedding_dim", "embedding_radius", "max_multiselect_k", "embedding_grid_step", "embedding_lattice_radius", "codebook_version", "code_size")
    MECHANISMS_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_MECHANISM_FIELD_NUMBER: _ClassVar[int]
    AUTO_RESOLVES_TO_FIELD_NUMBER: _ClassVar[int]
    AUTO_THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    POPULATION_SPEARMAN_MEDIAN_FIELD_NUMBER: _ClassVar[int]
    BUDGET_FIELD_NUMBER: _ClassVar[int]
    MAX_CANDIDATES_FIELD_NUMBER: _ClassVar[int]
    MAX_SLATE_FIELD_NUMBER: _ClassVar[int]
    MIN_CANDIDATES_FIELD_NUMBER: _ClassVar[int]
    CATALOG_SIZE_FIELD_NUMBER: _ClassVar[int]
    AUTO_POLICY_FIELD_NUMBER: _ClassVar[int]
    CATALOG_VERSION_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_CANDIDATE_MECHANISM_FIELD_NUMBER: _ClassVar[int]
    EMBEDDING_VERSION_FIELD_NUMBER: _ClassVar[int]
    EMBEDDING_DIM_FIELD_NUMBER: _ClassVar[int]
    EMBEDDING_RADIUS_FIELD_NUMBER: _ClassVar[int]
    MAX_MULTISELECT_K_FIELD_NUMBER: _ClassVar[int]
    EMBEDDING_GRID_STEP_FIELD_NUMBER: _ClassVar[int]
    EMBEDDING_LATTICE_RADIUS_FIELD_NUMBER: _ClassVar[int]
    CODEBOOK_VERSION_FIELD_NUMBER: _ClassVar[int]
    CODE_SIZE_FIELD_NUMBER: _ClassVar[int]
    mechanisms: _containers.RepeatedCompositeFieldContainer[MechanismInfo]
    default_mechanism: str
    auto_resolves_to: str
    auto_threshold: float
    population_spearman_median: float
    budget: float
    max_candidates: int
    max_slate: int
    min_candidates: int
    catalog_size: int
    auto_policy: _containers.RepeatedCompositeFieldContainer[AutoPolicyEntry]
    catalog_version: str
    default_candidate_mechanism: str
    embedding_version: str
    embedding_dim: int
    embedding_radius: float
    max_multiselect_k: int
    embedding_grid_step: float
    embedding_lattice_radius: int
    codebook_version: str
    code_size: int
    def __init__(self, mechanisms: _Optional[_Iterable[_Union[MechanismInfo, _Mapping]]] = ..., default_mechanism: _Optional[str] = ..., auto_resolves_to: _Optional[str] = ..., auto_threshold: _Optional[float] = ..., population_spearman_median: _Optional[float] = ..., budget: _Optional[float] = ..., max_candidates: _Optional[int] = ..., max_slate: _Optional[int] = ..., min_candidates: _Optional[int] = ..., catalog_size: _Optional[int] = ..., auto_policy: _Optional[_Iterable[_Union[AutoPolicyEntry, _Mapping]]] = ..., catalog_version: _Optional[str] = ..., default_candidate_mechanism: _Optional[str] = ..., embedding_version: _Optional[str] = ..., embedding_dim: _Optional[int] = ..., embedding_radius: _Optional[float] = ..., max_multiselect_k: _Optional[int] = ..., embedding_grid_step: _Optional[float] = ..., embedding_lattice_radius: _Optional[int] = ..., codebook_version: _Optional[str] = ..., code_size: _Optional[int] = ...) -> None: ...

class MultiSelectRequest(_message.Message):
    __slots__ = ("user_id", "request_id", "signal", "embedding_version", "k", "epsilon", "lattice_signal", "grid_step", "code", "codebook_version")
    USER_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    SIGNAL_FIELD_NUMBER: _ClassVar[int]
    EMBEDDING_VERSION_FIELD_NUMBER: _ClassVar[int]
    K_FIELD_NUMBER: _ClassVar[int]
    EPSILON_FIELD_NUMBER: _ClassVar[int]
    LATTICE_SIGNAL_FIELD_NUMBER: _ClassVar[int]
    GRID_STEP_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    CODEBOOK_VERSION_FIELD_NUMBER: _ClassVar[int]
    user_id: str
    request_id: str
    signal: _containers.RepeatedScalarFieldContainer[float]
    embedding_version: str
    k: int
    epsilon: float
    lattice_signal: _containers.RepeatedScalarFieldContainer[int]
    grid_step: float
    code: int
    codebook_version: str
    def __init__(self, user_id: _Optional[str] = ..., request_id: _Optional[str] = ..., signal: _Optional[_Iterable[float]] = ..., embedding_version: _Optional[str] = ..., k: _Optional[int] = ..., epsilon: _Optional[float] = ..., lattice_signal: _Optional[_Iterable[int]] = ..., grid_step: _Optional[float] = ..., code: _Optional[int] = ..., codebook_version: _Optional[str] = ...) -> None: ...

class MultiSelectResponse(_message.Message):
    __slots__ = ("item_ids", "epsilon_spent", "budget_remaining", "replayed", "charged", "request_id")
    ITEM_IDS_FIELD_NUMBER: _ClassVar[int]
    EPSILON_SPENT_FIELD_NUMBER: _ClassVar[int]
    BUDGET_REMAINING_FIELD_NUMBER: _ClassVar[int]
    REPLAYED_FIELD_NUMBER: _ClassVar[int]
    CHARGED_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    item_ids: _containers.RepeatedScalarFieldContainer[str]
    epsilon_spent: float
    budget_remaining: float
    replayed: bool
    charged: bool
    request_id: str
    def __init__(self, item_ids: _Optional[_Iterable[str]] = ..., epsilon_spent: _Optional[float] = ..., budget_remaining: _Optional[float] = ..., replayed: _Optional[bool] = ..., charged: _Optional[bool] = ..., request_id: _Optional[str] = ...) -> None: ...
