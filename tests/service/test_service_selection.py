"""The proto-free selection layer (recsvc.service.selection) and the service's one set of defaults."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from recsvc.artifact import load_artifact
from recsvc.ledger.sqlite import SQLiteLedger
from recsvc.service import codec
from recsvc.service.config import PARAMS, Limits, SelectorConfig, ServerConfig
from recsvc.service.selection import InvalidRequest, Selector
from recsvc.service.testing import candidates, make_artifact


@pytest.fixture(scope="module")
def selector(tmp_path_factory: pytest.TempPathFactory) -> Selector:
    art = make_artifact(tmp_path_factory.mktemp("art") / "toy", rho_median=0.5)
    return Selector(load_artifact(art), SelectorConfig(limits=Limits(max_candidates=25)))


def _prepare(selector: Selector, cands, mechanism: str = "", request_id: str = "r1"):
    ids = [c[0] for c in cands]
    raw = np.array([c[1] for c in cands])
    return selector.prepare_select("u1", request_id, mechanism, 1.0, {"beta": None}, ids, raw, lambda: b"fp")


def test_selection_needs_no_grpc_and_clips_before_selecting(selector: Selector) -> None:
    # In a fresh interpreter, the selection layer imports without grpc or protobuf.
    code = "import sys, recsvc.service.selection; print(sorted(m for m in ('grpc', 'google.protobuf') if m in sys.modules))"
    assert (
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == "[]"
    )
    cands = candidates(20)
    p = _prepare(selector, [(i, s * 100) for i, s in cands])  # far above every item's hi
    rows = selector.catalog.rows(p.item_ids)
    assert np.array_equal(p.scores, selector.catalog.hi[rows])
    assert p.mechanism == "mgem"  # auto: population median 0.5 > 0.1
    assert p.fingerprint == b"fp"


def test_refusals_happen_before_the_fingerprint_and_the_ledger(selector: Selector) -> None:
    called: list[bool] = []

    def fingerprint() -> bytes:
        called.append(True)
        return b""

    with pytest.raises(InvalidRequest, match="26 candidates is too many; this server accepts at most 25"):
        selector.prepare_select("u1", "r", "rnm", 1.0, {}, [str(i) for i in range(26)], np.zeros(26), fingerprint)
    with pytest.raises(ValueError, match="beta must be in the open interval"):
        selector.prepare_select("u1", "r", "gem", 1.0, {"beta": 2.0}, ["a"], np.zeros(1), fingerprint)
    assert called == []


def test_execute_charges_once_and_a_retry_re_encodes_the_first_answer_byte_for_byte(
    selector: Selector, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ledger = SQLiteLedger(tmp_path / "l.db", budget=3.0)
    try:
        p = _prepare(selector, candidates(20), mechanism="rnm")
        draws: list[int] = []
        real = selector.heavy.draw

        def counted(*args: Any) -> Any:
            draws.append(1)
            return real(*args)

        monkeypatch.setattr(selector.heavy, "draw", counted)
        first = selector.execute(ledger, p)
        again = selector.execute(ledger, p)
        assert (first.replayed, again.replayed, draws) == (False, True, [1])  # the retry drew no sample
        assert again.answer == first.answer and first.answer.mechanism == "rnm"
        assert (first.answer.epsilon, first.answer.remaining) == (1.0, 2.0)
        sent, replayed = codec.select_response(first), codec.select_response(again)
        sent.replayed = True
        assert replayed.SerializeToString() == sent.SerializeToString()  # the first answer, marked
        assert list(replayed.item_ids) == [replayed.item_id] and ledger.user("u1").spent == 1.0
    finally:
        ledger.close()


def test_defaults_are_written_once_and_shared_by_cli_config_and_policy() -> None:
    from recsvc.app.cli import build_parser

    serve = build_parser().parse_args(["serve", "--artifacts", "x"])
    config = ServerConfig.of(Path("x"))
    # every grouped field is one `serve` flag with the same default, but reuse_port (the server sets it for its workers)
    assert set(PARAMS) - set(vars(serve)) == {"reuse_port"} and len(PARAMS) == 56
    for name in set(PARAMS) - {"reuse_port"}:
        assert getattr(serve, name) == config.get(name), name
    assert config.selector == SelectorConfig()
    changed = ServerConfig.of(Path("x"), max_candidates=7, auto_threshold=0.3)
    # the selector config holds the config's own groups: nothing is copied
    assert changed.selector.limits is changed.limits and changed.selector.selection is changed.selection
    assert (changed.selector.limits.max_candidates, changed.selector.selection.auto_threshold) == (7, 0.3)
    assert changed.get("max_batch") == 1000 and changed.replace(max_batch=3).limits.max_batch == 3


def test_an_unknown_parameter_is_refused_by_name() -> None:
    with pytest.raises(TypeError, match=r"unknown ServerConfig parameter\(s\) max_batches; expected some of host, "):
        ServerConfig.of(Path("x"), max_batches=3)


@pytest.fixture
def input_checks(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The name of every O(n) input check run from now on: every single-user check of scores and
    Δ (check_inputs, check_scores_sensitivities) reads them through ``_one_user``, and check_inputs
    sums them with ``_summary``."""
    from recsvc.mechanisms import validation

    seen: list[str] = []
    for name in ("_one_user", "_summary", "_summary_rows"):
        real = getattr(validation, name)

        def counted(*a: Any, _real: Any = real, _name: str = name) -> Any:
            seen.append(_name)
            return _real(*a)

        monkeypatch.setattr(validation, name, counted)
    return seen


