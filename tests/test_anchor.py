"""Anchors (issue 4, "Anchors" bullets): AnchorScheduler and AnchorWrapper."""

from __future__ import annotations

import json

import numpy as np
import pytest
from wrapper_toys import SyntheticWorldModel, ToySeamEnv, toy_true_score, training_steps

from wrappers import AnchorScheduler, AnchorWrapper, CalibrationWrapper, WorldModelWrapper


def stack(fraction: float, seed: int = 0, **anchor_kwargs):
    toy, wm = ToySeamEnv(n_actions=32), SyntheticWorldModel(noise=0.05)
    env = CalibrationWrapper(AnchorWrapper(WorldModelWrapper(toy, wm), fraction=fraction, seed=seed, **anchor_kwargs))
    return env, toy, wm


def run_groups(env, steps: int, groups: int, size: int, seed: int = 0):
    return training_steps(env, range(steps), groups, size, seed)


@pytest.mark.parametrize("lazy", [False, True])
def test_realized_fraction_over_500_steps_of_32_groups(lazy):
    s = AnchorScheduler(fraction=0.10, groups_per_step=32 if lazy else None)
    for step in range(500):
        gids = [(step, k) for k in range(32)]
        if lazy:
            anchors = {g for g in gids if s.assign(g)}
        else:
            anchors = s.begin_step(gids)
        assert len(anchors) >= 1  # the per-step floor
        for g in gids:
            s.release(g)
    assert s.n_groups == 16000
    assert abs(s.realized_fraction - 0.10) <= 0.01, s.realized_fraction


def test_per_step_floor():
    s = AnchorScheduler(fraction=0.10, min_per_step=2, seed=3)
    counts = [len(s.begin_step(range(4 * k, 4 * k + 4))) for k in range(200)]
    assert min(counts) == 2  # 0.1 * 4 = 0.4 expected, the floor lifts every step to 2
    assert AnchorScheduler(fraction=0.0, min_per_step=2).begin_step(range(4)) == frozenset()  # fraction 0: none at all
    assert len(AnchorScheduler(fraction=0.1, min_per_step=5).begin_step(range(3))) == 3  # floor capped by the step


def test_concurrency_cap():
    s = AnchorScheduler(fraction=0.5, max_concurrent=3, seed=1)
    first = s.begin_step(range(20))
    assert len(first) == 3 and s.open_anchors == 3
    assert s.begin_step(range(20, 40)) == frozenset()  # all slots held
    s.release(sorted(first)[0])
    assert len(s.begin_step(range(40, 60))) == 1
    # the cap wins over the floor
    assert AnchorScheduler(fraction=0.1, min_per_step=4, max_concurrent=2).begin_step(range(10)).__len__() == 2


def test_concurrency_cap_through_the_wrapper_with_interleaved_groups():
    env, toy, _ = stack(0.5, seed=2, max_concurrent=2, groups_per_step=8)
    sched = env.get_wrapper_attr("scheduler")
    rng = np.random.default_rng(0)
    open_groups: dict[str, int] = {}
    peak = 0
    for k in range(60):  # start a group every turn, finish members of older ones in between
        g = f"g{k}"
        _, info = env.reset(options={"task": k, "group_id": g, "group_size": 2})
        env.step(int(rng.integers(32)))
        open_groups[g] = 1
        peak = max(peak, sched.open_anchors)
        if k % 3 == 2:
            for old in list(open_groups)[:2]:
                env.reset(options={"task": int(old[1:]), "group_id": old, "group_size": 2})
                env.step(int(rng.integers(32)))
                del open_groups[old]
    assert 1 <= peak <= 2
    assert sched.n_anchors > 2  # slots were freed and reused


def test_deterministic_per_seed():
    def anchors(seed):
        s = AnchorScheduler(fraction=0.1, seed=seed)
        return [sorted(s.begin_step(range(32 * k, 32 * k + 32))) for k in range(50)]

    assert anchors(7) == anchors(7)
    assert anchors(7) != anchors(8)

    def wrapper_anchors(seed):
        env, _, _ = stack(0.2, seed=seed)
        return [(r["group_id"], r["anchor"]) for r in run_groups(env, 3, 8, 2)]

    assert wrapper_anchors(5) == wrapper_anchors(5)
    assert wrapper_anchors(5) != wrapper_anchors(6)


def test_fraction_zero_is_exactly_the_raw_world_model():
    env, toy, wm = stack(0.0)
    records = list(run_groups(env, 4, 16, 4))
    assert toy.n_real_grades == 0 and env.get_wrapper_attr("counters").real_executions == 0
    for r in records:
        assert r["reward"] == wm.score(r["task"], r["action"])  # exactly the raw prediction
        assert r["anchor"] is False and r["source"] == "wm" and r["anchor_weight"] == 1.0
        assert r["anchor_pairs"] == [] and r["calibrated_score"] == r["wm_score"]


