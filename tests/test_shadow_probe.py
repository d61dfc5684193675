"""Exploitation, measured: agents.grpo.ShadowProbe on the toy stack."""

from __future__ import annotations

import json

import numpy as np
import pytest
from wrapper_toys import SyntheticWorldModel, ToySeamEnv, paper_bias, toy_true_score, training_steps

from agents.grpo import ShadowProbe
from wrappers import StackHandle, build_stack


def _episodes(env, step, groups, size, seed):
    """A GRPO-shaped step on any single-env stack (``training_steps`` needs an anchor layer)."""
    if StackHandle(env).has_anchors:
        yield from training_steps(env, [step], groups=groups, size=size, seed=seed)
        return
    rng = np.random.default_rng([seed, step])
    for _ in range(groups):
        task = int(rng.integers(10**6))
        for action in rng.choice(env.action_space.n, size=size, replace=False).tolist():
            env.reset(options={"task": task})
            env.step(action)
            yield {"task": task, "action": action}


def _run(env, probe, steps):
    for step in steps:
        for _ in _episodes(env, step, groups=2, size=4, seed=3):
            pass
        probe(step + 1, {})


def test_probe_measures_the_raw_world_models_bias_for_real_every_n_steps():
    env = build_stack(ToySeamEnv(n_actions=32), "wm", SyntheticWorldModel(noise=0.0))
    probe = ShadowProbe(env, every=3, sample=4, seed=1)
    _run(env, probe, range(9))
    assert [r["step"] for r in probe.records] == [3, 6, 9] and all(r["n"] == 4 for r in probe.records)
    assert env.unwrapped.n_real_grades == 12  # only the probes executed anything
    # the paper bias 0.25 + 0.55 r + 0.2 r^2 - r is positive below r ~ 0.69: the raw gap is its mean
    for r in probe.records:
        assert r["raw_gap"] == pytest.approx(r["calibrated_gap"])  # the wm stack has no map
    s = probe.summary()
    assert s["probes"] == 3 and s["executions"] == 12 and s["cpu_s"] >= 0.0
    gaps = [r["raw_gap"] for r in probe.records]  # 3 probes: the quarters are the first and the last
    assert s["raw_gap_start"] == pytest.approx(gaps[0]) and s["raw_gap_end"] == pytest.approx(gaps[-1])
    assert s["raw_gap_start_se"] is None and s["raw_gap_mean"] == pytest.approx(sum(gaps) / 3)
    assert s["raw_gap_mean_se"] is not None and s["raw_gap_slope_per_step"] is not None


def test_probe_summary_ends_are_quarter_means_with_their_standard_errors():
    env = build_stack(ToySeamEnv(n_actions=32), "wm", SyntheticWorldModel(noise=0.0))
    probe = ShadowProbe(env, every=1, sample=4, seed=1)
    gaps = [0.4, 0.2, 0.0, 0.1, 0.1, 0.1, -0.3, -0.1]
    probe.records = [
        {"step": i + 1, "n": 4, "unknown_real": 0, "raw_gap": g, "calibrated_gap": g / 2} for i, g in enumerate(gaps)
    ]
    s = probe.summary()
    assert s["raw_gap_start"] == pytest.approx(0.3) and s["raw_gap_end"] == pytest.approx(-0.2)
    assert s["raw_gap_start_se"] == pytest.approx(0.1) and s["raw_gap_end_se"] == pytest.approx(0.1)
    assert s["calibrated_gap_end"] == pytest.approx(-0.1) and s["raw_gap_mean"] == pytest.approx(0.0625)
    assert s["raw_gap_slope_per_step"] < 0


def test_probe_gap_is_exactly_the_world_model_minus_real_score():
    wm = SyntheticWorldModel(noise=0.0)
    env = build_stack(ToySeamEnv(n_actions=32), "wm", wm)
    probe = ShadowProbe(env, every=1, sample=100, seed=0)  # every member of the step
    records = list(_episodes(env, 0, groups=1, size=4, seed=5))
    probe(1, {})
    expected = [
        paper_bias(toy_true_score(r["task"], r["action"])) - toy_true_score(r["task"], r["action"]) for r in records
    ]
    assert probe.records[0]["raw_gap"] == pytest.approx(sum(expected) / 4)


def test_probe_skips_anchor_gradings_uses_its_own_grader_and_round_trips():
    calls = []
    inner = ToySeamEnv(n_actions=32)

    def grader(request):
        calls.append(request)
        return None if len(calls) % 2 else inner.grade(request)  # every other one: the grader failed

    env = build_stack(ToySeamEnv(n_actions=32), "wmrl", SyntheticWorldModel(), anchor_fraction=0.5)
    probe = ShadowProbe(env, every=1, sample=2, grader=grader)
    _run(env, probe, range(4))
    assert len(calls) == 8 and sum(r["unknown_real"] for r in probe.records) == 4  # unknown: counted, left out
    again = ShadowProbe(env, every=1, sample=2, grader=grader)
    again.load_state_dict(json.loads(json.dumps(probe.state_dict())))
    assert again.summary() == probe.summary()
    with pytest.raises(TypeError, match="no world-model layer"):
        ShadowProbe(ToySeamEnv(), grader=grader)
