"""Inverse-Variance Denoising (issue 4, "Denoising" bullets): InverseVarianceWeighter alone and in the stack."""

from __future__ import annotations

import json

import numpy as np
import pytest
from wrapper_toys import SyntheticWorldModel, ToySeamEnv, training_steps

from wrappers import AnchorWrapper, CalibrationWrapper, InverseVarianceWeighter, WorldModelWrapper


def noisy_group(rng: np.random.Generator, noise: float, size: int = 8) -> tuple[list[float], list[float]]:
    t = rng.random(size)
    return (t + rng.normal(0.0, noise, size)).tolist(), t.tolist()


def test_weight_is_exactly_one_before_and_exactly_two_at_calibration():
    w = InverseVarianceWeighter()  # paper defaults: half-life 64, freeze after 32, 2.0, max 4.0
    rng = np.random.default_rng(0)
    for _k in range(31):
        assert w.observe(*noisy_group(rng, 0.1))
        assert w.weight == 1.0 and w.scale is None
    w.observe(*noisy_group(rng, 0.1))
    assert w.frozen and w.n_observed == 32
    assert w.weight == 2.0  # exactly, not approximately
    assert w.scale == pytest.approx(1.0 / w.ema)


def test_weight_rises_with_disagreement_and_is_clipped():
    rng = np.random.default_rng(1)
    w = InverseVarianceWeighter()
    for _ in range(32):
        w.observe(*noisy_group(rng, 0.05, size=32))
    weights = [w.weight]
    for noise in (0.06, 0.07, 0.08, 0.5):  # the world model gets worse
        for _ in range(150):
            w.observe(*noisy_group(rng, noise, size=32))
        weights.append(w.weight)
    assert weights[0] == 2.0 and all(b > a for a, b in zip(weights[:4], weights[1:4])), weights
    assert weights[-1] == 4.0  # clipped
    for _ in range(1500):  # and better again: never below 1
        w.observe(*noisy_group(rng, 0.0))
    assert 1.0 <= w.weight < 1.01


def test_degenerate_groups_and_none_never_enter_the_estimate():
    w = InverseVarianceWeighter(freeze_after=2)
    assert w.observe([0.1, 0.9, 0.5], [0.4, 0.4, 0.4]) is False  # zero true variance
    assert w.observe([0.3, None, 0.8], [None, 0.2, 0.9]) is False  # < 2 known members
    assert w.observe([0.5], [0.5]) is False
    assert w.ema is None and w.n_observed == 0 and w.n_degenerate == 3
    # None members are left out of a group that still has >= 2 known ones
    assert w.disagreement([0.1, None, 0.9, 0.7], [0.0, 0.9, 1.0, None]) == w.disagreement([0.1, 0.9], [0.0, 1.0])
    with pytest.raises(ValueError, match="differ in length"):
        w.observe([0.1, 0.2], [0.1])


def test_disagreement_is_centred_and_normalised():
    t = [0.1, 0.5, 0.9]
    assert InverseVarianceWeighter.disagreement([x + 0.3 for x in t], t) == pytest.approx(0.0)  # offset: centred away
    d1 = InverseVarianceWeighter.disagreement([0.2, 0.5, 0.8], t)
    d2 = InverseVarianceWeighter.disagreement([0.4, 1.0, 1.6], [2 * x for x in t])
    assert d1 > 0 and d2 == pytest.approx(d1)  # scale-free


def test_ema_half_life():
    w = InverseVarianceWeighter(half_life=4, freeze_after=1000)
    w.observe([0.0, 1.0], [0.0, 1.0])  # d = 0
    assert w.ema == 0.0
    for _ in range(4):
        w.observe([1.0, 0.0], [0.0, 1.0])  # d = 4
    assert w.ema == pytest.approx(4.0 * 0.5)


def test_state_round_trips_through_json():
    rng = np.random.default_rng(2)
    w = InverseVarianceWeighter(freeze_after=5)
    for _ in range(9):
        w.observe(*noisy_group(rng, 0.1))
    again = InverseVarianceWeighter(freeze_after=5)
    again.load_state_dict(json.loads(json.dumps(w.state_dict())))
    assert again.weight == w.weight and again.scale == w.scale
    g = noisy_group(rng, 0.3)
    w.observe(*g), again.observe(*g)
    assert again.weight == w.weight
    with pytest.raises(ValueError, match="config mismatch"):
        InverseVarianceWeighter().load_state_dict(w.state_dict())


def test_stack_weight_engages_only_after_calibration():
    """In the stack, the weight is exactly 1.0 until the map is fitted and 32 anchor groups were
    observed after that, then exactly 2.0, and it is reported in every info."""
    env = CalibrationWrapper(
        AnchorWrapper(
            WorldModelWrapper(ToySeamEnv(n_actions=64), SyntheticWorldModel(noise=0.05)), fraction=0.25, seed=1
        )
    )
    seen = []
    for record in training_steps(env, range(40), groups=16, size=4, seed=3):
        assert record["anchor_weight"] == env.anchor_weight  # reported on every step
        seen.append((record["calibrated"], env.weighter.n_observed, record["anchor_weight"]))
    assert all(weight == 1.0 for fitted, _, weight in seen if not fitted)
    assert all(weight == 1.0 for _, n, weight in seen if n < 32)
    assert any(n == 32 and weight == 2.0 for _, n, weight in seen)
    assert any(weight != 2.0 for _, n, weight in seen if n > 40)
    assert 1.0 <= min(w for *_, w in seen) and max(w for *_, w in seen) <= 4.0


