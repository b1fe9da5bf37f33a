"""A small synchronous client for the PrivateSelection service.

    with Client("127.0.0.1:50051") as c:
        r = c.select("user-1", {"50": 0.9, "172": 0.4}, mechanism="auto", epsilon=0.5)
        print(r.item_id, r.mechanism, r.budget_remaining)
        r = c.select("user-1", {"50": 0.9, "172": 0.4, "181": 0.8}, epsilon=0.5, k=2)  # a slate
        print(list(r.item_ids))  # 2 distinct items in selection order; r.item_id == r.item_ids[0]

The compact encoding (docs/reference/grpc-api.md, "Candidates: three encodings") sends items.parquet rows instead
of ids, tied to the server's catalog version; :meth:`Client.item_rows` checks that version once:

    rows = c.item_rows(pl.read_parquet("artifacts/ml-100k/items.parquet")["item_id"].to_list())
    r = c.select("user-1", {"50": 0.9, "172": 0.4}, epsilon=0.5, rows=rows)

Multi-selection sends only a noisy embedding of the history and re-ranks the k answers locally
(docs/guides/multi-selection-devices.md):

    r = c.multiselect("user-1", ["50", "172"], epsilon=1.0, k=10, device="artifacts/ml-100k/client")
    print(r.item_id, r.item_ids)  # the device's own choice, and the server's k items

Every call carries a request_id (a fresh uuid4 unless you pass one). A call that fails with
UNAVAILABLE or DEADLINE_EXCEEDED is retried with the SAME request_id, which the server
answers from its ledger if it had already charged it: retries never spend twice.
"""

from __future__ import annotations

import math
import os
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
import numpy as np

from recsvc.checks import ParamError, check_epsilon, check_int
from recsvc.device import Device, SignalMemory
from recsvc.mechanisms import PARAM_NAMES
from recsvc.rng import thread_csprng
from recsvc.service.auth import channel_credentials
from recsvc.service.catalog import catalog_version
from recsvc.v1 import selection_pb2 as pb
from recsvc.v1 import selection_pb2_grpc as pb_grpc

RETRYABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
Candidates = Mapping[str, float] | Iterable[tuple[str, float]]


def _columns(cands: Candidates) -> dict[str, list]:
    """The columnar encoding (item_ids + scores): same meaning as `candidates`, cheaper to decode."""
    pairs = list(cands.items() if isinstance(cands, Mapping) else cands)
    return {"item_ids": [str(i) for i, _ in pairs], "scores": [float(s) for _, s in pairs]}


@dataclass(frozen=True)
class MultiSelection:
    """A multi-selection's outcome on the device: ``item_id`` is the device's own choice among the
    server's ``item_ids`` (the server never learns which); the rest is the server's answer."""

    item_id: str
    item_ids: list[str]
    epsilon_spent: float
    budget_remaining: float
    charged: bool
    replayed: bool
    request_id: str


class ItemRows:
    """The compact encoding for one catalog: item id → items.parquet row, and the catalog version
    (the same digest the server reports) that every row-encoded request names."""

    def __init__(self, item_ids: Sequence[str]) -> None:
        self.index = {item: row for row, item in enumerate(item_ids)}
        self.version = catalog_version(item_ids)

    def fields(self, cands: Candidates) -> dict[str, Any]:
        """SelectRequest fields: item_rows + scores + catalog_version (an unknown id is refused here)."""
        pairs = list(cands.items() if isinstance(cands, Mapping) else cands)
        try:
            rows = [self.index[str(i)] for i, _ in pairs]
        except KeyError as exc:
            raise ValueError(
                f"item_id {exc.args[0]!r} is not in this catalog ({len(self.index)} items); "
                "expected an item_id of the artifact's items.parquet"
            ) from None
        return {"item_rows": rows, "scores": [float(s) for _, s in pairs], "catalog_version": self.version}


def param_fields(message: Any, params: Mapping[str, float | None]) -> dict[str, Any]:
    """Mechanism parameters (``beta=0.1``; None: the mechanism's default, not sent) as keyword
    fields of ``message`` (e.g. ``pb.SelectRequest``): every registered parameter the message has
    an optional field for. The server checks the values; a value the message cannot carry is
    refused here rather than silently dropped. The values are floats, typed Any: the keys are
    ``message``'s fields, checked at run time, and a ``dict[str, float]`` splatted into the typed
    constructor would be matched against every field, string and repeated ones included."""
    fields = message.DESCRIPTOR.fields_by_name
    sendable = [name for name in PARAM_NAMES if name in fields]
    refused = [name for name, value in params.items() if value is not None and name not in sendable]
    if refused:
        raise ValueError(
            f"mechanism parameter(s) {', '.join(map(repr, refused))} cannot be sent: "
            f"{message.DESCRIPTOR.name} has fields only for {', '.join(sendable)}"
        )
    return {k: v for k, v in params.items() if v is not None}


