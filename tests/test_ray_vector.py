"""RayVectorEnv on a real local Ray instance: the SyncVectorEnv API and autoreset semantics,
the WMRL vector wrappers unchanged on top (one world-model call per vector step), the
AutoResearch env in actors, and a lost actor reported cleanly."""

from __future__ import annotations

import json

import gymnasium as gym
import numpy as np
import pytest
import wrapper_toys
from gymnasium.vector import AutoresetMode
from ray_helpers import ray_instance  # noqa: F401
from test_wrappers import without_timings
from wrapper_toys import SyntheticWorldModel, ToySeamEnv

from wmrl_envs.ray_vector import RayVectorEnv, SubEnvLost
from wmrl_envs.vector import make_vector_env
from wrappers import VectorAnchorWrapper, VectorCalibrationWrapper, VectorWorldModelWrapper, stack_state_dict


@pytest.fixture(scope="module")
def toys_by_value(ray_instance):  # noqa: F811
    """Ship the tests' toy env to the actors by value (the workers cannot import tests/)."""
    ray_instance.cloudpickle.register_pickle_by_value(wrapper_toys)
    yield
    ray_instance.cloudpickle.unregister_pickle_by_value(wrapper_toys)


def _toy(max_turns: int):
    return lambda: ToySeamEnv(max_turns=max_turns)


def _stack(venv):
    inner = VectorAnchorWrapper(VectorWorldModelWrapper(venv, SyntheticWorldModel(noise=0.05)), fraction=0.5, seed=1)
    return VectorCalibrationWrapper(inner, start_pairs=8, refit_every=4, freeze_after=2)


@pytest.mark.parametrize("mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP])
def test_wmrl_stack_on_ray_actors_matches_sync_vector_env(toys_by_value, mode):
    fns = [_toy(2)] * 4
    sync = _stack(gym.vector.SyncVectorEnv(fns, autoreset_mode=mode))
    ray_env = _stack(RayVectorEnv(fns, autoreset_mode=mode, num_cpus=0.25))
    outs = {}
    for name, env in (("sync", sync), ("ray", ray_env)):
        rng = np.random.default_rng(0)
        log = []
        obs, infos = env.reset(seed=3, options={"task": 7})
        log.append((obs.tolist(), sorted(infos)))
        for step in range(12):
            if step % 4 == 0:
                env.env.begin_step([f"s{step}"])
                obs, infos = env.reset(options={"task": step, "group_id": f"s{step}", "reset_mask": np.ones(4, bool)})
            obs, rewards, term, trunc, infos = env.step(rng.integers(16, size=4))
            log.append((obs.tolist(), rewards.tolist(), term.tolist(), trunc.tolist(), json.dumps(infos, default=str)))
        outs[name] = (log, without_timings(stack_state_dict(env)))
    assert outs["ray"][1] == outs["sync"][1]  # anchors, pairs, map, weight, counters
    assert [entry[:4] for entry in outs["ray"][0]] == [entry[:4] for entry in outs["sync"][0]]
    # at most one batched world-model call per vector step, exactly as on a SyncVectorEnv
    wm, wm_sync = ray_env.env.env.world_model, sync.env.env.world_model
    assert wm.batch_sizes == wm_sync.batch_sizes and 0 < len(wm.batch_sizes) <= 12
    sync.close()
    ray_env.close()


def test_autoresearch_env_in_actors(ray_instance):  # noqa: F811
    env = make_vector_env(
        "wmrl/AutoResearch-v0", 2, vectorization="ray", ray_options={"num_cpus": 0.25}, split="train", max_turns=2
    )
    ref = gym.vector.SyncVectorEnv(
        [lambda: gym.make("wmrl/AutoResearch-v0", split="train", max_turns=2)] * 2,
        autoreset_mode=AutoresetMode.SAME_STEP,
    )
    try:
        for venv in (env, ref):
            obs, info = venv.reset(seed=0, options={"task": "penguins"})
            assert "penguins" in obs[0] and list(info["task_id"]) == ["penguins", "penguins"]
        actions = np.array(["REQUEST_INFO: columns", "no code here"], dtype=object)
        got, want = env.step(actions), ref.step(actions)
        assert list(got[0]) == list(want[0]) and got[1].tolist() == want[1].tolist()
        assert env.call("run_limits") == ref.call("run_limits")
        env.set_attr("pending_action", ["x", None])
        assert env.get_attr("pending_action") == ("x", None)
    finally:
        env.close()
        ref.close()


def test_lost_actor_is_reported_by_sub_env(ray_instance):  # noqa: F811
    env = make_vector_env(
        "wmrl/AutoResearch-v0", 2, vectorization="ray", ray_options={"num_cpus": 0.25}, split="train", max_turns=1
    )
    env.reset(seed=0, options={"task": "penguins"})
    ray_instance.kill(env.actors[1])
    with pytest.raises(SubEnvLost, match="sub-env 1's Ray actor died"):
        env.step(np.array(["a", "b"], dtype=object))
    env.close()
