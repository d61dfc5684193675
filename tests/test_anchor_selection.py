"""Informative anchor selection: anchors chosen after the members' actions are known.

The scheduler half (``defer`` / ``decide``) is tested on its own; the wrapper half through a
vector stack of toy seam envs, where each group's members take their first step together.
"""

from __future__ import annotations

import dataclasses
import json

import gymnasium as gym
import numpy as np
import pytest
from wrapper_toys import SyntheticWorldModel, ToySeamEnv

from wmrl_envs.outcome import Outcome
from wmrl_envs.vector import sub_info
from wrappers import (
    AnchorScheduler,
    VectorAnchorWrapper,
    VectorCalibrationWrapper,
    VectorWorldModelWrapper,
    build_stack,
)
from wrappers.parts.scheduling import informative_priority


class ConfidenceWorldModel(SyntheticWorldModel):
    """The synthetic world model, reporting ``confidence`` 0.9 on even tasks and 0.4 on odd ones."""

    def predict(self, contexts, actions):
        out = super().predict(contexts, actions)
        return [
            None if o is None else dataclasses.replace(o, metrics={"confidence": 0.9 if c["task_id"] % 2 == 0 else 0.4})
            for c, o in zip(contexts, out)
        ]


def _stack(
    n_groups: int, size: int, fraction: float, seed: int = 0, wm=None, selection="informative", keep_share=True,
    **calibration,
):  # fmt: skip
    venv = gym.vector.SyncVectorEnv([lambda: ToySeamEnv(max_turns=1)] * (n_groups * size))
    anchor = VectorAnchorWrapper(
        VectorWorldModelWrapper(venv, wm or ConfidenceWorldModel()), fraction=fraction, min_per_step=0, seed=seed,
        selection=selection, anchor_auto_groups=False, keep_share=keep_share,
    )  # fmt: skip
    env = VectorCalibrationWrapper(anchor, **calibration) if calibration else anchor
    env.reset()  # gymnasium: the first reset covers every sub-env (filler groups, never anchors)
    return env


def _step(env, anchor, step: int, tasks, actions, size: int):
    """One GRPO step: announce, reset each group on its slots, one batched vector step."""
    gids = [f"s{step}-g{j}" for j in range(len(tasks))]
    assert anchor.begin_step(gids) == frozenset()  # nothing decided before the members act
    for j, (g, task) in enumerate(zip(gids, tasks)):
        mask = np.arange(len(tasks) * size) // size == j
        _, infos = env.reset(options={"task": int(task), "group_id": g, "reset_mask": mask})
        assert "_anchor" not in infos or not infos["_anchor"][mask].any()  # undecided at reset: left out
    return gids, env.step(np.asarray(actions))


# -- the scheduler ---------------------------------------------------------------------


def test_decide_never_picks_a_degenerate_group_and_keeps_the_share_on_target():
    s = AnchorScheduler(fraction=0.25, min_per_step=0, seed=5)
    rng = np.random.default_rng(0)
    picked_degenerate = 0
    for step in range(400):
        ids = [f"{step}-{j}" for j in range(4)]
        s.defer(ids)
        # about a third of the groups are degenerate; some steps have none worth grading
        prio = {g: (None if rng.random() < 0.35 else float(rng.random())) for g in ids}
        anchors = s.decide(prio)
        picked_degenerate += sum(prio[g] is None for g in anchors)
        eligible = sorted((g for g in ids if prio[g] is not None), key=lambda g: -prio[g])
        # the anchors are the most uncertain eligible groups
        assert sorted(anchors) == sorted(eligible[: len(anchors)])
        for g in ids:
            s.release(g)
    assert picked_degenerate == 0
    assert s.realized_fraction == pytest.approx(0.25, abs=0.01)  # what a step could not place came later


def test_a_deficit_from_steps_without_eligible_groups_is_paid_back():
    s = AnchorScheduler(fraction=0.5, min_per_step=0, seed=1)
    for step in range(3):  # nothing worth grading: no anchors, the target keeps running
        s.defer([f"{step}a", f"{step}b"])
        assert s.decide({f"{step}a": None, f"{step}b": None}) == frozenset()
    assert s.n_groups == 6 and s.n_anchors == 0
    s.defer(["x", "y", "z", "w"])
    assert s.decide({"x": 0.1, "y": 0.2, "z": 0.3, "w": 0.4}) == frozenset({"x", "y", "z", "w"})
    assert s.realized_fraction == pytest.approx(0.4)


