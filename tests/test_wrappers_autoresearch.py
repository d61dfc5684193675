"""The wrapper stack on the real AutoResearch env (sandbox execution, CodeOutcomeModel), single
and vector, and inside a stable-baselines3 PPO training loop (issue 4).

The world model is a :class:`CodeOutcomeModel` fitted on real sandbox executions of a few
of the task's pool solutions (a miniature of the leaderboard logs). Real executions are
real: the only reuse is the SB3 env variant's cache of executions by code hash.
"""

from __future__ import annotations

import hashlib
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode

from wmrl_envs.autoresearch.env import AutoResearchEnv
from wmrl_envs.autoresearch.leaderboard import reference_pool
from wmrl_envs.outcome import Outcome
from wmrl_envs.seam import GradingRequest, OutcomeSeam
from wmrl_envs.world_models import CodeOutcomeConfig, CodeOutcomeModel, LogRecord
from wrappers import (
    AnchorWrapper,
    CalibrationWrapper,
    VectorAnchorWrapper,
    VectorCalibrationWrapper,
    VectorWorldModelWrapper,
    WorldModelWrapper,
)

TASK = "titanic"
CANDIDATES = ("majority", "tree_depth_2", "broken_no_submission")


def fence(code: str) -> str:
    return f"```python\n{code}\n```"


@pytest.fixture(scope="module")
def pool_runs() -> dict[str, tuple[str, Outcome, LogRecord]]:
    """solution id -> (script, real outcome, log record), each executed once in the sandbox."""
    scripts = {s.solution_id: s.code for s in reference_pool(TASK, size="small")}
    env = AutoResearchEnv(TASK, max_turns=1)
    runs = {}
    for sid in CANDIDATES:
        env.reset(options={"task": TASK})
        request = env.grading_request(fence(scripts[sid]))
        outcome = env.grade(request)
        assert outcome is not None, f"the sandbox failed on {sid}"
        record = LogRecord(TASK, request.action, request.context, outcome, solution_id=sid, origin="leaderboard-pool")
        runs[sid] = (scripts[sid], outcome, record)
    assert {o.status for _, o, _ in runs.values()} >= {"valid", "no_submission"}
    return runs


@pytest.fixture(scope="module")
def world_model(pool_runs) -> CodeOutcomeModel:
    config = CodeOutcomeConfig(min_samples_leaf=1, max_iter=30)
    return CodeOutcomeModel(config).fit([record for _, _, record in pool_runs.values()])


def test_stack_on_the_autoresearch_env(pool_runs, world_model):
    env = CalibrationWrapper(
        AnchorWrapper(WorldModelWrapper(AutoResearchEnv(TASK, max_turns=2), world_model), fraction=0.5, seed=0)
    )
    anchors = env.get_wrapper_attr("begin_step")(["a", "b"])
    assert len(anchors) == 1
    sids = ["majority", "tree_depth_2"]
    for g in ("a", "b"):
        for sid in sids:
            _, info = env.reset(options={"task": TASK, "group_id": g, "group_size": 2})
            assert info["anchor"] == (g in anchors) and info["task_id"] == TASK
            _, reward, _, _, info = env.step("REQUEST_INFO: metric")  # free: nothing graded
            assert "source" not in info and "wm_score" not in info and reward == 0.0
            _, reward, terminated, _, info = env.step(fence(pool_runs[sid][0]))
            assert terminated and info["graded"]
            assert info.get("wm_outcome").source == "wm" and 0.0 <= info.get("wm_score") <= 1.0
            if g in anchors:  # graded for real in the sandbox; reward from the real outcome
                assert info["source"] == "env" and info.get("outcome").source == "env"
                assert reward == info.get("true_score") == info.get("trajectory_reward")
                assert info.get("true_score") == pytest.approx(pool_runs[sid][1].score, abs=0.2)
                assert info["anchor_pairs"] == [(info.get("wm_score"), info.get("true_score"))]
            else:
                assert info["source"] == "wm" and info.get("true_score") is None
                assert reward == info.get("calibrated_score") == info.get("wm_score")  # identity before the first fit
    counters = env.get_wrapper_attr("counters")
    assert counters.real_executions == 2 and counters.real_seconds > 0.1
    assert counters.wm_predictions == 4 and env.debiaser.n_seen == 2
    assert "group_result" in info and info["group_result"]["group_id"] == "b"