def test_a_select_and_each_batch_item_are_checked_once_from_prepare_to_answer(
    selector: Selector, tmp_path: Path, input_checks: list[str]
) -> None:
    """prepare checks the scores once (the mechanisms' own check, into the Prepared's record; a
    batch's items of one mechanism in one pass); reserve, draw and commit check nothing again,
    for a one-item and a peeled slate alike."""
    from recsvc.service.batch import execute_batch
    from recsvc.service.requests import Columns, Prepared, Selected, SelectInput

    ledger = SQLiteLedger(tmp_path / "l.db", budget=10.0)
    try:
        for mechanism, k in (("rnm", 1), ("gem", 3), ("oneshot", 2)):
            input_checks.clear()
            ids, raw = [c[0] for c in candidates(20)], np.array([c[1] for c in candidates(20)])
            p = selector.prepare_select("u1", f"once-{mechanism}", mechanism, 1.0, {}, ids, raw, lambda: b"fp", k=k)
            assert input_checks == ["_one_user", "_summary"]  # prepare: once
            got = selector.execute(ledger, p)
            assert input_checks == ["_one_user", "_summary"] and len(got.answer.item_ids) == k  # the draw: never
        input_checks.clear()
        inputs = [
            SelectInput(f"b{i}", f"batch-{i}", "gem", 0.5, {}, lambda: b"fp", 2, [c[0] for c in candidates(10, seed=i)])
            for i in range(3)
        ]
        raws = [np.array([c[1] for c in candidates(10, seed=i)]) for i in range(3)]
        prepared = selector.prepare_many(inputs, Columns.of(raws, []))
        ready = [p for p in prepared if isinstance(p, Prepared)]
        answers = [a for a in execute_batch(selector, ledger, ready) if isinstance(a, Selected)]
        assert input_checks == ["_one_user", "_summary_rows"]  # the three items' rows at once, in prepare
        assert [len(a.answer.item_ids) for a in answers] == [2, 2, 2]
    finally:
        ledger.close()


def test_a_two_stage_recommend_is_checked_once_from_prepare_to_answer(tmp_path: Path, input_checks: list[str]) -> None:
    """The candidate stage and the selection among its m share one check of the catalog's scores
    (stage 2's data-dependent step checks run as a discarded step, not as a second input check)."""
    art = make_artifact(tmp_path / "toy", rho_median=0.5)
    selector = Selector(load_artifact(art), SelectorConfig(limits=Limits(min_candidates=5)))
    ledger = SQLiteLedger(tmp_path / "l.db", budget=10.0)
    try:
        input_checks.clear()
        p = selector.prepare_recommend(
            "u1", "rec", "gem", 1.0, {}, ["it1", "it4"], 8, lambda: b"fp", k=2, candidate_fraction=0.5
        )
        assert p.stage is not None and input_checks == ["_one_user", "_summary"]
        got = selector.execute(ledger, p)
        assert input_checks == ["_one_user", "_summary"] and len(got.answer.item_ids) == 2
    finally:
        ledger.close()


def test_the_catalog_screen_clips_as_np_clip_and_flags_each_request_alone(selector: Selector) -> None:
    """One compiled pass over three requests' candidates: np.clip's values and each item's Δ,
    and per request whether a score is not finite, a row is outside the catalog, or a row repeats
    (within that request only: another request, or a later call, may name the same row)."""
    from recsvc.service.catalog import BAD_ROW, DUPLICATE, NONFINITE

    cat = selector.catalog
    n = len(cat.item_ids)
    rng = np.random.default_rng(3)
    good = rng.choice(n, 6, replace=False)
    rows = np.concatenate([good, good[:3], [good[0], n, good[1], good[1]], [good[2], good[2]]])
    raw = rng.normal(0, 2, rows.size)
    raw[9] = np.nan
    lengths = np.array([6, 3, 4, 2])
    first = cat.screen(rows, raw, lengths)
    assert first.flags.tolist() == [0, 0, NONFINITE | BAD_ROW | DUPLICATE, DUPLICATE]
    ok = np.r_[0:9]
    assert first.scores[ok].tolist() == np.clip(raw[ok], cat.lo[rows[ok]], cat.hi[rows[ok]]).tolist()
    assert first.sensitivities[ok].tolist() == cat.sensitivity[rows[ok]].tolist()
    again = cat.screen(rows[:6], raw[:6], lengths[:1])  # the same rows in a later call: no repeat
    assert again.flags.tolist() == [0] and again.scores.tolist() == first.scores[:6].tolist()


def test_catalog_rows_maps_several_requests_ids_with_minus_one_for_an_unknown_one(selector: Selector) -> None:
    ids = selector.catalog.item_ids
    assert selector.catalog.rows([ids[3], ids[0]], [ids[7]]).tolist() == [3, 0, 7]
    assert selector.catalog.rows([ids[3], "no-such-item"], [ids[7]]).tolist() == [3, -1, 7]  # the slow path's answer