class Client:
    def __init__(
        self,
        target: str,
        token: str | None = None,
        tls_ca: str | os.PathLike[str] | None = None,
        tls_cert: str | os.PathLike[str] | None = None,
        tls_key: str | os.PathLike[str] | None = None,
        timeout: float = 30.0,
        retries: int = 2,
        server_name: str | None = None,
    ) -> None:
        if not (isinstance(timeout, (int, float)) and math.isfinite(timeout) and timeout > 0):
            raise ParamError("{timeout} must be a finite number of seconds > 0, got {value}", value=repr(timeout))
        options: list[tuple[str, int | str]] = [
            ("grpc.max_receive_message_length", 64 << 20),
            ("grpc.max_send_message_length", 64 << 20),
        ]
        if server_name:
            options.append(("grpc.ssl_target_name_override", server_name))
        # Any TLS file means TLS: a lone --tls-key must be refused (by channel_credentials), never
        # silently dropped in favour of a plaintext channel.
        if tls_ca is not None or tls_cert is not None or tls_key is not None:
            self.channel = grpc.secure_channel(target, channel_credentials(tls_ca, tls_cert, tls_key), options)
        else:
            self.channel = grpc.insecure_channel(target, options)
        self.stub = pb_grpc.PrivateSelectionStub(self.channel)
        self.metadata = (("authorization", f"Bearer {token}"),) if token else ()
        self.timeout = timeout
        self.retries = retries
        self.devices: dict[str, Device] = {}  # client bundles by directory, loaded on first use
        self.signals = SignalMemory()  # a repeated multiselect request_id resends its signal

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.channel.close()

    def _call(self, method: Any, request: Any) -> Any:
        for attempt in range(self.retries + 1):
            try:
                return method(request, timeout=self.timeout, metadata=self.metadata)
            except grpc.RpcError as exc:
                if exc.code() not in RETRYABLE or attempt == self.retries:
                    raise
                time.sleep(0.2 * 2**attempt)
        raise AssertionError("unreachable")

    def select_request(
        self,
        user_id: str,
        candidates: Candidates,
        mechanism: str = "",
        epsilon: float = 1.0,
        request_id: str | None = None,
        k: int = 0,
        rows: ItemRows | None = None,
        **params: float | None,
    ) -> pb.SelectRequest:
        """A SelectRequest; ``params``: mechanism parameters (``beta=0.1``, see :func:`param_fields`);
        ``rows``: send the compact encoding (see :meth:`item_rows`) instead of item ids."""
        columns = _columns(candidates) if rows is None else rows.fields(candidates)
        return pb.SelectRequest(
            user_id=user_id,
            **columns,
            mechanism=mechanism,
            epsilon=epsilon,
            request_id=request_id or uuid.uuid4().hex,
            k=k,
            **param_fields(pb.SelectRequest, params),
        )

    def select(
        self,
        user_id: str,
        candidates: Candidates,
        mechanism: str = "",
        epsilon: float = 1.0,
        request_id: str | None = None,
        k: int = 0,
        rows: ItemRows | None = None,
        **params: float | None,
    ) -> pb.SelectResponse:
        """One private selection, or a slate of ``k`` distinct items (ε charged once in total);
        returns the SelectResponse (item_id, item_ids, mechanism, epsilon_spent, ...). ``params``:
        mechanism parameters, e.g. ``beta=0.1`` (None or absent: the mechanism's default)."""
        req = self.select_request(user_id, candidates, mechanism, epsilon, request_id, k=k, rows=rows, **params)
        return self._call(self.stub.Select, req)

    def select_batch(self, requests: Sequence[pb.SelectRequest]) -> list[pb.SelectResult]:
        """Per-item results (``.response`` or ``.error``), in request order."""
        return list(self._call(self.stub.SelectBatch, pb.SelectBatchRequest(requests=requests)).results)

    def recommend(
        self,
        user_id: str,
        history: Iterable[str],
        mechanism: str = "",
        epsilon: float = 1.0,
        request_id: str | None = None,
        num_candidates: int = 0,
        k: int = 0,
        candidate_fraction: float | None = None,
        candidate_mechanism: str = "",
        **params: float | None,
    ) -> pb.SelectResponse:
        """Server-side SANSA over the full catalog, then a private selection (or ``k``-item slate)
        among every item, seen ones included (drop them yourself: free post-processing). With
        ``candidate_fraction``, a private top-``num_candidates`` stage by ``candidate_mechanism``
        (oneshot, gumbel or clm; empty: the server's default) spends that share of ε first; ε is
        charged once in total. ``params`` as for :meth:`select` (``loss_weight``: clm's, in either
        stage)."""
        extra: dict[str, Any] = {} if candidate_fraction is None else {"candidate_fraction": candidate_fraction}
        req = pb.RecommendRequest(
            user_id=user_id,
            history=[str(h) for h in history],
            mechanism=mechanism,
            epsilon=epsilon,
            request_id=request_id or uuid.uuid4().hex,
            num_candidates=num_candidates,
            k=k,
            candidate_mechanism=candidate_mechanism,
            **param_fields(pb.RecommendRequest, params),
            **extra,
        )
        return self._call(self.stub.Recommend, req)

    def multiselect_request(
        self,
        user_id: str,
        history: Iterable[str],
        epsilon: float,
        k: int,
        device: Device,
        request_id: str | None = None,
        rng: np.random.Generator | None = None,
        signal: str = "code",
    ) -> pb.MultiSelectRequest:
        """The MultiSelectRequest the device sends: ``history``'s code by randomised response and
        the codebook version (``signal="code"``, the default), or its lattice signal (integers) and
        the grid step (``"lattice"``), nothing else derived from it; for a request_id this client
        sent before, the same signal (:class:`~recsvc.device.SignalMemory`). ``rng``: this thread's
        CSPRNG unless given."""
        eps = check_epsilon(epsilon, error=ParamError)
        k = check_int("k", k, 1)
        rid = request_id or uuid.uuid4().hex
        hist = [str(h) for h in history]
        sent = self.signals.signal(device, user_id, rid, hist, eps, k, thread_csprng() if rng is None else rng, signal)
        common: dict[str, Any] = dict(
            user_id=user_id, request_id=rid, embedding_version=device.version, k=k, epsilon=eps
        )
        if isinstance(sent, int):
            return pb.MultiSelectRequest(code=sent, codebook_version=device.codebook_version, **common)
        return pb.MultiSelectRequest(lattice_signal=sent.tolist(), grid_step=device.lattice.step, **common)

    def multiselect(
        self,
        user_id: str,
        history: Iterable[str],
        epsilon: float,
        k: int,
        device: Device | str | os.PathLike[str],
        request_id: str | None = None,
        rng: np.random.Generator | None = None,
        signal: str = "code",
    ) -> MultiSelection:
        """Multi-selection (docs/concepts/multi-selection.md): sends ``history``'s ε-local-DP signal,
        receives k items, and keeps the best by the true scores on this side. ``device``: a
        :class:`~recsvc.device.Device` or the client bundle's directory (loaded and checked once per
        client). ε is charged to ``user_id`` (empty: not charged). A retry (UNAVAILABLE,
        DEADLINE_EXCEEDED), or a repeated call with the same ``request_id``, resends the same signal,
        never a fresh one: the server replays its answer and spends nothing."""
        if not isinstance(device, Device):
            key = os.fspath(device)
            if key not in self.devices:
                self.devices[key] = Device.load(key)
            device = self.devices[key]
        hist = [str(h) for h in history]
        req = self.multiselect_request(user_id, hist, epsilon, k, device, request_id, rng, signal)
        resp = self._call(self.stub.MultiSelect, req)
        items = list(resp.item_ids)
        return MultiSelection(
            item_id=items[device.choose(hist, items)],
            item_ids=items,
            epsilon_spent=resp.epsilon_spent,
            budget_remaining=resp.budget_remaining,
            charged=resp.charged,
            replayed=resp.replayed,
            request_id=resp.request_id or req.request_id,
        )

    def budget(self, user_id: str) -> pb.GetBudgetResponse:
        return self._call(self.stub.GetBudget, pb.GetBudgetRequest(user_id=user_id))

    def mechanisms(self) -> pb.ListMechanismsResponse:
        return self._call(self.stub.ListMechanisms, pb.ListMechanismsRequest())

    def catalog_version(self) -> str:
        """The server's catalog version (what row-encoded requests must name)."""
        return self.mechanisms().catalog_version

    def item_rows(self, item_ids: Sequence[str]) -> ItemRows:
        """The compact encoding for the artifact whose item ids (items.parquet order) are given,
        checked against the server's catalog version: a different artifact is refused here, once."""
        rows = ItemRows(item_ids)
        served = self.catalog_version()
        if rows.version != served:
            raise ValueError(
                f"these {len(item_ids)} item ids have catalog version {rows.version!r} but the server's "
                f"is {served!r}; expected the items.parquet of the artifact the server serves"
            )
        return rows

    def health(self, service: str = "") -> str:
        """'SERVING', 'NOT_SERVING', ... (health is open: no token needed)."""
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        resp = health_pb2_grpc.HealthStub(self.channel).Check(
            health_pb2.HealthCheckRequest(service=service), timeout=self.timeout
        )
        return health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status)

    def wait_ready(self, timeout: float = 30.0) -> None:
        grpc.channel_ready_future(self.channel).result(timeout=timeout)
