"""WorldModelWrapper modes and counters, the vector forms (Sync / Async), and resuming a
killed run from saved wrapper state (issue 4)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode
from wrapper_toys import SyntheticWorldModel, ToySeamEnv, toy_true_score, training_steps

from wmrl_envs.vector import sub_info
from wrappers import (
    AnchorWrapper,
    CalibrationWrapper,
    VectorAnchorWrapper,
    VectorCalibrationWrapper,
    VectorWorldModelWrapper,
    WorldModelWrapper,
    load_stack_state_dict,
    stack_state_dict,
)

TESTS = Path(__file__).parent


# -- single env ------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["wm", "both", "env"])
def test_modes_grade_with_the_right_source(mode):
    toy, wm = ToySeamEnv(max_turns=2), SyntheticWorldModel(noise=0.05)
    env = WorldModelWrapper(toy, wm, mode=mode)
    env.reset(options={"task": 42})
    _, reward, terminated, _, info = env.step(5)
    true, pred = toy_true_score(42, 5), wm.score(42, 5, turn=0)
    assert reward == (pred if mode == "wm" else true)
    assert info["source"] == ("wm" if mode == "wm" else "env")
    assert info.get("wm_score") == (None if mode == "env" else pred) == info.get("calibrated_score")
    assert info.get("true_score") == (None if mode == "wm" else true)
    assert info.get("outcome").source == ("wm" if mode == "wm" else "env")  # what the env applied
    assert not terminated and info["turn"] == 1
    real = 0 if mode == "wm" else 1
    assert toy.n_real_grades == real == env.counters.real_executions == info["real_executions"]
    assert (env.counters.real_seconds > 0) == bool(real) and (info["real_seconds"] > 0) == bool(real)
    assert env.counters.wm_predictions == (0 if mode == "env" else 1) == len(wm.batch_sizes)
    _, _, terminated, _, info = env.step(6)  # the second turn sees the turn index in its context
    assert terminated and (mode == "env" or info.get("wm_score") == wm.score(42, 6, turn=1))


def test_unknown_world_model_outcome_stays_unknown():
    toy, wm = ToySeamEnv(), SyntheticWorldModel(unknown_every=1)  # the model can never say
    env = WorldModelWrapper(toy, wm)
    env.reset(options={"task": 3})
    _, reward, _, _, info = env.step(1)
    assert info.get("wm_score") is None and info.get("calibrated_score") is None and info.get("outcome") is None
    assert info.get("trajectory_reward") is None and reward == 0.0  # the env gives no score, not a 0 score
    assert env.counters.wm_unknown == 1 and toy.n_real_grades == 0


def test_score_transform_acts_before_the_env_sees_the_outcome():
    toy, wm = ToySeamEnv(), SyntheticWorldModel()
    env = WorldModelWrapper(toy, wm)
    env.score_transform = lambda scores: [None if s is None else s / 2 for s in scores]
    env.reset(options={"task": 9})
    _, reward, _, _, info = env.step(2)
    assert reward == info.get("calibrated_score") == wm.score(9, 2) / 2 == info.get("outcome").score
    assert info.get("wm_score") == wm.score(9, 2) == info.get("wm_outcome").score


def test_bad_construction_is_rejected_clearly():
    with pytest.raises(ValueError, match="mode must be one of"):
        WorldModelWrapper(ToySeamEnv(), SyntheticWorldModel(), mode="real")
    with pytest.raises(TypeError, match="needs an OutcomeSeam env"):
        WorldModelWrapper(gym.make("CartPole-v1"), SyntheticWorldModel())
    with pytest.raises(TypeError, match="predict"):
        WorldModelWrapper(ToySeamEnv(), object())
    with pytest.raises(TypeError, match="needs a AnchorWrapper"):
        CalibrationWrapper(WorldModelWrapper(ToySeamEnv(), SyntheticWorldModel()))
    with pytest.raises(TypeError, match="unknown CalibrationWrapper settings"):
        CalibrationWrapper(AnchorWrapper(WorldModelWrapper(ToySeamEnv(), SyntheticWorldModel())), start_pair=3)


# -- vector forms ----------------------------------------------------------------------


def make_vector(kind: str, n: int, max_turns: int, autoreset: AutoresetMode = AutoresetMode.NEXT_STEP):
    fns = [lambda: ToySeamEnv(max_turns=max_turns)] * n
    if kind == "sync":
        return gym.vector.SyncVectorEnv(fns, autoreset_mode=autoreset)
    return gym.vector.AsyncVectorEnv(fns, shared_memory=False, autoreset_mode=autoreset)


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_vector_stack_batches_the_world_model_and_grades_anchors_for_real(kind):
    wm = SyntheticWorldModel(noise=0.05)
    venv = VectorCalibrationWrapper(
        VectorAnchorWrapper(VectorWorldModelWrapper(make_vector(kind, 8, max_turns=3), wm), fraction=0.5, seed=0)
    )
    try:
        venv.reset(options={"task": 1})  # gymnasium: the first reset covers every sub-env
        anchors = venv.env.begin_step(["A", "B"])
        assert len(anchors) == 1
        halves = {"A": np.arange(8) < 4, "B": np.arange(8) >= 4}
        for g, mask in halves.items():
            _, infos = venv.reset(options={"task": 100 if g == "A" else 200, "group_id": g, "reset_mask": mask})
            assert list(infos["group_id"][mask]) == [g] * 4
        is_anchor = halves[next(iter(anchors))]
        tasks = np.where(halves["A"], 100, 200)
        best = np.zeros(8)
        for turn in range(3):
            actions = np.arange(8) + turn
            _, rewards, terminated, _, infos = venv.step(actions)
            for i in range(8):
                true = toy_true_score(tasks[i], actions[i])
                pred = wm.score(tasks[i], actions[i], turn)
                score = true if is_anchor[i] else pred
                assert rewards[i] == pytest.approx(max(best[i], score) - best[i])
                best[i] = max(best[i], score)
                assert infos["wm_score"][i] == pred and infos["anchor"][i] == is_anchor[i]
                assert sub_info(infos, i).get("true_score") == (true if is_anchor[i] else None)  # unknown: left out
                assert infos["anchor_pairs"][i] == ([(pred, true)] if is_anchor[i] else [])
        assert terminated.all()
        assert wm.batch_sizes == [8, 8, 8]  # one batched call per vector step
        assert sum(venv.unwrapped.get_attr("n_real_grades")) == 4 * 3 == venv.env.env.counters.real_executions
        results = [r for r, ok in zip(infos["group_result"], infos["_group_result"]) if ok]
        assert sorted(r["group_id"] for r in results) == ["A", "B"]
        assert all(r["true"] == [pytest.approx(b) for b in best[is_anchor]] for r in results if r["anchor"])
        assert venv.debiaser.n_seen == 12
        # next step: every sub-env autoresets (next-step mode): no world-model call, singleton groups
        _, _, _, _, infos = venv.step(np.zeros(8, dtype=int))
        assert wm.batch_sizes == [8, 8, 8]
        assert all(str(g).startswith("auto-") for g in infos["group_id"])
    finally:
        venv.close()


def test_vector_same_step_autoreset_puts_step_keys_in_final_info():
    wm = SyntheticWorldModel()
    venv = VectorAnchorWrapper(
        VectorWorldModelWrapper(make_vector("sync", 3, max_turns=1, autoreset=AutoresetMode.SAME_STEP), wm),
        fraction=1.0,
    )
    venv.reset(options={"task": 7, "group_id": "g"})
    _, rewards, terminated, _, infos = venv.step(np.array([0, 1, 2]))
    assert terminated.all() and list(rewards) == [toy_true_score(7, a) for a in range(3)]
    final = infos["final_info"]
    assert list(final["true_score"]) == list(rewards) and final["group_result"][2]["group_id"] == "g"
    assert all(str(g).startswith("auto-") for g in infos["group_id"])  # the new episodes
    _, _, _, _, infos = venv.step(np.array([0, 1, 2]))  # same-step mode: every sub-env really steps
    assert wm.batch_sizes == [3, 3]


def test_vector_calibration_engages_and_maps_every_world_model_reward():
    wm = SyntheticWorldModel(noise=0.01)
    venv = VectorCalibrationWrapper(
        VectorAnchorWrapper(VectorWorldModelWrapper(make_vector("sync", 8, max_turns=1), wm), fraction=0.5, seed=3),
        start_pairs=40,
        refit_every=16,
        freeze_after=4,
    )
    rng = np.random.default_rng(0)
    venv.reset(options={"task": 1})
    for step in range(40):
        gids = [f"s{step}a", f"s{step}b"]
        venv.env.begin_step(gids)
        for k, g in enumerate(gids):
            mask = (np.arange(8) // 4) == k
            venv.reset(options={"task": int(rng.integers(10**6)), "group_id": g, "reset_mask": mask})
        _, rewards, _, _, infos = venv.step(rng.permutation(16)[:8])
    assert venv.debiaser.fitted and venv.weighter.frozen
    wm_only = ~infos["anchor"]
    assert wm_only.any()
    expected = venv.debiaser.transform(list(infos["wm_score"][wm_only]))
    assert list(rewards[wm_only]) == expected == list(infos["calibrated_score"][wm_only])
    assert (infos["anchor_weight"] == venv.anchor_weight).all()


def test_vector_and_single_forms_reach_the_same_state():
    """Same groups, tasks and actions through both forms: same anchors, pairs, map and weight
    (the state machines are shared; only the plumbing differs). The map refits only at
    ``begin_step``, so although the single env grades the members of a step one after the
    other and the vector form in one batch, every member is calibrated by the same map."""
    config = dict(start_pairs=24, refit_every=8, freeze_after=3)
    single = CalibrationWrapper(
        AnchorWrapper(WorldModelWrapper(ToySeamEnv(), SyntheticWorldModel(noise=0.05)), fraction=0.3, seed=4), **config
    )
    venv = VectorCalibrationWrapper(
        VectorAnchorWrapper(
            VectorWorldModelWrapper(make_vector("sync", 4, max_turns=1), SyntheticWorldModel(noise=0.05)),
            fraction=0.3,
            seed=4,
        ),
        **config,
    )
    venv.reset(options={"task": 0})  # four singleton groups, mirrored in the single env:
    for _ in range(4):
        single.reset(options={"task": 0})
    rng = np.random.default_rng(6)
    for step in range(40):
        gids = [f"s{step}a", f"s{step}b"]
        tasks = rng.integers(10**6, size=2).tolist()
        actions = rng.integers(16, size=4)
        assert single.env.begin_step(gids) == venv.env.begin_step(gids)
        for k, g in enumerate(gids):
            venv.reset(options={"task": tasks[k], "group_id": g, "reset_mask": (np.arange(4) // 2) == k})
            for m in range(2):
                single.reset(options={"task": tasks[k], "group_id": g, "group_size": 2})
                single.step(int(actions[2 * k + m]))
        venv.step(actions)
    s_state, v_state = without_timings(stack_state_dict(single)), without_timings(stack_state_dict(venv))
    assert single.debiaser.n_fits >= 3 and single.weighter.frozen  # the comparison covers a working stack
    assert v_state["calibration"] == s_state["calibration"]  # pairs, map, EMA, frozen scale: identical
    assert v_state["anchor"]["scheduler"] == s_state["anchor"]["scheduler"]
    assert venv.weighter.n_observed == single.weighter.n_observed and venv.weighter.frozen
    assert venv.anchor_weight == single.anchor_weight != 1.0


def test_vector_groups_cannot_exceed_their_size():
    venv = VectorAnchorWrapper(VectorWorldModelWrapper(make_vector("sync", 2, max_turns=1), SyntheticWorldModel()))
    with pytest.raises(ValueError, match="already has its 1 members"):
        venv.reset(options={"task": 1, "group_id": "g", "group_size": 1})


# -- killed and resumed ----------------------------------------------------------------

RESUME_CONFIG = dict(start_pairs=60, refit_every=16, freeze_after=6)


def resume_stack():
    """The stack of the resume test (also built by the killed child process)."""
    wm = SyntheticWorldModel(noise=0.03)
    anchor = AnchorWrapper(WorldModelWrapper(ToySeamEnv(n_actions=32), wm), fraction=0.2, seed=9)
    return CalibrationWrapper(anchor, **RESUME_CONFIG)


def without_timings(state):
    """A stack state minus wall-clock timings (which differ between two identical runs)."""
    state = json.loads(json.dumps(state))
    state["world_model"]["counters"] = {k: v for k, v in state["world_model"]["counters"].items() if "seconds" not in k}
    return state


def summarize(records):
    return [
        (r["group_id"], r["anchor"], r["reward"], r["anchor_weight"], r["anchor_pairs"], r["calibrated_score"])
        for r in records
    ]


_CHILD = """
import json, os, signal, sys
sys.path.insert(0, {tests!r})
from test_wrappers import resume_stack
from wrapper_toys import training_steps
from wrappers import stack_state_dict
env = resume_stack()
for _ in training_steps(env, range(12), groups=16, size=4, seed=1):
    pass
