"""Online Debiasing (issue 4, "Debiasing" bullets): OnlineDebiaser alone and inside the stack."""

from __future__ import annotations

import json

import numpy as np
import pytest
from wrapper_toys import SyntheticWorldModel, ToySeamEnv, paper_bias, toy_true_score, training_steps

from wrappers import AnchorWrapper, CalibrationConfig, CalibrationWrapper, OnlineDebiaser, WorldModelWrapper


def synthetic_pairs(rng: np.random.Generator, n: int, noise: float, bias=paper_bias) -> tuple[np.ndarray, np.ndarray]:
    """``(wm, r)``: true scores r ~ U[0, 1] and the synthetic world model's scores."""
    r = rng.random(n)
    return np.clip(bias(r) + rng.normal(0.0, noise, n), 0.0, 1.0), r


def centred_bias(
    transform, noise: float, rng: np.random.Generator, groups: int = 200, size: int = 8, draws: int = 200
) -> float:
    """Within-group centred bias: mean |E[g(wm) | r] - r| after centring both within each group.

    The expectation over the world model's noise is taken by Monte Carlo, so this is the
    systematic error GRPO's group centring leaves, not the noise.
    """
    r = rng.random((groups, size))
    wm = np.clip(paper_bias(r)[None] + rng.normal(0.0, noise, (draws, groups, size)), 0.0, 1.0)
    expected = np.asarray(transform(wm.ravel().tolist()), dtype=float).reshape(wm.shape).mean(axis=0)
    err = (expected - expected.mean(axis=1, keepdims=True)) - (r - r.mean(axis=1, keepdims=True))
    return float(np.mean(np.abs(err)))


def fitted(noise: float, seed: int = 0, n: int = 2000) -> OnlineDebiaser:
    d = OnlineDebiaser()
    wm, r = synthetic_pairs(np.random.default_rng(seed), n, noise)
    for i in range(0, n, 32):  # arrives in steps, as anchor pairs do
        d.add(list(zip(wm[i : i + 32], r[i : i + 32])))
    return d


def test_identity_before_first_fit_and_fit_at_start_pairs():
    d = OnlineDebiaser()  # paper defaults: 200 / 64 / 5000
    wm, r = synthetic_pairs(np.random.default_rng(1), 199, 0.005)
    assert d.add(list(zip(wm, r))) is False
    probe = [0.0, 0.13, 0.5, 0.77, 1.0, None]
    assert d.transform(probe) == probe and not d.fitted
    assert d.add([(0.3, 0.1)]) is True and d.fitted and d.n_fits == 1
    assert d.transform([0.3]) != [0.3]


def test_refits_every_64_new_pairs_and_caps_fifo():
    d = OnlineDebiaser(start_pairs=200, refit_every=64, max_pairs=300)
    wm, r = synthetic_pairs(np.random.default_rng(2), 1000, 0.005)
    fits = [d.add([(a, b)]) for a, b in zip(wm, r)]
    assert [i + 1 for i, f in enumerate(fits) if f][:3] == [200, 264, 328]
    assert d.n_fits == 1 + (1000 - 200) // 64
    assert len(d.pairs) == 300 and d.pairs[-1] == (wm[-1], r[-1]) and d.n_seen == 1000


def test_map_is_monotone_and_clipped():
    d = fitted(0.05)
    y = d.transform(np.linspace(0.0, 1.0, 501).tolist())
    assert all(b >= a for a, b in zip(y, y[1:])) and y[-1] > y[0]
    assert min(y) >= 0.0 and max(y) <= 1.0
    lo = d.state_dict()["map"]["x"][0]
    assert lo > 0.1  # scores below the fitted range are clipped to its lower end
    assert d.transform([0.0, 0.05]) == d.transform([lo, lo])


@pytest.mark.parametrize("noise, min_drop", [(0.005, 0.9), (0.05, 0.4)])
def test_within_group_centred_bias_drops(noise, min_drop):
    d = fitted(noise)
    before = centred_bias(lambda s: s, noise, np.random.default_rng(10))
    after = centred_bias(d.transform, noise, np.random.default_rng(10))
    assert before > 0.03  # the synthetic world model really is biased within groups
    assert 1.0 - after / before >= min_drop, (before, after)


