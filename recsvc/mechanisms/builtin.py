"""The built-in mechanisms: one registry entry each, with its privacy declaration
(docs/concepts/privacy-proofs.md has the section each ``proof`` links to)."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from recsvc.mechanisms import clm, gem, gem_combined, gem_peel, noisy_max, random_stopping, randomized_response, topk
from recsvc.mechanisms.mechanism import FLOAT_EXACT, Mechanism
from recsvc.mechanisms.params import param_specs
from recsvc.mechanisms.privacy import (
    PROOFS,
    Audit,
    AuditKind,
    DistanceMap,
    Neighbouring,
    Privacy,
    PrivacyMap,
    Split,
    any_change,
    not_private,
    pure,
    scaled,
    split_step,
    unbounded,
)


def _declared(
    name: str,
    neighbouring: Neighbouring,
    audit: Audit,
    privacy_map: PrivacyMap = pure,
    split: Callable[[Mapping[str, float]], Split] | None = None,
    *,
    distance_map: DistanceMap,
) -> Privacy:
    """A built-in mechanism's declaration; its proof is the section named after it."""
    return Privacy(privacy_map, neighbouring, audit, f"{PROOFS}#{name}", split, distance_map)


# The privacy maps d_in → d_out (docs/concepts/privacy-proofs.md#privacy-maps). A peeled slate is
# k runs at ε/k; a one-shot slate one run at ε. ``tight``: the exact law attains the bound.
_SCALED_TIGHT = DistanceMap(scaled, tight=True, text="d_in·ε")
_SCALED = DistanceMap(scaled, text="d_in·ε")
_SCALED_SLATE_TIGHT = DistanceMap(scaled, one_shot=True, tight=True, text="d_in·ε for the whole k-slate")
_SCALED_SLATE = DistanceMap(scaled, one_shot=True, text="d_in·ε for the whole k-slate")
_ANY_CHANGE_TIGHT = DistanceMap(any_change, tight=True, text="ε if d_in > 0 (any two inputs), else 0")
_ANY_CHANGE = DistanceMap(any_change, text="ε if d_in > 0 (an upper bound: the output ignores the scores)")
_UNBOUNDED = DistanceMap(unbounded, text="∞ if d_in > 0")
_CORRELATED = DistanceMap(
    split_step(gem.correlation_split, (any_change, scaled)),
    text="cε·[d_in > 0] (the bit) + d_in·(1 − c)ε (the selection), c = corr_budget_fraction",
)

_BOUNDED, _ANY = Neighbouring.BOUNDED, Neighbouring.ANY
_EXACT = Audit(AuditKind.EXACT)
_TIGHT = Audit(AuditKind.EXACT, reach=0.4)  # the box vertices attain ≥ 40 % of ε (the audit is not vacuous)
_GEM = Audit(AuditKind.EXACT, ({}, {"beta": 0.2}), reach=0.4)
_STOPPING = Audit(AuditKind.STATISTICAL, ({"gamma": 0.05},))  # about 1/γ draws per sample: 20
# clm at k = 1 is rnm at γε: the loss reaches ≥ 40 % of γε = ε/2 at the default γ = ½
_CLM = Audit(AuditKind.EXACT, ({}, {"loss_weight": 0.0}, {"loss_weight": 1.0}), reach=0.2)

