"""Asynchronous anchors (AnchorWrapper(overlap=True)): real gradings run in the background,
land by the step boundary, and leave the calibration state exactly as the synchronous
stack's; pairs are never lost (state_dict waits); rewards are handed back for the update."""

from __future__ import annotations

import json
import threading
import time

import numpy as np
import pytest
from test_wrappers import make_vector, without_timings
from wrapper_toys import SyntheticWorldModel, ToySeamEnv, toy_true_score, training_steps

from agents.llm.rollout import Episode, Rollout
from wrappers import (
    AnchorWrapper,
    CalibrationWrapper,
    VectorAnchorWrapper,
    VectorCalibrationWrapper,
    VectorWorldModelWrapper,
    WorldModelWrapper,
    stack_state_dict,
)
from wrappers.anchor_overlap import BackgroundGrader

CONFIG = dict(start_pairs=16, refit_every=8, freeze_after=3)


class SlowToy(ToySeamEnv):
    """A toy env whose real grading takes ``delay`` seconds (a sandbox run, in miniature)."""

    def __init__(self, delay: float = 0.0, **kwargs) -> None:
        super().__init__(**kwargs)
        self.delay = delay
        self.threads: set[str] = set()

    def grade(self, request):
        self.threads.add(threading.current_thread().name)
        time.sleep(self.delay)
        return super().grade(request)


def single_stack(overlap: bool, delay: float = 0.0, max_turns: int = 1):
    toy = SlowToy(delay, n_actions=32, max_turns=max_turns)
    anchor = AnchorWrapper(
        WorldModelWrapper(toy, SyntheticWorldModel(noise=0.05)), fraction=0.3, seed=4, overlap=overlap
    )
    return CalibrationWrapper(anchor, **CONFIG), toy


def test_overlap_reaches_the_synchronous_state_and_rewards():
    sync, sync_toy = single_stack(False)
    over, over_toy = single_stack(True, delay=0.002)
    sync_records = list(training_steps(sync, range(30), groups=3, size=3, seed=1))
    over_records = list(training_steps(over, range(30), groups=3, size=3, seed=1))
    landed = over.get_wrapper_attr("collect")(wait=True)
    # the same anchors, pairs (in the same order), map, weight and real-execution count
    s_state, o_state = without_timings(stack_state_dict(sync)), without_timings(stack_state_dict(over))
    assert sync.debiaser.n_fits >= 2 and sync.weighter.n_observed > 0  # a working stack is compared
    assert o_state == s_state
    assert over_toy.n_real_grades == sync_toy.n_real_grades > 0
    assert over_toy.threads and all(t.startswith("wmrl-anchor") for t in over_toy.threads)
    # rewards: non-anchors identical at step time; anchors' real rewards come back by ticket
    by_ticket = {r["ticket"]: r for r in landed}
    assert len(by_ticket) == sum(r["anchor"] for r in over_records)
    for s, o in zip(sync_records, over_records):
        assert (s["group_id"], s["anchor"], s["action"]) == (o["group_id"], o["anchor"], o["action"])
        if not o["anchor"]:
            assert o["reward"] == s["reward"] and o["source"] == s["source"] == "wm"
            continue
        assert o["source"] == "wm" and o["anchor_pairs"] == []  # graded by the WM at step time ...
        record = by_ticket[o["anchor_ticket"]]  # ... for real in the background
        assert record["reward"] == s["reward"] == toy_true_score(o["task"], o["action"]) == record["true"]


def test_anchor_steps_return_before_their_real_grading_and_begin_step_waits():
    env, toy = single_stack(True, delay=0.3)
    anchor = env.get_wrapper_attr("begin_step")
    anchor(["g"])
    env.reset(options={"task": 1, "group_id": "g", "group_size": 2})
    layer = env.env
    assert layer.overlap and toy.n_real_grades == 0
    t0 = time.perf_counter()
    _, _, _, _, info = env.step(3)
    assert time.perf_counter() - t0 < 0.25  # did not wait for the 0.3 s real grading
    if info["anchor"]:
        assert layer._background.in_flight == 1
    env.reset(options={"task": 1, "group_id": "g", "group_size": 2})
    env.step(5)
    anchor(["h"])  # the step boundary: everything in flight lands first
    assert layer._background.in_flight == 0