def test_map_changes_within_group_z_scores():
    # GRPO standardises rewards within a group; an affine map would cancel out, the
    # isotonic map must not: calibrated z-scores move towards the true ones.
    d = fitted(0.005)
    rng = np.random.default_rng(3)
    r = rng.random((300, 8))
    wm = np.clip(paper_bias(r) + rng.normal(0.0, 0.005, r.shape), 0.0, 1.0)
    cal = np.asarray(d.transform(wm.ravel().tolist())).reshape(wm.shape)

    def z(a):
        return (a - a.mean(axis=1, keepdims=True)) / a.std(axis=1, keepdims=True)

    assert np.abs(z(cal) - z(wm)).mean() > 0.01
    assert np.abs(z(cal) - z(r)).mean() < 0.5 * np.abs(z(wm) - z(r)).mean()


def test_follows_a_drifting_bias():
    d = OnlineDebiaser(max_pairs=1000)
    rng = np.random.default_rng(4)
    shifted = lambda r: np.clip(0.6 * r + 0.35, 0, 1)  # noqa: E731 - the drifted world model
    for bias in (paper_bias, shifted):
        wm, r = synthetic_pairs(rng, 1200, 0.005, bias)
        for i in range(0, 1200, 32):
            d.add(list(zip(wm[i : i + 32], r[i : i + 32])))
        probe_r = np.linspace(0.05, 0.95, 19)
        mapped = np.asarray(d.transform(bias(probe_r).tolist()))
        assert np.abs(mapped - probe_r).max() < 0.05, bias


def test_none_pairs_are_skipped_and_bad_pairs_rejected():
    d = OnlineDebiaser(start_pairs=2)
    d.add([(None, 0.5), (0.5, None), (0.2, 0.1)])
    assert d.n_skipped == 2 and d.n_seen == 1 and not d.fitted
    with pytest.raises(ValueError, match="true_score must be in"):
        d.add([(0.2, 1.5)])
    with pytest.raises(ValueError, match="pair is"):
        d.add([(0.2, 0.3, 0.4)])
    with pytest.raises(ValueError, match="start_pairs"):
        OnlineDebiaser(start_pairs=0)


def test_state_round_trips_through_json():
    d = fitted(0.05, n=700)
    again = OnlineDebiaser()
    again.load_state_dict(json.loads(json.dumps(d.state_dict())))
    probe = np.linspace(0, 1, 57).tolist()
    assert again.transform(probe) == d.transform(probe)
    assert again.pairs == d.pairs and again.n_fits == d.n_fits
    wm, r = synthetic_pairs(np.random.default_rng(9), 64, 0.05)
    assert d.add(list(zip(wm, r))) == again.add(list(zip(wm, r))) is True
    assert again.transform(probe) == d.transform(probe)
    with pytest.raises(ValueError, match="config mismatch"):
        OnlineDebiaser(start_pairs=10).load_state_dict(d.state_dict())


def test_stack_debiases_every_world_model_reward():
    """Through CalibrationWrapper(AnchorWrapper(WorldModelWrapper(env))): after enough anchor
    pairs, non-anchor rewards (world model only) have far less within-group centred error."""
    wm = SyntheticWorldModel(noise=0.005)
    env = CalibrationWrapper(AnchorWrapper(WorldModelWrapper(ToySeamEnv(n_actions=64), wm), fraction=0.1, seed=0))
    groups: dict[str, list[dict]] = {}
    for record in training_steps(env, range(24), groups=32, size=8, seed=5):
        groups.setdefault(record["group_id"], []).append(record)
    errors: dict[bool, list[float]] = {False: [], True: []}  # keyed by "map fitted when the group began"
    for members in groups.values():
        if members[0]["anchor"]:
            continue
        assert all(m["source"] == "wm" and m["reward"] == m["calibrated_score"] for m in members)
        rw = np.array([m["reward"] for m in members])
        t = np.array([toy_true_score(m["task"], m["action"]) for m in members])
        errors[members[0]["reset_info"]["calibrated"]].append(np.mean(((rw - rw.mean()) - (t - t.mean())) ** 2))
    assert env.debiaser.fitted and env.debiaser.n_fits >= 3
    before, after = np.mean(errors[False]), np.mean(errors[True])
    assert len(errors[False]) >= 100 and len(errors[True]) >= 100
    assert 1.0 - after / before >= 0.9, (before, after)