@pytest.mark.parametrize("debias,denoise", [(False, False), (False, True), (True, False), (True, True)])
def test_correction_switches_give_the_four_ablation_settings(debias, denoise):
    """``debias=False`` keeps raw world-model scores as rewards (the map is still fitted and
    reported); ``denoise=False`` keeps the weight at exactly 1.0."""
    env = CalibrationWrapper(
        AnchorWrapper(
            WorldModelWrapper(ToySeamEnv(n_actions=64), SyntheticWorldModel(noise=0.05)), fraction=0.25, seed=1
        ),
        debias=debias,
        denoise=denoise,
    )
    records = list(training_steps(env, range(40), groups=16, size=4, seed=3))
    late = [r for r in records if r["calibrated"] and r["source"] == "wm"]
    assert late, "the map never engaged"
    mapped = [r["calibrated_score"] != r["wm_score"] for r in late]
    assert any(mapped) if debias else not any(mapped)
    assert all(r["reward"] == pytest.approx(r["calibrated_score"]) for r in late)
    weights = {r["anchor_weight"] for r in records}
    assert (weights != {1.0}) if denoise else (weights == {1.0})


def test_true_scores_equal_up_to_rounding_are_degenerate():
    """``[.5, .5, .5, .5 + 1e-9]`` has var ~2e-19: dividing a real disagreement by it would pin
    the weight at its clip. It is skipped like an exactly equal group."""
    assert InverseVarianceWeighter.disagreement([0.1, 0.9, 0.5, 0.5], [0.5, 0.5, 0.5, 0.5 + 1e-9]) is None
    w = InverseVarianceWeighter(freeze_after=1)
    rng = np.random.default_rng(0)
    assert w.observe(*noisy_group(rng, 0.1))
    assert w.weight == 2.0
    for _ in range(20):
        assert w.observe([0.1, 0.9, 0.5, 0.3], [0.5, 0.5, 0.5, 0.5 + 1e-9]) is False
    assert w.weight == 2.0 and w.n_degenerate == 20 and w.n_observed == 1


@pytest.mark.parametrize("start", ["after-fit", "first-anchor"])
def test_weighter_start_switch(start):
    """Default ``after-fit``: the weighter observes only once the map is fitted (the weight is
    exactly 1.0 until then). ``first-anchor`` (the reference implementation): from the first
    anchor group, on raw disagreement."""
    env = CalibrationWrapper(
        AnchorWrapper(
            WorldModelWrapper(ToySeamEnv(n_actions=64), SyntheticWorldModel(noise=0.05)), fraction=0.25, seed=1
        ),
        start_pairs=400,
        freeze_after=4,
        weighter_start=start,
    )
    before_fit = [
        (env.weighter.n_observed, r["anchor_weight"]) for r in training_steps(env, range(20), groups=16, size=4, seed=3)
    ]
    assert not env.debiaser.fitted  # 20 steps x ~4 anchor groups x 4 members < 400 pairs
    if start == "after-fit":
        assert env.weighter.n_observed == 0 and {w for _, w in before_fit} == {1.0}
    else:
        assert env.weighter.n_observed >= 40 and env.weighter.frozen and any(w != 1.0 for _, w in before_fit)
    with pytest.raises(ValueError, match="weighter_start"):
        CalibrationWrapper(env.env, weighter_start="sometime")


def test_rounding_residuals_of_a_perfect_world_model_never_move_the_weight():
    """A map fitted on a perfect world model reproduces the true scores up to ~1e-17; that is
    no disagreement: the scale must not freeze on it (it would pin the weight at 4 after)."""
    t = [0.25, 0.5, 0.75, 1.0]
    assert InverseVarianceWeighter.disagreement([0.25 + 2.8e-17, 0.5, 0.75, 1.0], t) == 0.0
    w = InverseVarianceWeighter(freeze_after=2)
    rng = np.random.default_rng(1)
    for _ in range(50):
        noise = rng.normal(0.0, 1e-16, 4)
        assert w.observe((np.array(t) + noise).tolist(), t)
    assert not w.frozen and w.weight == 1.0


def test_weight_se_shrinks_as_groups_agree_and_round_trips():
    rng = np.random.default_rng(0)
    w = InverseVarianceWeighter(half_life=8.0, freeze_after=4, max_weight=100.0)
    assert w.weight_se is None
    true = [0.0, 0.5, 1.0]
    for _ in range(4):  # noisy disagreement: the scale freezes on it
        w.observe([t + rng.normal(0, 0.3) for t in true], true)
    noisy = w.weight_se
    for _ in range(60):  # a steady disagreement: the EMA's spread, and the weight's se, shrink
        w.observe([0.1, 0.5, 0.9], true)
    assert noisy is not None and noisy > 0 and w.weight_se < noisy / 5
    again = InverseVarianceWeighter(half_life=8.0, freeze_after=4, max_weight=100.0)
    again.load_state_dict(json.loads(json.dumps(w.state_dict())))
    assert again.weight_se == w.weight_se
