"""Mechanism parameters declared once: the specs, validation, flags and the listing derived from
them, and a toy mechanism (tests/mechanisms/conftest.py) that is registered, evaluated and served
with its own parameter while nothing outside the test knows about it."""

import argparse
import json
import math

import numpy as np
import pytest

from recsvc.app.cli import main as recsvc_main
from recsvc.mechanisms import (
    MECHANISMS,
    PARAM_NAMES,
    PARAMS,
    AuditKind,
    Mechanism,
    MechanismInputError,
    MechanismParamError,
    ParamSpec,
    add_param_arguments,
    check_params,
    flag,
    param_specs,
    params_from_namespace,
    params_of,
    probabilities,
    register,
    registered,
    select,
    select_batch,
    takers,
    unregister,
)
from recsvc.mechanisms.testing import (
    audit,
    box_vertex_pairs,
    chisquare_pvalue,
    max_loss,
    paper_pairs,
    statistical_audit,
)
from recsvc.settings import Range

Q = np.array([0.3, 1.0, -0.5, 0.8, 0.1])
D = np.array([0.5, 2.0, 0.2, 1.0, 0.7])

DEFAULTS = {
    "rnm": {},
    "rnm_laplace": {},
    "em": {},
    "pf": {},
    "krr": {},
    "random": {},
    "rnmh": {},
    "rs": {"gamma": 0.008},
    "rs_improved": {"gamma": 0.008},
    "gem": {"beta": 0.05},
    "mgem": {"beta": 0.05},
    "combined_gem": {"beta": 0.05, "corr_budget_fraction": 0.6},
    "oneshot": {},
    "gumbel": {},
    "clm": {"loss_weight": 0.5},
}


def test_each_mechanism_declares_its_parameters_and_defaults():
    assert {n: {k: s.default for k, s in m.params.items()} for n, m in MECHANISMS.items()} == DEFAULTS
    assert list(PARAM_NAMES) == ["gamma", "beta", "corr_budget_fraction", "loss_weight"]  # order of first declaration
    bounds = {k: (s.low, s.high, s.low_inclusive, s.high_inclusive, s.floor, s.accepted) for k, s in PARAMS.items()}
    assert bounds == {
        "beta": (0.0, 1.0, False, False, None, "(0, 1)"),
        "gamma": (0.0, 1.0, False, False, 1e-6, "[1e-06, 1)"),
        "corr_budget_fraction": (0.0, 1.0, False, False, None, "(0, 1)"),
        "loss_weight": (0.0, 1.0, True, True, None, "[0, 1]"),
    }
    assert MECHANISMS["gem"].params["beta"] is MECHANISMS["combined_gem"].params["beta"] is PARAMS["beta"]
    gamma = PARAMS["gamma"]  # its ranges and its flag in the vocabulary of every setting (recsvc.settings)
    assert gamma.range == Range(0.0, 1.0, low_open=True, high_open=True, finite=False)
    assert gamma.accepted_range == Range(1e-6, 1.0, high_open=True, finite=False)
    assert gamma.setting.check == Range(1e-6, 1.0, high_open=True, finite=False, none=True)
    assert (gamma.setting.type, gamma.setting.unit, gamma.setting.help) == (float, "gamma", gamma.doc)
    assert all(s.doc and "\n" not in s.doc for s in PARAMS.values())
    assert dict(params_of("combined_gem")) == {
        "beta": PARAMS["beta"],
        "corr_budget_fraction": PARAMS["corr_budget_fraction"],
    }
    assert takers("beta") == ("gem", "mgem", "combined_gem") and takers("gamma") == ("rs", "rs_improved")
    with pytest.raises(MechanismInputError, match="unknown mechanism 'nope'"):
        params_of("nope")