def test_pairs_with_one_distinct_world_model_score_keep_the_identity_map():
    """An isotonic fit on a single distinct x is a constant: it would map every score to the
    mean true score. Such a fit is refused (the map stays the identity) and stays due."""
    d = OnlineDebiaser(start_pairs=3, refit_every=1)
    assert d.add([(0.5, 0.1), (0.5, 0.9), (0.5, 0.4)]) is False
    assert not d.fitted and d.due and d.n_fits == 0
    probe = [0.1, 0.5, 0.8]
    assert d.transform(probe) == probe
    assert d.add([(0.7, 0.95)]) is True and d.fitted  # a second distinct score: the fit happens
    low, high = d.transform([0.5, 0.7])
    assert low == pytest.approx(np.mean([0.1, 0.9, 0.4])) and high == pytest.approx(0.95)


def test_deferred_refit_waits_for_refit_if_due():
    d = OnlineDebiaser(start_pairs=4, refit_every=2)
    wm, r = synthetic_pairs(np.random.default_rng(3), 8, 0.01)
    assert d.add(list(zip(wm[:6], r[:6])), refit=False) is False
    assert d.due and not d.fitted and d.transform([0.4]) == [0.4]
    assert d.refit_if_due() is True and d.fitted and not d.due and d.refit_if_due() is False
    d.add(list(zip(wm[6:], r[6:])), refit=False)
    assert d.due and d.n_fits == 1


# -- the data-driven start (start_rule="cv") ------------------------------------------------


def _stream(true_of, n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    wm = rng.random(n)
    return [(float(w), float(np.clip(true_of(w) + rng.normal(0, 0.05), 0, 1))) for w in wm]


def test_cv_start_fits_a_biased_world_model_early_and_a_calibrated_one_never():
    biased = OnlineDebiaser(start_pairs=16, refit_every=16, start_rule="cv")
    fitted_at = None
    for k, pair in enumerate(_stream(lambda w: w**3, 200), start=1):
        biased.add([pair])
        if biased.fitted and fitted_at is None:
            fitted_at = k
    assert fitted_at is not None and fitted_at <= 40  # the paper's count rule would wait for 200
    assert biased.last_cv["gain"] > biased.last_cv["gain_se"] > 0
    calibrated = OnlineDebiaser(start_pairs=16, refit_every=16, start_rule="cv")
    for pair in _stream(lambda w: w, 300, seed=1):
        calibrated.add([pair])
    assert not calibrated.fitted  # raw scores already right: no map to gain from
    assert calibrated.last_cv is not None and calibrated.last_cv["pairs"] == 300
    count = OnlineDebiaser(start_pairs=200, refit_every=16)
    count.add(_stream(lambda w: w**3, 199))
    assert not count.fitted and count.last_cv is None  # the count rule never cross-validates


def test_cv_start_state_round_trips_and_count_states_of_before_still_load():
    d = OnlineDebiaser(start_pairs=16, refit_every=8, start_rule="cv")
    d.add(_stream(lambda w: w, 20))
    assert not d.fitted and d.last_cv is not None
    again = OnlineDebiaser(start_pairs=16, refit_every=8, start_rule="cv")
    again.load_state_dict(json.loads(json.dumps(d.state_dict())))
    assert again.last_cv == d.last_cv and again.pairs == d.pairs
    with pytest.raises(ValueError, match="config mismatch"):
        OnlineDebiaser(start_pairs=16, refit_every=8).load_state_dict(d.state_dict())
    old = OnlineDebiaser(start_pairs=16, refit_every=8).state_dict()
    for key in ("last_cv", "checked_at"):  # a state saved before the cv rule existed
        del old[key]
    OnlineDebiaser(start_pairs=16, refit_every=8).load_state_dict(old)
    with pytest.raises(ValueError, match="start_rule"):
        CalibrationConfig(start_rule="soon")
