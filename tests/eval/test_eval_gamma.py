"""Random stopping's γ as in the paper: 0.05 on synthetic scenarios, each dataset's own γ (recorded
in its artifact manifest: 0.008 MovieLens / Amazon-book, 0.0008 Netflix) unless --gamma is given."""

import json

import pytest

from data_prep.datasets import INFO
from eval.evaluation.config import EvalConfig
from eval.evaluation.run import run
from eval.testing import make_artifact
from recsvc.app.cli import main as recsvc_main
from recsvc.artifact import ArtifactError, Manifest

QUICK = dict(mechanisms=("rnm", "rs"), epsilons=(1.0,), trials=3, progress=False, workers=1)


def test_each_dataset_records_the_papers_gamma():
    assert {name: info.gamma for name, info in INFO.items()} == {
        "ml-100k": 0.008,
        "ml-20m": 0.008,
        "netflix": 0.0008,
        "amazon-book": 0.008,
        "synthetic": 0.05,
    }


def test_eval_uses_the_datas_gamma_unless_given(tmp_path):
    assert run(EvalConfig(scenario="4", users=2, **QUICK)).config.params["gamma"] == 0.05
    assert run(EvalConfig(scenario="sweep", users=2, level=0.3, **QUICK)).config.params["gamma"] == 0.05
    netflix = make_artifact(tmp_path / "nf", users=3, manifest={"default_gamma": 0.0008})
    old = make_artifact(tmp_path / "old", users=3)  # built before the field existed
    res = run(EvalConfig(artifacts=netflix, out=tmp_path / "r", **QUICK))
    assert res.config.params["gamma"] == 0.0008 and "γ=0.0008" in (res.out / "report.md").read_text()
    assert json.loads((res.out / "summary.json").read_text())["config"]["params"]["gamma"] == 0.0008
    assert run(EvalConfig(artifacts=old, **QUICK)).config.params["gamma"] == 0.008  # the mechanism's default
    assert run(EvalConfig(artifacts=netflix, params={"gamma": 0.2}, **QUICK)).config.params["gamma"] == 0.2
    assert run(EvalConfig(scenario="4", users=2, params={"gamma": 0.2}, **QUICK)).config.params["gamma"] == 0.2


def test_cli_gamma_flag_overrides_the_manifest(tmp_path):
    art = make_artifact(tmp_path / "nf", users=3, manifest={"default_gamma": 0.0008})
    for extra, gamma in (([], 0.0008), (["--gamma", "0.3"], 0.3)):
        out = tmp_path / f"r{gamma}"
        assert (
            recsvc_main(
                [
                    "eval",
                    "--artifacts",
                    str(art),
                    "--out",
                    str(out),
                    "--mechanisms",
                    "rs",
                    "--epsilons",
                    "1",
                    "--trials",
                    "2",
                    "--workers",
                    "1",
                    *extra,
                ]
            )
            == 0
        )
        assert json.loads((out / "summary.json").read_text())["config"]["params"]["gamma"] == gamma


def test_manifest_default_gamma_is_optional_and_typed():
    base = {"format_version": 1, "dataset": "x", "files": {"items.parquet": "0" * 64}}
    assert Manifest.from_dict(base).default_gamma is None
    m = Manifest.from_dict({**base, "default_gamma": 0.0008})
    assert m.default_gamma == 0.0008 and m.to_dict() == {**base, "default_gamma": 0.0008}
    with pytest.raises(ArtifactError, match=r"field 'default_gamma' is a JSON str.*expected a number"):
        Manifest.from_dict({**base, "default_gamma": "0.05"})