OPEN_UNIT = r"the open interval \(0, 1\)"
REFUSED = [
    ("beta", 0.0, rf"beta must be in {OPEN_UNIT}, got 0\.0$"),
    ("beta", 1.0, rf"beta must be in {OPEN_UNIT}, got 1\.0$"),
    ("beta", float("nan"), rf"beta must be in {OPEN_UNIT}, got nan$"),
    ("beta", float("inf"), rf"beta must be in {OPEN_UNIT}, got inf$"),
    ("beta", "0.1", r"beta must be a real number in \(0, 1\), got '0\.1'$"),
    ("beta", True, r"beta must be a real number in \(0, 1\), got True$"),
    ("gamma", 1.5, rf"gamma must be in {OPEN_UNIT}, got 1\.5$"),
    ("gamma", -0.0, rf"gamma must be in {OPEN_UNIT}, got -0\.0$"),
    (
        "gamma",
        9.99e-7,
        r"gamma must be at least 1e-06 \(random stopping makes about 1/gamma draws per "
        r"selection\), got 9\.99e-07$",
    ),
    ("corr_budget_fraction", 1.0, rf"corr_budget_fraction must be in {OPEN_UNIT}, got 1\.0$"),
    ("corr_budget_fraction", -0.25, rf"corr_budget_fraction must be in {OPEN_UNIT}, got -0\.25$"),
]


@pytest.mark.parametrize("param,value,message", REFUSED)
def test_out_of_range_values_are_refused_by_the_spec_before_any_draw(param, value, message):
    with pytest.raises(MechanismParamError, match=message) as err:
        PARAMS[param].check(value)
    assert err.value.params == (param,)  # the CLI shows it as the flag
    assert err.value.render({param: flag(param)}).startswith(f"{flag(param)} must be")
    for name in MECHANISMS:  # the mechanism takes it or not: the same check, nothing drawn
        rng = np.random.default_rng(7)
        state = rng.bit_generator.state
        with pytest.raises(MechanismParamError, match=message):
            select(name, Q, D, 1.0, rng=rng, allow_non_private=True, **{param: value})
        assert rng.bit_generator.state == state


def test_the_accepted_ranges_are_todays():
    assert PARAMS["beta"].check(5e-324) == 5e-324 and PARAMS["beta"].check(np.float64(1 - 2**-53)) == 1 - 2**-53
    assert PARAMS["gamma"].check(1e-6) == 1e-6 and PARAMS["gamma"].check(0.999) == 0.999
    assert type(PARAMS["corr_budget_fraction"].check(np.float32(0.5))) is float


def test_a_known_parameter_is_checked_and_ignored_by_a_mechanism_that_does_not_take_it():
    a = select_batch("rnm", Q[None], D, 1.0, 20, 3, beta=0.3, gamma=0.5, corr_budget_fraction=0.1)
    np.testing.assert_array_equal(a, select_batch("rnm", Q[None], D, 1.0, 20, 3))
    np.testing.assert_array_equal(
        probabilities("combined_gem", Q, D, 1.0, gamma=0.5), probabilities("combined_gem", Q, D, 1.0)
    )
    assert not np.allclose(probabilities("gem", Q, D, 1.0, beta=0.5), probabilities("gem", Q, D, 1.0))


def test_a_name_no_mechanism_declares_is_refused():
    with pytest.raises(
        MechanismInputError,
        match=r"unknown mechanism parameter\(s\) alpha, delta; "
        r"expected only gamma, beta, corr_budget_fraction, loss_weight$",
    ):
        select("rnm", Q, D, 1.0, delta=0.1, alpha=0.5)


def test_check_params_returns_the_mechanisms_own_values_with_defaults():
    assert dict(check_params({}, MECHANISMS["combined_gem"])) == {"beta": 0.05, "corr_budget_fraction": 0.6}
    assert dict(check_params({"beta": None, "gamma": 0.5}, MECHANISMS["gem"])) == {"beta": 0.05}
    assert dict(check_params({"gamma": 0.25}, MECHANISMS["rs"])) == {"gamma": 0.25}
    assert dict(check_params({"beta": 0.2})) == {}  # checked only (the service's pre-ledger check)