BUILTIN = (
    Mechanism(
        "rnm",
        "report noisy max: argmax(q + Z), Z ~ Exponential(mean 2Δmax/ε)",
        noisy_max.rnm_sample,
        noisy_max.rnm_log_probabilities,
        expectation_fn=noisy_max.rnm_expectation,
        privacy=_declared("rnm", _BOUNDED, _TIGHT, distance_map=_SCALED_TIGHT),
        float_level=FLOAT_EXACT,
        rows=noisy_max.rnm_rows,
    ),
    Mechanism(
        "rnm_laplace",
        "report noisy max: argmax(q + Z), Z ~ Laplace(2Δmax/ε)",
        noisy_max.rnm_laplace_sample,
        noisy_max.rnm_laplace_log_probabilities,
        privacy=_declared("rnm_laplace", _BOUNDED, _TIGHT, distance_map=_SCALED_TIGHT),
        float_level=FLOAT_EXACT,
    ),
    Mechanism(
        "em",
        "exponential mechanism: P(a) ∝ exp(ε q_a / 2Δmax)",
        noisy_max.em_sample,
        noisy_max.em_log_probabilities,
        expectation_fn=noisy_max.em_expectation,
        privacy=_declared("em", _BOUNDED, _TIGHT, distance_map=_SCALED_TIGHT),
        float_level=FLOAT_EXACT,
    ),
    Mechanism(
        "pf",
        "permute-and-flip (same distribution as rnm)",
        noisy_max.pf_sample,
        noisy_max.rnm_log_probabilities,
        expectation_fn=noisy_max.rnm_expectation,
        privacy=_declared("pf", _BOUNDED, _TIGHT, distance_map=_SCALED_TIGHT),
        float_level=FLOAT_EXACT,
        rows=noisy_max.rnm_rows,
    ),
    Mechanism(
        "krr",
        "k-ary randomised response on the argmax: argmax w.p. e^ε/(e^ε+n−1), others 1/(e^ε+n−1); "
        "tied maxima share uniformly",
        randomized_response.krr_sample,
        randomized_response.krr_log_probabilities,
        expectation_fn=randomized_response.krr_expectation,
        privacy=_declared("krr", _ANY, _TIGHT, distance_map=_ANY_CHANGE_TIGHT),
        float_level=FLOAT_EXACT,
    ),
    Mechanism(
        "random",
        "uniform over the candidates (baseline, 0-DP)",
        randomized_response.random_sample,
        randomized_response.random_log_probabilities,
        expectation_fn=randomized_response.random_expectation,
        privacy=_declared("random", _ANY, _EXACT, distance_map=_ANY_CHANGE),
        float_level=FLOAT_EXACT,
    ),
    Mechanism(
        "rnmh",
        "report noisy max with Z_a ~ Exponential(mean 2Δ_a/ε) (paper §IV-A; reference only)",
        noisy_max.rnmh_sample,
        privacy=_declared("rnmh", _BOUNDED, Audit(AuditKind.NONE), not_private, distance_map=_UNBOUNDED),
    ),
    Mechanism(
        "rs",
        "Liu–Talwar random stopping: uniform draws, Laplace(3Δ_a/ε), stop w.p. γ",
        random_stopping.rs_sample,
        params=param_specs(random_stopping.GAMMA),
        privacy=_declared("rs", _BOUNDED, _STOPPING, distance_map=_SCALED),
        float_level=FLOAT_EXACT,
    ),
    Mechanism(
        "rs_improved",
        "Papernot–Steinke stopping (η=0): K ~ Logarithmic(1−γ) draws, Laplace(2Δ_a/ε)",
        random_stopping.rs_improved_sample,
        params=param_specs(random_stopping.GAMMA),
        privacy=_declared("rs_improved", _BOUNDED, _STOPPING, distance_map=_SCALED),
        float_level=FLOAT_EXACT,
    ),
    Mechanism(
        "gem",
        "generalised exponential mechanism: t = 2 ln(n/β)/ε, s = q − tΔ, "
        "q'_a = min_a' (s_a−s_a')/(Δ_a+Δ_a'), rnm on q' with Δ = 1",
        gem.gem_sample,
        gem.gem_log_probabilities,
        param_specs(gem.BETA),
        expectation_fn=gem.gem_expectation,
        privacy=_declared("gem", _BOUNDED, _GEM, distance_map=_SCALED),
        peel_fn=gem_peel.gem_peel,
        peel_work_fn=gem_peel.peel_work,
        float_level=FLOAT_EXACT,
    ),
    Mechanism(
        "mgem",
        "modified GEM: as gem with t = −2 ln(n/β)/ε",
        gem.mgem_sample,
        gem.mgem_log_probabilities,
        param_specs(gem.BETA),
        expectation_fn=gem.mgem_expectation,
        privacy=_declared("mgem", _BOUNDED, _GEM, distance_map=_SCALED),
        peel_fn=gem_peel.mgem_peel,
        peel_work_fn=gem_peel.peel_work,
        float_level=FLOAT_EXACT,
    ),
    Mechanism(
        "combined_gem",
        "RR (ε_c = cε) on [spearman(q, Δ) ≥ 0], then mgem (1) / gem (0) with ε − ε_c",
        gem_combined.combined_gem_sample,
        gem.combined_gem_log_probabilities,
        param_specs(gem.BETA, gem.CORR_BUDGET_FRACTION),
        expectation_fn=gem.combined_gem_expectation,
        privacy=_declared(
            "combined_gem",
            _BOUNDED,
            Audit(AuditKind.EXACT, ({}, {"beta": 0.2, "corr_budget_fraction": 0.25}), reach=0.4),
            split=gem.correlation_split,
            distance_map=_CORRELATED,
        ),
        float_level=FLOAT_EXACT,
        batch=gem_combined.combined_gem_batch,
    ),
    # One-shot top-k: a slate is one pass at ε (not k selections at ε/k). Outside the default set:
    # the evaluation's and `auto`'s defaults stay the single-item mechanisms of the paper.
    Mechanism(
        "oneshot",
        "one-shot top-k: the k largest of q + Z, Z ~ Exponential(mean 2kΔmax/ε) drawn once (k = 1: rnm)",
        noisy_max.rnm_sample,
        noisy_max.rnm_log_probabilities,
        expectation_fn=noisy_max.rnm_expectation,
        privacy=_declared("oneshot", _BOUNDED, _TIGHT, distance_map=_SCALED_SLATE_TIGHT),
        float_level=FLOAT_EXACT,
        top_k=topk.oneshot_top_k,
        slate_log_probabilities_fn=topk.oneshot_slate_log_probabilities,
        default=False,
    ),
    Mechanism(
        "gumbel",
        "one-shot top-k: the k largest of q + G, G ~ Gumbel(scale 2kΔmax/ε) drawn once "
        "(= peeling em at ε/k with the whole set's Δmax)",
        noisy_max.em_sample,
        noisy_max.em_log_probabilities,
        expectation_fn=noisy_max.em_expectation,
        privacy=_declared("gumbel", _BOUNDED, _TIGHT, distance_map=_SCALED_SLATE_TIGHT),
        float_level=FLOAT_EXACT,
        top_k=topk.gumbel_top_k,
        slate_log_probabilities_fn=topk.gumbel_slate_log_probabilities,
        default=False,
    ),
    Mechanism(
        "clm",
        "canonical Lipschitz mechanism: a k-subset by noisy max of −(ε/2)·loss over all subsets, "
        "loss = (1−γ)·max(worst chosen, best left out) − γ·worst chosen (in units of Δmax); random order",
        clm.clm_sample,
        clm.clm_log_probabilities,
        param_specs(clm.LOSS_WEIGHT),
        privacy=_declared("clm", _BOUNDED, _CLM, distance_map=_SCALED_SLATE),
        float_level=FLOAT_EXACT,
        top_k=clm.clm_top_k,
        slate_log_probabilities_fn=clm.clm_slate_log_probabilities,
        default=False,
    ),
)