def test_fraction_one_is_exactly_the_real_rewards():
    env, toy, wm = stack(1.0)
    records = list(run_groups(env, 4, 16, 4))
    assert toy.n_real_grades == len(records) == env.get_wrapper_attr("counters").real_executions
    for r in records:
        assert r["reward"] == toy_true_score(r["task"], r["action"]) == r["true_score"]
        assert r["anchor"] is True and r["source"] == "env"
        assert r["anchor_pairs"] == [(wm.score(r["task"], r["action"]), r["true_score"])]
    assert env.get_wrapper_attr("scheduler").realized_fraction == 1.0


def test_real_execution_only_for_anchor_groups_and_members_share_the_decision():
    env, toy, _ = stack(0.25, seed=4)
    records = list(run_groups(env, 5, 16, 4))
    by_group: dict[str, set] = {}
    for r in records:
        by_group.setdefault(r["group_id"], set()).add(r["anchor"])
        assert r["reset_info"]["anchor"] == r["anchor"] and r["reset_info"]["group_id"] == r["group_id"]
    assert all(len(v) == 1 for v in by_group.values())
    n_anchor_members = sum(r["anchor"] for r in records)
    assert n_anchor_members == toy.n_real_grades > 0
    results = [r["group_result"] for r in records if "group_result" in r]
    assert len(results) == len(by_group) == 80  # each group completes exactly once, on its last member
    anchor_results = [res for res in results if res["anchor"]]
    assert all(len(res["true"]) == 4 and None not in res["true"] for res in anchor_results)
    assert all(res["true"] == [None] * 4 for res in results if not res["anchor"])


def test_groups_without_ids_are_singletons_and_bad_sizes_are_rejected():
    env, _, _ = stack(0.5)
    _, info = env.reset(options={"task": 1})
    _, _, _, _, info = env.step(3)
    assert info["group_id"] == "auto-0" and info["group_result"]["group_id"] == "auto-0"
    # a member abandoned by a reset counts as finished with unknown scores
    env.reset(options={"task": 1, "group_id": "x", "group_size": 2})
    env.step(3)
    env.reset(options={"task": 1, "group_id": "x", "group_size": 2})
    _, info = env.reset(options={"task": 2, "group_id": "x", "group_size": 2})
    assert info["group_result"]["group_id"] == "x" and info["group_result"]["true"][1] is None
    assert "group_result" not in env.step(3)[4]  # "x" is a new group now
    with pytest.raises(ValueError, match="opened with group_size=2"):
        env.reset(options={"task": 1, "group_id": "x", "group_size": 3})
    with pytest.raises(ValueError, match="group_size"):
        env.reset(options={"task": 1, "group_id": "y", "group_size": 0})
    with pytest.raises(ValueError, match="fraction"):
        AnchorScheduler(fraction=1.5)
    with pytest.raises(TypeError, match="needs a WorldModelWrapper"):
        AnchorWrapper(ToySeamEnv())


def test_automatic_groups_of_consecutive_episodes():
    toy, wm = ToySeamEnv(n_actions=32), SyntheticWorldModel()
    env = AnchorWrapper(WorldModelWrapper(toy, wm), fraction=0.5, seed=0, auto_group_size=3)
    results, ids = [], []
    for k in range(7):
        _, info = env.reset(options={"task": k})  # no group_id, as in a plain SB3 loop
        ids.append(info["group_id"])
        _, _, _, _, info = env.step(k)
        results.append(info.get("group_result"))
    assert ids == ["auto-0"] * 3 + ["auto-1"] * 3 + ["auto-2"]
    assert [r is not None for r in results] == [False, False, True, False, False, True, False]
    assert len(results[2]["calibrated"]) == 3 and results[5]["group_id"] == "auto-1"
    with pytest.raises(ValueError, match="auto_group_size"):
        AnchorWrapper(WorldModelWrapper(toy, wm), auto_group_size=0)


def test_unscheduled_automatic_groups_leave_the_trainers_fraction_alone():
    env, toy, _ = stack(0.25, seed=3, anchor_auto_groups=False)
    sched = env.get_wrapper_attr("scheduler")
    for step in range(40):
        for k in range(3):  # filler episodes without a group id, between the trainer's steps
            _, info = env.reset(options={"task": k})
            assert info["anchor"] is False
            env.step(k)
        list(training_steps(env, [step], groups=8, size=2))
    assert toy.n_real_grades == 2 * sched.n_anchors  # only the trainer's anchor groups ran for real
    assert sched.n_groups == 40 * 8 and sched.realized_fraction == pytest.approx(0.25, abs=0.01)


def test_scheduler_state_round_trips_through_json():
    s = AnchorScheduler(fraction=0.3, max_concurrent=5, seed=11, groups_per_step=4)
    for k in range(9):
        s.assign(f"g{k}")
    again = AnchorScheduler(fraction=0.3, max_concurrent=5, seed=11, groups_per_step=4)
    again.load_state_dict(json.loads(json.dumps(s.state_dict())))
    assert [again.assign(f"h{k}") for k in range(40)] == [s.assign(f"h{k}") for k in range(40)]
    assert again.state_dict() == s.state_dict()
    with pytest.raises(ValueError, match="config mismatch"):
        AnchorScheduler(fraction=0.3).load_state_dict(s.state_dict())