def test_flags_are_derived_from_the_specs():
    parser = argparse.ArgumentParser()
    add_param_arguments(parser)
    args = parser.parse_args(["--beta", "0.1", "--corr-budget-fraction", "0.3"])
    assert params_from_namespace(args) == {"gamma": None, "beta": 0.1, "corr_budget_fraction": 0.3, "loss_weight": None}
    helps = {a.dest: a.help for a in parser._actions}
    assert helps["beta"] == f"{PARAMS['beta'].doc}; taken by gem, mgem, combined_gem (default 0.05, in (0, 1))"
    assert helps["gamma"].endswith("; taken by rs, rs_improved (default 0.008, in [1e-06, 1))")
    assert "--gamma GAMMA" in parser.format_help()
    only = argparse.ArgumentParser()
    add_param_arguments(only, ["gamma"])
    assert params_from_namespace(only.parse_args([])) == {"gamma": None}
    assert flag("corr_budget_fraction") == "--corr-budget-fraction"
    elsewhere = argparse.ArgumentParser()  # a command that supplies another default (eval: γ from the data)
    add_param_arguments(elsewhere, ["gamma"], defaults={"gamma": "the data's"})
    assert elsewhere._actions[-1].help.endswith("; taken by rs, rs_improved (default the data's, in [1e-06, 1))")


