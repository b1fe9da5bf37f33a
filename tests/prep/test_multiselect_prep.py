"""Multi-selection's public files: prep's embedding (truncated SVD of the row-normalised TRAINING
matrix), its radius rule and population prototypes, and the client bundle's reader refusing a bad or
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
    mdav_groups,
    normalised_rows,
    population_prototypes,
    sample_rows,
    user_embeddings,
)
from data_prep.pipeline import PrepConfig, _load_and_split
from data_prep.testing import ratings_table, write_ml20m
from recsvc.app.cli import main
from recsvc.artifact import ArtifactError, load_artifact
from recsvc.checks import ParamError
from recsvc.model import top_k
from recsvc.multiselection import blind_codebook, choose_size, clip_l1, codebook_version, embed, embedding_version
from recsvc.service.testing import make_model


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


def test_mdav_groups_partition_the_rows_into_groups_of_m_to_2m_minus_1_near_rows():
    rng = np.random.default_rng(0)
    centres = rng.normal(scale=10, size=(6, 3))
    z = np.repeat(centres, 5, axis=0) + rng.normal(scale=0.01, size=(30, 3))  # six tight clusters of 5
    labels = mdav_groups(z, 5)
    sizes = np.bincount(labels)
    assert sizes.tolist() == [5] * 6
    for g in range(6):  # each group is one cluster: MDAV found them
        assert np.unique(np.arange(30)[labels == g] // 5).size == 1
    for n, m in ((7, 3), (23, 4), (3, 5), (40, 2)):
        sizes = np.bincount(mdav_groups(rng.normal(size=(n, 2)), m))
        assert sizes.sum() == n and sizes.size == max(n // m, 1) and sizes.max() <= max(2 * m - 1, n)
        assert sizes.min() >= min(m, n)
    np.testing.assert_array_equal(mdav_groups(z, 5), labels)  # reproducible


def test_population_prototypes_aggregate_at_least_m_users_each():
    x = _binary(60, 30, 0.2, seed=3)
    e = fit_embedding(x, 4, seed=0)
    emb = user_embeddings(x, e)
    model = make_model(30)
    p = population_prototypes(x, emb, 0.2, model, users=40, group=4, top=5, seed=1)
    np.testing.assert_array_equal(p.user_rows, sample_rows(60, 40, 1))
    sizes = np.bincount(p.labels)
    assert sizes.size == p.embeddings.shape[0] == p.top_index.shape[0] and sizes.min() >= 4
    assert (np.abs(p.embeddings).sum(1) <= 0.2 * (1 + 1e-12)).all()
    # Brute force for one prototype: its members' mean clipped embedding, and the top items of their
    # mean unseen scores with a seen item valued as the member's worst unseen item.
    g = 2
    members = p.user_rows[p.labels == g]
    np.testing.assert_allclose(p.embeddings[g], clip_l1(emb[members], 0.2).mean(0), atol=1e-12)
    rows = []
    for u in members:
        s = model.score_unseen(x[[u]])[0]
        rows.append(np.where(np.isfinite(s), s, s[np.isfinite(s)].min()))
    expected = top_k(np.mean(rows, axis=0)[None, :], 5)
    np.testing.assert_array_equal(p.top_index[g], expected.index[0])
    np.testing.assert_allclose(p.top_score[g], expected.score[0], rtol=1e-12)


def test_a_user_who_has_seen_every_item_is_not_sampled():
    x = _binary(10, 8, 0.3, seed=4).tolil()
    x[3, :] = 1.0  # user 3 has nothing unseen to offer the population
    x = x.tocsr()
    e = fit_embedding(x, 2, seed=0)
    p = population_prototypes(x, user_embeddings(x, e), 1.0, make_model(8), users=100, group=2, top=3, seed=0)
    assert p.user_rows.tolist() == [0, 1, 2, 4, 5, 6, 7, 8, 9]
    with pytest.raises(ParamError, match="multiselect_group 10 is more than the 9 training users"):
        population_prototypes(x, user_embeddings(x, e), 1.0, make_model(8), users=100, group=10, top=3, seed=0)


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
    n_train = split.train.shape[0]
    assert info is not None and (info.dim, info.users, info.group, info.top) == (32, min(5000, n_train), 5, 100)
    assert info.prototypes == n_train // 5 == art.multiselect_population.embeddings.shape[0]  # MDAV: ⌊S/m⌋ groups
    bundle = art.client_bundle
    assert bundle.version == info.embedding_version == embedding_version(bundle.embedding, bundle.radius)
    assert bundle.item_ids.tolist() == art.items["item_id"].to_list()
    # Recomputed from the same split: the training users alone give E and R.
    np.testing.assert_array_equal(bundle.embedding, fit_embedding(split.train, 32, 42))
    train_emb = user_embeddings(split.train, bundle.embedding)
    assert bundle.radius == choose_radius(train_emb)
    assert np.mean(np.abs(train_emb).sum(1) > bundle.radius) == pytest.approx(0.5, abs=0.01)
    pop = art.multiselect_population
    protos = population_prototypes(split.train, train_emb, bundle.radius, art.model, 5000, 5, 100, 42)
    np.testing.assert_array_equal(pop.embeddings, protos.embeddings)
    np.testing.assert_array_equal(pop.top_index, protos.top_index)
    assert np.bincount(protos.labels).min() >= 5  # no row of multiselect/ is one user's
    # The codebook: the greedy's first C for no signal, C chosen on the population at ε = 4.
    choice = choose_size(pop.warm())
    assert bundle.codebook.tolist() == blind_codebook(pop, choice.size).tolist()
    signal = json.loads((ml100k / "manifest.json").read_text())["multiselect"]["signal"]
    assert (signal["kind"], signal["code_size"], signal["chosen_at_epsilon"]) == ("code", choice.size, 4.0)
    assert signal["codebook_version"] == bundle.codebook_version == codebook_version(bundle.item_ids[bundle.codebook])
    assert max(signal["estimates"], key=lambda c: signal["estimates"][c]) == str(choice.size)


def test_an_old_or_altered_client_bundle_is_refused_naming_what_is_wrong(ml100k: Path, tmp_path: Path) -> None:
    from recsvc.artifact import read_client_bundle
    from recsvc.artifact.format import sha256_file

    copy = tmp_path / "client"
    shutil.copytree(ml100k / "client", copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    for version, what in ((1, "a float signal"), (2, "the lattice signal without the codebook")):
        (copy / "manifest.json").write_text(json.dumps({**manifest, "format_version": version}))
        with pytest.raises(ArtifactError, match=re.escape(f"format_version {version} ({what}) is not served")):
            read_client_bundle(copy)
    book = json.loads((copy / "codebook.json").read_text())
    (copy / "codebook.json").write_text(json.dumps(book[::-1], separators=(",", ":")))  # another order: another code
    files = {**manifest["files"], "codebook.json": sha256_file(copy / "codebook.json")}
    (copy / "manifest.json").write_text(json.dumps({**manifest, "files": files}))
    with pytest.raises(ArtifactError, match="does not hash to the manifest's codebook_version"):
        read_client_bundle(copy)