def test_vector_stack_on_the_autoresearch_env(pool_runs, world_model):
    venv = gym.vector.SyncVectorEnv(
        [lambda: AutoResearchEnv(TASK, max_turns=1)] * 4, autoreset_mode=AutoresetMode.SAME_STEP
    )
    venv = VectorCalibrationWrapper(
        VectorAnchorWrapper(VectorWorldModelWrapper(venv, world_model), fraction=0.5, seed=0)
    )
    venv.reset(options={"task": TASK})
    anchors = venv.env.begin_step(["a", "b"])
    halves = {"a": np.arange(4) < 2, "b": np.arange(4) >= 2}
    for g, mask in halves.items():
        venv.reset(options={"task": TASK, "group_id": g, "reset_mask": mask})
    sids = ["majority", "tree_depth_2", "majority", "tree_depth_2"]
    _, rewards, terminated, _, infos = venv.step(tuple(fence(pool_runs[s][0]) for s in sids))
    assert terminated.all()
    final = infos["final_info"]  # same-step autoreset: the step's keys describe the ended episodes
    is_anchor = halves[next(iter(anchors))]
    assert list(final["anchor"]) == list(is_anchor)
    wm_scores = [
        o.score for o in world_model.predict([pool_runs[s][2].context for s in sids], [pool_runs[s][0] for s in sids])
    ]
    assert list(final["wm_score"]) == wm_scores
    for i in range(4):
        if is_anchor[i]:
            assert rewards[i] == final["true_score"][i] == pytest.approx(pool_runs[sids[i]][1].score, abs=0.2)
        else:
            assert rewards[i] == wm_scores[i] and not final["_true_score"][i]  # unknown: masked out
    assert venv.env.env.counters.real_executions == 2 and venv.debiaser.n_seen == 2
    venv.close()


class CandidateChoiceEnv(OutcomeSeam, gym.Env):
    """A one-turn AutoResearch task where the action picks one of a few candidate solutions.

    Grading delegates to the real env; real executions are cached by code hash (each
    candidate runs in the sandbox at most once), prefilled with the pool's real runs.
    """

    def __init__(self, scripts: list[str], executed: dict[str, Outcome]) -> None:
        self.inner = AutoResearchEnv(TASK, max_turns=1)
        self.actions = [fence(s) for s in scripts]
        self.action_space = gym.spaces.Discrete(len(scripts))
        self.observation_space = gym.spaces.Discrete(1)
        self.executed = {hashlib.sha256(code.encode()).hexdigest(): o for code, o in executed.items()}
        self.sandbox_runs = 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        _, info = self.inner.reset(options={"task": TASK, "group_id": (options or {}).get("group_id")})
        return 0, info

    def grading_request(self, action: Any) -> GradingRequest | None:
        return self.inner.grading_request(self.actions[int(action)])

    def grade(self, request: GradingRequest) -> Outcome | None:
        key = hashlib.sha256(request.action.encode()).hexdigest()
        if key not in self.executed:
            self.executed[key] = self.inner.grade(request)
            self.sandbox_runs += 1
        return self.executed[key]

    def apply(self, action: Any, outcome: Outcome | None):
        _, reward, terminated, truncated, info = self.inner.apply(self.actions[int(action)], outcome)
        return 0, reward, terminated, truncated, info


def test_stable_baselines3_ppo_trains_through_the_stack(pool_runs, world_model):
    sb3 = pytest.importorskip("stable_baselines3")
    executed = {record.code: outcome for _, outcome, record in pool_runs.values()}  # record.code: the script as graded
    base = CandidateChoiceEnv([pool_runs[s][0] for s in CANDIDATES], executed)
    env = CalibrationWrapper(
        AnchorWrapper(WorldModelWrapper(base, world_model), fraction=0.25, seed=0, auto_group_size=4),
        start_pairs=24,
        refit_every=8,
    )
    model = sb3.PPO("MlpPolicy", env, n_steps=64, batch_size=32, n_epochs=2, seed=0, device="cpu", verbose=0)
    model.learn(total_timesteps=256)
    scheduler, counters = env.get_wrapper_attr("scheduler"), env.get_wrapper_attr("counters")
    assert scheduler.n_groups >= 256 // 4  # SB3 passes no group ids: groups of 4 consecutive episodes
    assert 0.2 <= scheduler.realized_fraction <= 0.3
    # real grading exactly for anchor members (SB3's last reset may have opened one more, unstepped)
    assert 4 * scheduler.n_anchors - 4 <= counters.real_executions <= 4 * scheduler.n_anchors
    assert env.debiaser.n_seen == counters.real_executions >= 24  # anchor pairs flowed
    assert env.debiaser.fitted and env.debiaser.n_fits >= 2  # calibration engaged
    assert env.weighter.n_observed + env.weighter.n_degenerate >= 3  # complete anchor groups reached denoising
    assert base.sandbox_runs == 0  # every candidate's real run was already in the cache
    action, _ = model.predict(0, deterministic=True)
    assert 0 <= int(action) < len(CANDIDATES)


def test_next_step_autoreset_grades_nothing_for_the_autoresetting_step(pool_runs, world_model):
    venv = gym.vector.SyncVectorEnv([lambda: AutoResearchEnv(TASK, max_turns=1)] * 2)  # next-step autoreset
    venv = VectorWorldModelWrapper(venv, world_model)
    venv.reset(options={"task": TASK, "group_id": "g"})
    script = fence(pool_runs["majority"][0])
    _, _, terminated, _, _ = venv.step((script, script))
    assert terminated.all()
    assert venv.counters.wm_predictions == 2
    _, rewards, terminated, _, _ = venv.step((script, script))  # the autoreset step: nothing to grade
    assert venv.counters.wm_predictions == 2 and not terminated.any() and (rewards == 0).all()
    _, _, terminated, _, _ = venv.step((script, script))  # the new episodes grade again
    assert terminated.all() and venv.counters.wm_predictions == 4