def test_the_listing_shows_each_mechanisms_parameters(capsys):
    assert recsvc_main(["mechanisms"]) == 0
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()}
    assert "beta=0.05 in (0, 1), corr_budget_fraction=0.6 in (0, 1)" in lines["combined_gem"]
    assert "gamma=0.008 in [1e-06, 1)" in lines["rs_improved"] and " - " in lines["rnm"]
    assert lines["name"].split()[:5] == ["name", "privacy", "exact", "parameters", "description"]
    assert recsvc_main(["mechanisms", "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["rnm"]["params"] == {}
    assert rows["rs"]["params"]["gamma"] == {
        "name": "gamma",
        "default": 0.008,
        "low": 0.0,
        "high": 1.0,
        "doc": PARAMS["gamma"].doc,
        "low_inclusive": False,
        "high_inclusive": False,
        "floor": 1e-6,
        "floor_reason": PARAMS["gamma"].floor_reason,
        "accepted": "[1e-06, 1)",
    }
    assert list(rows["combined_gem"]["params"]) == ["beta", "corr_budget_fraction"]


def test_the_registry_is_read_only_and_registration_is_checked() -> None:
    with pytest.raises(TypeError):
        MECHANISMS["x"] = MECHANISMS["rnm"]  # type: ignore[index]  # the point: it is read-only
    with pytest.raises(ValueError, match="already registered"):
        register(MECHANISMS["rnm"])
    with pytest.raises(ValueError, match="built in"):
        unregister("rnm")
    other_beta = ParamSpec("beta", 0.1, 0.0, 1.0, "another β")
    with pytest.raises(ValueError, match="'beta' differs from the spec declared by gem, mgem, combined_gem"):
        register(
            Mechanism(
                "gem2",
                "gem with another β",
                MECHANISMS["gem"].sample,
                MECHANISMS["gem"].log_probabilities_fn,
                params=param_specs(other_beta),
                privacy=MECHANISMS["gem"].privacy,
            )
        )
    with pytest.raises(ValueError, match="argument of select"):
        register(
            Mechanism(
                "seeded",
                "x",
                MECHANISMS["rnm"].sample,
                MECHANISMS["rnm"].log_probabilities_fn,
                params=param_specs(ParamSpec("seed", 1, 0, 2, "x")),
                privacy=MECHANISMS["rnm"].privacy,
            )
        )
    with pytest.raises(TypeError, match="privacy"):  # no mechanism without a privacy declaration
        Mechanism("undeclared", "x", MECHANISMS["rnm"].sample)  # type: ignore[call-arg]  # the point: it is required
    with pytest.raises(ValueError, match="an exact audit needs log_probabilities_fn"):
        Mechanism("unprovable", "x", MECHANISMS["rnm"].sample, privacy=MECHANISMS["rnm"].privacy)
    with pytest.raises(ValueError, match=r"its audit sets \['beta'\], which it does not take"):
        Mechanism(
            "rnm2",
            "x",
            MECHANISMS["rnm"].sample,
            MECHANISMS["rnm"].log_probabilities_fn,
            privacy=MECHANISMS["gem"].privacy,
        )
    with pytest.raises(ValueError, match="default"):
        ParamSpec("x", 1.0, 0.0, 1.0, "a default outside its range")
    assert (
        "gem2" not in MECHANISMS
        and "seeded" not in MECHANISMS
        and list(PARAM_NAMES) == ["gamma", "beta", "corr_budget_fraction", "loss_weight"]
    )


# --- a toy mechanism (conftest's tempered_em), registered by each test that uses it -------------


def test_toy_parameters_are_validated_before_any_draw(toy):
    assert dict(params_of("tempered_em")) == {"alpha": toy.params["alpha"]} and takers("alpha") == ("tempered_em",)
    for bad, message in (
        (0.0, r"alpha must be in the interval \(0, 1\], got 0\.0$"),
        (1.5, r"alpha must be in the interval \(0, 1\], got 1\.5$"),
        ("x", r"alpha must be a real number in \(0, 1\], got 'x'$"),
    ):
        for name in ("tempered_em", "rnm"):  # refused by the toy and by a mechanism that ignores it
            rng = np.random.default_rng(1)
            state = rng.bit_generator.state
            with pytest.raises(MechanismParamError, match=message):
                select(name, Q, D, 1.0, rng=rng, alpha=bad)
            assert rng.bit_generator.state == state
    assert select("tempered_em", Q, D, 1.0, rng=np.random.default_rng(1), alpha=1.0) in range(5)
    np.testing.assert_array_equal(
        select_batch("rnm", Q[None], D, 1.0, 9, 2, alpha=0.3), select_batch("rnm", Q[None], D, 1.0, 9, 2)
    )


def test_toy_parameter_leaves_with_the_toy(make_toy):
    with registered(make_toy("tempered_em")):
        assert list(PARAM_NAMES) == ["gamma", "beta", "corr_budget_fraction", "loss_weight", "alpha"]
    with pytest.raises(MechanismInputError, match="unknown mechanism parameter"):
        select("rnm", Q, D, 1.0, alpha=0.5)


def test_toy_probabilities_are_exact_and_sampling_matches(toy):
    q, d = np.array([0.0, 1.0, 2.0]), np.array([1.0, 1.0, 2.0])
    w = np.exp([0.0, 0.25, 0.5])  # α ε / 2Δmax = 0.5 · 2 / 4
    np.testing.assert_allclose(probabilities("tempered_em", q, d, 2.0), w / w.sum(), rtol=1e-12)
    w1 = np.exp([0.0, 0.5, 1.0])
    np.testing.assert_allclose(probabilities("tempered_em", q, d, 2.0, alpha=1.0), w1 / w1.sum(), rtol=1e-12)
    draws = select_batch("tempered_em", q[None], d, 2.0, 20_000, 5, alpha=1.0)[0]
    assert chisquare_pvalue(np.bincount(draws, minlength=3), w1 / w1.sum()) > 1e-3


def test_toy_is_listed_with_its_parameter(toy, capsys):
    assert recsvc_main(["mechanisms", "--json"]) == 0
    row = json.loads(capsys.readouterr().out)[-1]
    assert (row["name"], row["privacy"], row["exact"]) == ("tempered_em", "ε-DP", True)
    assert row["params"]["alpha"]["default"] == 0.5 and row["params"]["alpha"]["accepted"] == "(0, 1]"
    parser = argparse.ArgumentParser()
    add_param_arguments(parser)
    assert params_from_namespace(parser.parse_args(["--alpha", "0.75"]))["alpha"] == 0.75


@pytest.mark.parametrize("epsilon", [0.5, 2.0])
def test_toy_loss_is_alpha_epsilon_on_the_box_vertices(toy, epsilon):
    pairs = box_vertex_pairs()
    for alpha in (0.25, 1.0):
        worst = max_loss("tempered_em", pairs, epsilon, alpha=alpha)
        assert worst <= alpha * epsilon + 1e-9  # αε-DP, hence ε-DP
        assert worst > 0.4 * alpha * epsilon  # the audit reaches near-worst cases
    assert math.isfinite(max_loss("tempered_em", pairs, epsilon))


@pytest.mark.parametrize("epsilon", [0.5, 2.0])
def test_toy_is_audited_as_it_declares(toy, epsilon):
    """The audit every built-in mechanism gets (recsvc.mechanisms.testing.audit), driven by the
    toy's own declaration: exact, at its default α = 1/2 and at α = 1, reaching 40 % of ε."""
    result = audit("tempered_em", epsilon)
    assert (result.kind, result.bound, result.passed, result.reached) == (AuditKind.EXACT, epsilon, True, True)
    assert result.loss == pytest.approx(max_loss("tempered_em", box_vertex_pairs(), epsilon, alpha=1.0), rel=1e-12)


def test_toy_passes_the_statistical_privacy_audit(toy):
    assert statistical_audit("tempered_em", list(paper_pairs())[:3], 1.0, 300, alpha=1.0) <= 1.0


# --- the toy is evaluable and servable: nothing but this module knows about it -------------------


def _toy_scenario_1_mse(alpha: float, epsilon: float) -> float:
    """Scenario 1 (n = 20): ten candidates score 1 (Δ 1.8), ten −1 (Δ 1). The toy picks a −1 with
    probability 1 / (1 + e^{2u}), u = αε / (2 · 1.8), and then misses the best by 2."""
    return 4.0 / (1.0 + math.exp(2.0 * alpha * epsilon / 3.6))


def test_toy_is_evaluable_with_its_parameter_from_the_command_line(toy, tmp_path, capsys):
    import polars as pl

    out = tmp_path / "r"
    argv = [
        "eval-synthetic",
        "--scenario",
        "1",
        "--n",
        "20",
        "--mechanisms",
        "rnm",
        "tempered_em",
        "--epsilons",
        "0.5",
        "2",
        "--alpha",
        "0.25",
        "--exact",
        "--workers",
        "1",
        "--out",
        str(out),
    ]
    assert recsvc_main(argv) == 0, capsys.readouterr().err
    rows = {(r["mechanism"], r["epsilon"]): r for r in pl.read_csv(out / "mse.csv").iter_rows(named=True)}
    for eps, expected in ((0.5, 1.930583), (2.0, 1.723995)):
        row = rows[("tempered_em", eps)]
        assert row["method"] == "exact" and row["users"] == 1
        assert row["mse_mean"] == pytest.approx(_toy_scenario_1_mse(0.25, eps), rel=1e-12)
        assert row["mse_mean"] == pytest.approx(expected, abs=1e-6)
    # α was passed through: at the default α = 0.5 the MSE at ε = 2 would be 1.458306.
    assert _toy_scenario_1_mse(0.5, 2.0) == pytest.approx(1.458306, abs=1e-6)
    report = (out / "report.md").read_text(encoding="utf-8")
    assert "β=0.05, γ=0.05, alpha=0.25" in report and "| tempered_em (exact) |" in report  # γ: the scenario's
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    assert summary["config"]["params"] == {
        "gamma": 0.05,
        "beta": 0.05,
        "corr_budget_fraction": 0.6,
        "alpha": 0.25,
    }  # the parameters of the default set and of the named mechanisms; not clm's loss_weight
    assert summary["mechanisms"] == ["rnm", "tempered_em"]


def test_toy_is_run_by_default_and_its_parameter_is_checked_by_eval(toy, tmp_path, capsys):
    from eval.evaluation.config import EvalConfig, validate

    assert "tempered_em" in validate(EvalConfig(scenario="1"))  # a private mechanism: in the default set
    out = tmp_path / "r"
    assert recsvc_main(["eval-synthetic", "--scenario", "1", "--alpha", "1.5", "--out", str(out)]) == 2
    assert capsys.readouterr().err.strip() == (
        "recsvc eval-synthetic: error: --alpha must be in the interval (0, 1], got 1.5"
    )
    assert not out.exists()


def test_eval_refuses_the_toy_parameter_once_the_toy_is_gone():
    from eval.evaluation.config import EvalConfig, validate

    with pytest.raises(
        MechanismInputError,
        match=r"unknown mechanism parameter\(s\) alpha; "
        r"expected only gamma, beta, corr_budget_fraction, loss_weight$",
    ):
        validate(EvalConfig(scenario="1", params={"alpha": 0.5}))


def test_toy_is_servable_through_grpc_and_charges_the_ledger(toy, artifact, tmp_path, capsys):
    from recsvc.service.client import Client
    from recsvc.service.config import ServerConfig
    from recsvc.service.server import start
    from recsvc.service.testing import candidates

    handle = start(ServerConfig.of(artifacts=artifact, port=0, ledger=tmp_path / "l.db", budget=2.0))
    try:
        target = f"127.0.0.1:{handle.port}"
        cands = candidates(10)
        with Client(target, retries=0) as c:
            listed = {m.name: m for m in c.mechanisms().mechanisms}
            assert listed["tempered_em"].private and listed["tempered_em"].allowed
            r = c.select("toy-user", cands, mechanism="tempered_em", epsilon=0.5, request_id="t1")
            assert (r.mechanism, r.epsilon_spent, r.replayed) == ("tempered_em", 0.5, False)
            assert r.item_id in dict(cands) and r.budget_remaining == pytest.approx(1.5)
            again = c.select("toy-user", cands, mechanism="tempered_em", epsilon=0.5, request_id="t1")
            assert (again.item_id, again.replayed) == (r.item_id, True)  # a retry: the stored answer
            # The proto has no field for α: the client refuses to drop it silently, nothing is sent.
            with pytest.raises(
                ValueError,
                match=r"'alpha' cannot be sent: SelectRequest has fields only for "
                r"gamma, beta, corr_budget_fraction, loss_weight$",
            ):
                c.select("toy-user", cands, mechanism="tempered_em", epsilon=0.5, alpha=0.3)
        assert handle.ledger.user("toy-user").spent == pytest.approx(0.5)
        assert handle.ledger.user("toy-user").requests == 1
        # ... and through `recsvc select`.
        argv = [
            "select",
            "--target",
            target,
            "--user",
            "toy-cli",
            "--mechanism",
            "tempered_em",
            "--epsilon",
            "0.25",
            *[a for i, s in cands for a in ("--candidate", f"{i}:{s}")],
        ]
        assert recsvc_main(argv) == 0
        answer = json.loads(capsys.readouterr().out)
        assert answer["mechanism"] == "tempered_em" and answer["epsilon_spent"] == 0.25
        assert handle.ledger.user("toy-cli").spent == pytest.approx(0.25)
        assert recsvc_main([*argv, "--alpha", "0.3"]) == 2  # its flag exists, but the request cannot carry it
        assert "'alpha' cannot be sent: SelectRequest has fields only for" in capsys.readouterr().err
        assert handle.ledger.user("toy-cli").spent == pytest.approx(0.25)
    finally:
        handle.stop(grace=1)


def test_the_servers_toy_draws_follow_its_distribution(toy, artifact, tmp_path):
    """The served answer is the toy's sample: 600 selections through gRPC, χ² against its exact
    probabilities on the clipped scores (the raw ones lie outside [lo, hi])."""
    from recsvc.artifact import load_artifact
    from recsvc.service.client import Client
    from recsvc.service.config import ServerConfig
    from recsvc.service.server import start

    items = load_artifact(artifact).items
    ids = ["it3", "it7", "it11", "it20"]
    rows = [items["item_id"].to_list().index(i) for i in ids]
    lo, hi, sens = (items[c].to_numpy()[rows] for c in ("lo", "hi", "sensitivity"))
    raw = np.array([hi[0] + 5.0, lo[1] - 5.0, 0.5 * (lo[2] + hi[2]), hi[3]])
    expected = probabilities("tempered_em", np.clip(raw, lo, hi), sens, 6.0)
    assert expected.max() / expected.min() > 1.5  # far from uniform: the test can tell
    handle = start(ServerConfig.of(artifacts=artifact, port=0, ledger=tmp_path / "l.db"))
    try:
        with Client(f"127.0.0.1:{handle.port}", retries=0) as c:
            reqs = [
                c.select_request(f"toy-{t}", list(zip(ids, raw, strict=False)), mechanism="tempered_em", epsilon=6.0)
                for t in range(600)
            ]
            results = c.select_batch(reqs[:300]) + c.select_batch(reqs[300:])
    finally:
        handle.stop(grace=1)
    assert all(r.WhichOneof("outcome") == "response" and r.response.mechanism == "tempered_em" for r in results)
    counts = np.bincount([ids.index(r.response.item_id) for r in results], minlength=len(ids))
    assert chisquare_pvalue(counts, expected) > 1e-4