@pytest.mark.parametrize("fraction", [1.0])
def test_state_dict_never_loses_a_pair_in_flight(fraction):
    toy = SlowToy(0.2, n_actions=32)
    anchor = AnchorWrapper(WorldModelWrapper(toy, SyntheticWorldModel()), fraction=fraction, overlap=True)
    env = CalibrationWrapper(anchor, **CONFIG)
    anchor.begin_step(["g"])
    for action in (1, 2):
        env.reset(options={"task": 5, "group_id": "g", "group_size": 2})
        env.step(action)
    assert anchor._background.in_flight == 2 and env.debiaser.n_seen == 0
    state = json.loads(json.dumps(stack_state_dict(env)))
    assert state["calibration"]["debiaser"]["n_seen"] == 2 == env.debiaser.n_seen
    assert state["world_model"]["counters"]["real_executions"] == 2
    assert [r["ticket"] for r in anchor.collect()] == [0, 1]  # the member records are still handed out
    env.close()


def test_vector_overlap_matches_the_synchronous_vector_stack():
    def vstack(overlap: bool):
        venv = make_vector("sync", 4, max_turns=1)
        inner = VectorAnchorWrapper(
            VectorWorldModelWrapper(venv, SyntheticWorldModel(noise=0.05)), fraction=0.4, seed=2, overlap=overlap
        )
        return VectorCalibrationWrapper(inner, **CONFIG)

    sync, over = vstack(False), vstack(True)
    for env in (sync, over):
        env.reset(options={"task": 0})  # a vector env's first reset covers every sub-env
    rng = np.random.default_rng(3)
    rewards = {False: [], True: []}
    for step in range(25):
        gids = [f"s{step}a", f"s{step}b"]
        tasks = rng.integers(10**6, size=2).tolist()
        actions = rng.integers(16, size=4)
        for env, key in ((sync, False), (over, True)):
            env.env.begin_step(gids)
            for k, g in enumerate(gids):
                env.reset(options={"task": tasks[k], "group_id": g, "reset_mask": (np.arange(4) // 2) == k})
            _, r, _, _, infos = env.step(actions)  # next-step autoreset: this step's keys are in infos
            rewards[key].append((list(r), list(infos["anchor"]), list(infos.get("anchor_ticket", [-1] * 4))))
    over.env.collect(wait=True)
    s_state, o_state = without_timings(stack_state_dict(sync)), without_timings(stack_state_dict(over))
    assert sync.debiaser.n_fits >= 1
    assert o_state == s_state
    for (rs, anchors, _), (ro, anchors_o, _) in zip(rewards[False], rewards[True]):
        assert anchors == anchors_o
        for i, a in enumerate(anchors):
            if not a:
                assert rs[i] == ro[i]


def test_overlap_needs_a_reachable_grader():
    venv = make_vector("async", 2, max_turns=1)  # sub-envs in other processes
    try:
        with pytest.raises(ValueError, match="needs grader="):
            VectorAnchorWrapper(VectorWorldModelWrapper(venv, SyntheticWorldModel()), overlap=True)
    finally:
        venv.close()
    with pytest.raises(ValueError, match="overlap_workers"):
        BackgroundGrader(lambda r: r, max_workers=0)


def test_rollout_hands_landed_rewards_to_anchor_episodes():
    episodes = [
        Episode(0, "t", "g", None, [], final_info={"anchor_ticket": 4}, reward=0.3, source="wm", anchor=True),  # type: ignore[arg-type]
        Episode(0, "t", "h", None, [], final_info={}, reward=0.6, source="wm"),  # type: ignore[arg-type]
    ]
    result = {"group_id": "g", "anchor": True, "calibrated": [0.3], "true": [0.9]}
    n = Rollout.land_anchor_rewards(
        episodes, [{"ticket": 4, "graded": 1, "reward": 0.9, "true": 0.9, "group_result": result}]
    )
    assert n == 1
    assert (episodes[0].reward, episodes[0].source, episodes[0].final_info["group_result"]) == (0.9, "env", result)
    assert (episodes[1].reward, episodes[1].source) == (0.6, "wm")