def test_decide_refuses_groups_that_were_not_deferred_and_deferred_state_round_trips():
    s = AnchorScheduler(fraction=0.5, seed=2)
    s.begin_step(["a"])
    with pytest.raises(ValueError, match="not deferred"):
        s.decide({"a": 1.0})
    s.defer(["b", "c"])
    assert s.assign("b") is None and s.decision("b") is None
    again = AnchorScheduler(fraction=0.5, seed=2)
    again.load_state_dict(json.loads(json.dumps(s.state_dict())))
    assert again.decide({"b": 0.2, "c": None}) == s.decide({"b": 0.2, "c": None}) == frozenset({"b"})
    s.defer(["d"])
    s.release("d")  # released undecided: dropped, never counted as a group
    assert s.n_groups == 3 and s.assign("d") in (True, False)  # a fresh lazy decision, not "deferred"


def test_informative_priority_reads_distinct_actions_and_confidence():
    sure = Outcome("valid", 0.5, metrics={"confidence": 0.8})
    assert informative_priority([(1, sure), (1, sure), (None, None)]) is None  # one distinct graded action
    assert informative_priority([(1, sure), (2, sure)]) == 0.0  # every informative group alike
    assert informative_priority([(1, sure), (2, sure)], least_confident=True) == pytest.approx(0.2)
    assert informative_priority([(1, None), (2, Outcome("valid", 0.5))], least_confident=True) == 0.0  # neutral


def test_informative_priority_puts_groups_with_a_calibrated_spread_first():
    low, high = Outcome("valid", 0.6, metrics={"confidence": 0.9}), Outcome("valid", 0.7, metrics={"confidence": 0.9})
    flat_step = lambda scores: [None if s is None else 0.65 for s in scores]  # noqa: E731  # an isotonic flat step
    assert informative_priority([(1, low), (2, high)]) == 1.0  # raw scores differ, no map: a spread
    assert informative_priority([(1, low), (2, high)], calibrate=flat_step) == 0.0  # one calibrated score
    assert informative_priority([(1, low), (2, low)]) == 0.0  # distinct scripts, one score: still eligible
    assert informative_priority([(1, low), (2, None)]) == 0.0  # an unknown score is no spread
    assert informative_priority([(1, low), (1, high)], calibrate=flat_step) is None  # copies: never
    # least-confident ranks within each tier: a sure group with a spread beats an unsure flat one
    unsure = Outcome("valid", 0.6, metrics={"confidence": 0.1})
    spread_sure = informative_priority([(1, low), (2, high)], least_confident=True)
    flat_unsure = informative_priority([(1, unsure), (2, unsure)], least_confident=True)
    assert spread_sure == pytest.approx(1.1) and flat_unsure == pytest.approx(0.9)


# -- the wrapper -------------------------------------------------------------------------


def test_least_confident_selection_grades_the_unsure_group_unless_it_holds_copies():
    size = 4
    env = _stack(n_groups=2, size=size, fraction=0.5, selection="least-confident")
    wm_layer = env.env
    for step in range(6):
        # group 0 (even task, confident) and group 1 (odd task, unsure) both have distinct actions
        _, (_, _, _, _, infos) = _step(env, env, step, [10 + 2 * step, 11 + 2 * step], np.arange(8), size)
        assert list(infos["anchor"]) == [False] * 4 + [True] * 4  # one anchor a step: the unsure group
        assert [sub_info(infos, i).get("true_score") is not None for i in range(8)] == [False] * 4 + [True] * 4
    # a step whose only unsure group is degenerate (four copies of one script): the confident one is graded
    _, (_, _, _, _, infos) = _step(env, env, 6, [40, 41], [0, 1, 2, 3, 5, 5, 5, 5], size)
    assert list(infos["anchor"]) == [True] * 4 + [False] * 4
    # the preview's predictions are the step's: each member predicted once, every prediction counted
    assert wm_layer.counters.wm_predictions == 7 * 8
    assert sum(env.unwrapped.get_attr("n_real_grades")) == 7 * 4 == wm_layer.counters.real_executions
    env.close()


def test_without_keep_share_all_degenerate_steps_grade_nothing_for_real_and_the_share_catches_up():
    size = 2
    env = _stack(n_groups=2, size=size, fraction=0.5, keep_share=False)
    for step in range(4):
        _, (_, _, _, _, infos) = _step(env, env, step, [2 * step + 1, 2 * step + 3], [7, 7, 9, 9], size)
        assert not infos["anchor"].any()
    assert env.env.counters.real_executions == 0
    _, (_, _, _, _, infos) = _step(env, env, 4, [1, 3], [0, 1, 2, 3], size)
    assert infos["anchor"].all()  # four groups behind target: both distinct groups are anchors now
    assert env.scheduler.realized_fraction == pytest.approx(0.2)


