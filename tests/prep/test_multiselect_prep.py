"""Multi-selection's public files: prep's embedding (truncated SVD of the row-normalised TRAINING
matrix), its radius rule and population sample, and the client bundle's reader refusing a bad or
tampered file by name."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

from data_prep import datasets
from data_prep.embedding import (
    choose_radius,
    fit_embedding,
    normalised_rows,
    population_sample,
    sample_rows,
    user_embeddings,
)
from data_prep.pipeline import PrepConfig, _load_and_split
from data_prep.testing import ratings_table, write_ml20m
from recsvc.app.cli import main
from recsvc.artifact import ArtifactError, load_artifact, read_client_bundle
from recsvc.checks import ParamError
from recsvc.model import top_k
from recsvc.multiselection import clip_l1, embed, embedding_version
from recsvc.service.testing import BUNDLE_DIM, BUNDLE_RADIUS, make_artifact, make_model


def _binary(users: int, items: int, density: float, seed: int) -> sp.csr_matrix:
    x = sp.random(users, items, density=density, random_state=seed, format="csr")
    x.data[:] = 1.0
    return x


def test_the_embedding_spans_the_top_singular_subspace_of_the_normalised_matrix():
    x = _binary(120, 40, 0.15, seed=1)
    e = fit_embedding(x, 6, seed=0)
    dense = x.toarray() / np.maximum(np.sqrt(x.toarray().sum(1, keepdims=True)), 1)
    np.testing.assert_allclose(normalised_rows(x).toarray(), dense, rtol=1e-12)
    _, s, vt = np.linalg.svd(dense)
    np.testing.assert_allclose(e.T @ e, np.eye(6), atol=1e-10)
    np.testing.assert_allclose(np.abs(np.sum(e * vt[:6].T, axis=0)), 1.0, atol=1e-8)  # same vectors up to sign
    assert (e[np.argmax(np.abs(e), axis=0), np.arange(6)] > 0).all()  # the sign rule
    np.testing.assert_array_equal(e, fit_embedding(x, 6, seed=0))  # reproducible bytes
    assert s[5] > s[6]  # a well-defined subspace on this instance


def test_user_embeddings_are_the_device_embedding_of_each_history():
    x = _binary(30, 25, 0.2, seed=2)
    e = fit_embedding(x, 4, seed=0)
    got = user_embeddings(x, e)
    for u in range(30):
        np.testing.assert_allclose(got[u], embed(x[u].indices, e), atol=1e-12)


def test_the_population_sample_is_seeded_clipped_and_holds_each_users_top_unseen_items():
    x = _binary(50, 30, 0.2, seed=3)
    e = fit_embedding(x, 4, seed=0)
    emb = user_embeddings(x, e)
    model = make_model(30)
    s = population_sample(x, emb, 0.2, model, users=20, top=5, seed=1, chunk=7)
    np.testing.assert_array_equal(s.user_rows, sample_rows(50, 20, 1))
    assert s.user_rows.size == 20 and not np.array_equal(s.user_rows, sample_rows(50, 20, 2))
    assert (np.abs(s.embeddings).sum(1) <= 0.2 * (1 + 1e-12)).all()
    expected = top_k(model.score_unseen(x[s.user_rows]), 5)
    np.testing.assert_array_equal(s.top_index, expected.index)
    assert not np.isin(s.top_index[0], x[s.user_rows[0]].indices).any()  # seen items never kept
    np.testing.assert_array_equal(population_sample(x, emb, 0.2, model, 100, 5, 1).user_rows, np.arange(50))


def test_a_user_who_has_seen_every_item_is_not_sampled():
    x = _binary(10, 8, 0.3, seed=4).tolil()
    x[3, :] = 1.0  # user 3 has nothing unseen to offer the population
    x = x.tocsr()
    e = fit_embedding(x, 2, seed=0)
    s = population_sample(x, user_embeddings(x, e), 1.0, make_model(8), users=100, top=3, seed=0)
    assert s.user_rows.tolist() == [0, 1, 2, 4, 5, 6, 7, 8, 9]


def test_the_writer_refuses_an_inconsistent_population_and_writes_nothing(tmp_path):
    from recsvc.artifact import ArtifactWriter

    with ArtifactWriter(tmp_path / "art") as w:
        with pytest.raises(ArtifactError, match="finite exactly where top_index is not padding"):
            w.write_multiselect_population(np.zeros((2, 3)), np.array([[0, -1], [1, 2]]), np.ones((2, 2)), 5)
        assert not (w.tmp / "multiselect").exists()
    assert not (tmp_path / "art").exists()


def test_the_radius_is_the_median_l1_norm_of_the_nonzero_training_embeddings():
    emb = np.array([[1.0, -1.0], [0.0, 0.0], [3.0, 0.0], [0.5, 0.0]])
    assert choose_radius(emb) == pytest.approx(2.0)
    with pytest.raises(ParamError, match="no training user"):
        choose_radius(np.zeros((3, 2)))


def test_too_large_an_embedding_dimension_is_refused_naming_it():
    with pytest.raises(ParamError, match=r"embedding_dim 25 must be below min\(training users, items\) = 25"):
        fit_embedding(_binary(30, 25, 0.2, seed=2), 25, seed=0)


def test_prep_refuses_an_explicit_dimension_the_data_cannot_hold_and_writes_nothing(tmp_path, prep_error_line):
    data = tmp_path / "data"
    write_ml20m(data, ratings_table(users=40, items=30, per_user=(8, 20)))
    out = tmp_path / "out" / "art"
    args = ["--data-dir", str(data), "--out", str(out), "--test-users", "5", "--val-users", "5", "--workers", "1"]
    assert main(["prep", "--dataset", "ml-20m", *args, "--embedding-dim", "500", "--policy-users", "5"]) == 2
    assert re.search(r"--embedding-dim 500 must be below min\(training users, items\)", prep_error_line())
    assert not out.exists()


def test_prep_writes_the_bundle_and_population_from_the_training_users(ml100k: Path):
    art = load_artifact(ml100k)
    info = art.manifest.multiselect
    split, _, _ = _load_and_split(PrepConfig(), datasets.INFO["ml-100k"])
    assert info is not None and (info.dim, info.users, info.top) == (32, min(1000, split.train.shape[0]), 100)
    bundle = art.client_bundle
    assert bundle.version == info.embedding_version == embedding_version(bundle.embedding, bundle.radius)
    assert bundle.item_ids.tolist() == art.items["item_id"].to_list()
    # Recomputed from the same split: the training users alone give E and R.
    np.testing.assert_array_equal(bundle.embedding, fit_embedding(split.train, 32, 42))
    train_emb = user_embeddings(split.train, bundle.embedding)
    assert bundle.radius == choose_radius(train_emb)
    assert np.mean(np.abs(train_emb).sum(1) > bundle.radius) == pytest.approx(0.5, abs=0.01)
    pop = art.multiselect_population
    sample = population_sample(split.train, train_emb, bundle.radius, art.model, 1000, 100, 42)
    np.testing.assert_array_equal(pop.embeddings, sample.embeddings)
    np.testing.assert_array_equal(pop.top_index, sample.top_index)
    # One population user's top items are its unseen items' best SANSA scores.
    u = int(sample.user_rows[7])
    scores = art.model.score_unseen(split.train[u])
    np.testing.assert_array_equal(pop.top_index[7], top_k(scores, 100).index[0])
    np.testing.assert_allclose(
        pop.embeddings[7], clip_l1(embed(split.train[u].indices, bundle.embedding), bundle.radius)
    )
    # The device's re-rank scores come from the bundle's W1/W2: the artifact's model exactly.
    np.testing.assert_array_equal(bundle.model.score_one(np.array([3, 9])), art.model.score_one(np.array([3, 9])))


@pytest.fixture(scope="module")
def bundled(tmp_path_factory) -> Path:
    return make_artifact(tmp_path_factory.mktemp("bundle") / "toy", bundle=True)


def _copy(bundled: Path, tmp_path: Path) -> Path:
    shutil.copytree(bundled / "client", tmp_path / "client")
    return tmp_path / "client"


def test_the_bundle_round_trips(bundled):
    art = load_artifact(bundled)
    b = read_client_bundle(bundled / "client")
    assert (b.dim, b.radius, b.embedding.shape) == (BUNDLE_DIM, BUNDLE_RADIUS, (40, BUNDLE_DIM))
    assert b.version == art.manifest.multiselect.embedding_version
    assert (b.w1 != art.model.w1).nnz == 0 and (b.w2 != art.model.w2).nnz == 0
    assert art.multiselect_population.size == 60


def _rehash(client: Path, name: str) -> None:
    """Re-records ``name``'s sha256 in the bundle's manifest: a tamper that also fixes the digests."""
    from recsvc.artifact import sha256_file

    m = json.loads((client / "manifest.json").read_text())
    m["files"][name] = sha256_file(client / name)
    (client / "manifest.json").write_text(json.dumps(m))


def _zero_tail(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:-8] + b"\0" * 8)


def _tamper(client: Path, how: str) -> None:
    """One way a bundle goes bad (``how``); the digest-fixing ones re-record the sha256 too."""
    if how == "bytes":
        _zero_tail(client / "embedding.npy")
    elif how == "bytes and digest":
        _zero_tail(client / "embedding.npy")
        _rehash(client, "embedding.npy")
    elif how == "dtype":
        np.save(client / "embedding.npy", np.zeros((40, 4), np.float32))
        _rehash(client, "embedding.npy")
    elif how == "missing file":
        (client / "w2_indices.npy").unlink()
    elif how == "bad csr":
        np.save(client / "w1_indptr.npy", np.zeros(41, np.int64))
        _rehash(client, "w1_indptr.npy")
    elif how == "item ids":
        (client / "item_ids.json").write_text('["a"]')
        _rehash(client, "item_ids.json")
    elif how == "manifest":
        (client / "manifest.json").write_text('{"format": "x"}')
    elif how == "no manifest":
        (client / "manifest.json").unlink()


@pytest.mark.parametrize(
    "how, message",
    [
        ("bytes", r"embedding\.npy is corrupt: its sha256"),
        ("bytes and digest", r"embedding\.npy: the embedding and radius do not hash"),
        ("dtype", r"embedding\.npy holds float32 of 2 dimensions; expected <f8"),
        ("missing file", r"w2_indices\.npy is missing"),
        ("bad csr", r"w1_indptr\.npy: indptr does not frame"),
        ("item ids", r"item_ids\.json: expected a JSON array of 40 distinct strings"),
        ("manifest", r"manifest\.json: field 'format_version'"),
        ("no manifest", r"manifest\.json is missing"),
    ],
)
def test_a_bad_or_tampered_bundle_is_refused_naming_the_file(bundled, tmp_path, how, message):
    client = _copy(bundled, tmp_path)
    _tamper(client, how)
    with pytest.raises(ArtifactError, match=message):
        read_client_bundle(client)


def test_the_artifact_refuses_a_bundle_of_another_embedding_or_an_unclipped_population(bundled, tmp_path):
    art = tmp_path / "art"
    shutil.copytree(bundled, art)
    np.save(art / "multiselect" / "embeddings.npy", np.full((60, BUNDLE_DIM), 1.0))
    with pytest.raises(ArtifactError, match="outside the L1 radius"):
        _ = load_artifact(art, verify=False).multiselect_population
    with pytest.raises(ArtifactError, match="no client bundle"):
        _ = load_artifact(make_artifact(tmp_path / "plain")).client_bundle