with open({path!r}, "w") as f:
    json.dump(stack_state_dict(env), f)
os.kill(os.getpid(), signal.SIGKILL)  # die without any cleanup
"""


def test_killed_and_resumed_run_continues_with_same_pairs_map_and_weight(tmp_path):
    state_file = tmp_path / "wrappers.json"
    child = subprocess.run([sys.executable, "-c", _CHILD.format(tests=str(TESTS), path=str(state_file))], timeout=120)
    assert child.returncode == -signal.SIGKILL

    reference = resume_stack()  # the same run, never interrupted
    list(training_steps(reference, range(12), groups=16, size=4, seed=1))
    saved = json.loads(state_file.read_text())
    assert without_timings(saved) == without_timings(stack_state_dict(reference))
    assert reference.debiaser.fitted and reference.weighter.frozen and reference.anchor_weight != 1.0

    resumed = resume_stack()
    load_stack_state_dict(resumed, saved)
    assert resumed.debiaser.pairs == reference.debiaser.pairs
    assert resumed.anchor_weight == reference.anchor_weight
    probe = np.linspace(0, 1, 101).tolist()
    assert resumed.debiaser.transform(probe) == reference.debiaser.transform(probe)

    after_ref = summarize(training_steps(reference, range(12, 24), groups=16, size=4, seed=1))
    after_res = summarize(training_steps(resumed, range(12, 24), groups=16, size=4, seed=1))
    assert after_res == after_ref
    assert without_timings(stack_state_dict(resumed)) == without_timings(stack_state_dict(reference))
    assert reference.debiaser.n_fits > saved["calibration"]["debiaser"]["n_fits"]  # it kept refitting

    fresh = summarize(training_steps(resume_stack(), range(12, 24), groups=16, size=4, seed=1))
    assert fresh != after_ref  # without the saved state the run would differ

    with pytest.raises(ValueError, match="config mismatch"):
        other = CalibrationWrapper(AnchorWrapper(WorldModelWrapper(ToySeamEnv(), SyntheticWorldModel()), seed=9))
        load_stack_state_dict(other, saved)


# -- step boundaries and env.spec --------------------------------------------------------


def test_map_refits_only_at_step_boundaries_so_a_group_sees_one_map():
    """A refit due in the middle of a step waits for the next ``begin_step``: every member of
    every group of a step is calibrated by the map in force when the step began."""
    env = CalibrationWrapper(
        AnchorWrapper(
            WorldModelWrapper(ToySeamEnv(n_actions=64), SyntheticWorldModel(noise=0.05)), fraction=0.5, seed=2
        ),
        start_pairs=6,
        refit_every=2,
    )
    by_step: dict[int, list[dict]] = {}
    for record in training_steps(env, range(6), groups=4, size=4, seed=8):
        step = int(record["group_id"][1 : record["group_id"].index("g")])
        record["n_fits"] = env.debiaser.n_fits
        by_step.setdefault(step, []).append(record)
    fits = [{r["n_fits"] for r in records} for records in by_step.values()]
    assert all(len(f) == 1 for f in fits), fits  # never refitted inside a step (old code: after 6 pairs, every 2)
    assert [f.pop() for f in fits] == [0, 1, 2, 3, 4, 5]  # ... and at every begin_step, pairs being due
    assert env.debiaser.n_seen >= 6 * 2 * 4 * 0.5


def test_loops_without_begin_step_refit_once_no_graded_group_is_open():
    """A plain loop (no ``begin_step``): the map refits between episodes of automatic groups,
    and only after a whole explicit group has finished."""
    env = CalibrationWrapper(
        AnchorWrapper(
            WorldModelWrapper(ToySeamEnv(n_actions=64), SyntheticWorldModel(noise=0.05)), fraction=1.0, seed=2
        ),
        start_pairs=3,
        refit_every=1,
    )
    for k in range(3):  # automatic singleton groups, all anchors: one pair per episode
        env.reset(options={"task": k})
        env.step(k)
    assert env.debiaser.n_fits == 1  # fitted after the third episode, before the next reset
    fits = []
    for m in range(4):  # one explicit group of 4: no refit until its last member finished
        env.reset(options={"task": 9, "group_id": "g", "group_size": 4})
        env.step(m)
        fits.append(env.debiaser.n_fits)
    assert fits == [1, 1, 1, 2]


def test_env_spec_rebuilds_the_stack_sharing_the_world_model():
    gym.register("wmrl-test/ToySeam-v0", entry_point=ToySeamEnv, disable_env_checker=True, order_enforce=False)
    try:
        wm = SyntheticWorldModel(noise=0.05)
        env = gym.make("wmrl-test/ToySeam-v0", n_actions=8)
        stack = CalibrationWrapper(
            AnchorWrapper(WorldModelWrapper(env, wm, mode="both"), fraction=0.3, seed=5), denoise=False
        )
        names = [w.name for w in stack.spec.additional_wrappers]
        assert names == ["WorldModelWrapper", "AnchorWrapper", "CalibrationWrapper"]
        assert stack.spec.additional_wrappers[1].kwargs["fraction"] == 0.3
        rebuilt = gym.make(stack.spec)
        assert isinstance(rebuilt, CalibrationWrapper) and rebuilt.calibrator.config == stack.calibrator.config
        anchor, layer = rebuilt.env, rebuilt.env.env
        assert isinstance(anchor, AnchorWrapper) and anchor.scheduler.fraction == 0.3 and anchor.scheduler.seed == 5
        assert (
            isinstance(layer, WorldModelWrapper) and layer.mode == "both" and layer.world_model is wm
        )  # shared, not copied
        assert rebuilt.unwrapped.n_actions == 8
        venv = VectorAnchorWrapper(VectorWorldModelWrapper(make_vector("sync", 2, max_turns=1), wm), fraction=0.5)
        assert venv._saved_kwargs["fraction"] == 0.5 and venv.env._saved_kwargs["world_model"] is wm
    finally:
        gym.registry.pop("wmrl-test/ToySeam-v0", None)