def test_keep_share_grades_a_collapsed_policy_for_real_and_stays_on_target():
    """A policy whose every group is copies of one script: by default its share is still met,
    so the exploitation monitor sees it; groups with distinct scripts still come first."""
    size = 2
    env = _stack(n_groups=4, size=size, fraction=0.25)
    for step in range(8):
        tasks = [10 * step + j for j in range(4)]
        _, (_, _, _, _, infos) = _step(env, env, step, tasks, [7, 7, 9, 9, 3, 3, 5, 5], size)
        assert infos["anchor"].sum() == size  # one group of four, every step
        graded = [sub_info(infos, i).get("true_score") is not None for i in range(8)]
        assert graded == list(infos["anchor"])  # ... and its members are graded for real
    assert env.scheduler.realized_fraction == pytest.approx(0.25)
    assert env.env.counters.real_executions == 8 * size
    # a step with one group of distinct scripts: that group is the anchor
    _, (_, _, _, _, infos) = _step(env, env, 8, [90, 91, 92, 93], [7, 7, 9, 9, 3, 4, 5, 5], size)
    assert list(infos["anchor"]) == [False, False, False, False, True, True, False, False]
    env.close()


class ActionScoreWorldModel:
    """Predicts ``action / 10`` for every action: scores the test chooses exactly."""

    def predict(self, contexts, actions):
        return [Outcome("valid", int(a) / 10, source="wm") for a in actions]


@pytest.mark.parametrize("selection", ["informative", "least-confident"])
def test_the_anchor_is_a_group_whose_calibrated_scores_differ(selection):
    """Distinct scripts the calibration map merges into one score (an isotonic flat step)
    come after a group whose calibrated scores differ; with no other group they still count."""
    size = 4
    env = _stack(n_groups=2, size=size, fraction=0.5, wm=ActionScoreWorldModel(), selection=selection,
                 keep_share=False, start_pairs=8, refit_every=1000)  # fmt: skip
    anchor = env.env
    # the map: one flat step at 0.2 for raw scores up to 0.3, then rising
    env.calibrator.add_pairs([(r / 10, 0.2) for r in range(4)] + [(r / 10, r / 10) for r in range(6, 10)])
    for step in range(6):
        flat, spread = [0, 1, 2, 3], [6, 7, 8, 9]  # raw 0.0-0.3 (calibrated 0.2 each) and 0.6-0.9
        groups = [flat, spread] if step % 2 else [spread, flat]  # either place in the step
        _, (_, _, _, _, infos) = _step(env, anchor, step, [2 * step, 2 * step + 1], np.concatenate(groups), size)
        assert env.debiaser.fitted  # refitted at the first step's boundary
        picked = [groups[j] for j in range(2) if infos["anchor"][j * size]]
        assert picked == [spread], f"step {step}: anchors {picked}"
        calibrated = [sub_info(infos, i)["calibrated_score"] for i in range(2 * size)]
        assert len({calibrated[i] for i in range(2 * size) if infos["anchor"][i]}) == size
    # both groups flat on the calibrated side: distinct scripts remain eligible (keep_share is off):
    # a map flat almost everywhere (one fitted on few pairs) must not stop the anchors it needs to refit
    _, (_, _, _, _, infos) = _step(env, anchor, 6, [50, 51], [0, 1, 2, 3, 3, 2, 1, 0], size)
    assert infos["anchor"].sum() == size
    env.close()


def test_calibration_and_denoising_learn_from_informative_anchors():
    size = 4
    env = _stack(n_groups=2, size=size, fraction=0.5, wm=ConfidenceWorldModel(noise=0.05), start_pairs=16,
                 refit_every=8, freeze_after=2, weighter_start="first-anchor")  # fmt: skip
    anchor = env.env
    rng = np.random.default_rng(3)
    for step in range(10):
        tasks = rng.integers(10**5, size=2)
        # one group per step copies one script: random selection would waste half its anchors on it
        actions = np.concatenate([rng.permutation(16)[:4], np.full(4, rng.integers(16))])
        _step(env, anchor, step, tasks, actions, size)
    assert env.debiaser.n_seen == 10 * 4  # every anchor pair from a group with distinct scripts
    assert env.weighter.n_observed == 10 and env.weighter.n_degenerate == 0 and env.weighter.frozen
    env.close()


def test_informative_selection_needs_the_vector_wmrl_stack():
    with pytest.raises(ValueError, match="vector env"):
        build_stack(ToySeamEnv(), "wmrl", SyntheticWorldModel(), anchor_selection="informative")
    venv = gym.vector.SyncVectorEnv([lambda: ToySeamEnv()] * 2)
    with pytest.raises(ValueError, match="needs the wmrl stack"):
        build_stack(venv, "wm", SyntheticWorldModel(), anchor_selection="informative")
    with pytest.raises(ValueError, match="selection must be one of"):
        VectorAnchorWrapper(VectorWorldModelWrapper(venv, SyntheticWorldModel()), selection="smart")
    stack = build_stack(venv, "wmrl", SyntheticWorldModel(), anchor_selection="informative")
    assert stack.env.selection == "informative"
    stack.close()
