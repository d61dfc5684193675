"""Small, deterministic OutcomeSeam env and world model for the wrapper tests.

:class:`ToySeamEnv` is a real OutcomeSeam env with cheap grading: each task has a hidden
true score per action (a seeded hash), graded "for real" by :meth:`ToySeamEnv.grade`,
which counts its calls. :class:`SyntheticWorldModel` is the issue's synthetic world model,
``clip(bias(r) + N(0, noise))`` of the true score ``r``, deterministic per (task, action,
turn, seed), so single-env and vector runs see identical predictions.

Classes: :class:`ToySeamEnv`, :class:`SyntheticWorldModel`. Functions: :func:`toy_true_score`,
:func:`paper_bias`, :func:`training_steps` (a GRPO-shaped driver for single-env stacks).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from wmrl_envs.outcome import Outcome
from wmrl_envs.seam import GradingRequest, OutcomeSeam

__all__ = ["ToySeamEnv", "SyntheticWorldModel", "toy_true_score", "paper_bias", "training_steps"]


def toy_true_score(task: int, action: int) -> float:
    """The hidden true score of ``action`` on ``task``, uniform in [0, 1)."""
    return float(np.random.default_rng([int(task), int(action), 7]).random())


def paper_bias(r: np.ndarray | float) -> np.ndarray | float:
    """The issue's synthetic bias: ``0.25 + 0.55 r + 0.2 r^2``."""
    return 0.25 + 0.55 * r + 0.2 * r**2


class ToySeamEnv(OutcomeSeam, gym.Env):
    """``max_turns`` graded turns per episode; obs = turn index; reward = increase of the
    running max of known scores (so the return is the trajectory reward).

    Args:
        n_actions: candidate actions per task.
        max_turns: execute turns per episode.
        unknown_every: every k-th (task, action) pair has a grader failure (``None``); 0 = never.
    """

    metadata = {"render_modes": []}

    def __init__(self, n_actions: int = 16, max_turns: int = 1, unknown_every: int = 0) -> None:
        self.n_actions = n_actions
        self.max_turns = max_turns
        self.unknown_every = unknown_every
        self.action_space = spaces.Discrete(n_actions)
        self.observation_space = spaces.Discrete(max_turns + 1)
        self.n_real_grades = 0
        self.task = 0
        self.group_id: Any = None
        self.turn = 0
        self.best: float | None = None
        self.outcomes: list[Outcome | None] = []

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        options = options or {}
        self.task = int(options["task"]) if "task" in options else int(self.np_random.integers(10**6))
        self.group_id = options.get("group_id")
        self.turn, self.best, self.outcomes = 0, None, []
        return 0, {"task_id": self.task, "group_id": self.group_id}

    def grading_request(self, action: Any) -> GradingRequest | None:
        if action is None or self.turn >= self.max_turns:
            return None
        return GradingRequest({"task_id": self.task, "turn": self.turn}, int(action), self.group_id)

    def grade(self, request: GradingRequest) -> Outcome | None:
        self.n_real_grades += 1
        task, action = request.context["task_id"], request.action
        if self.unknown_every and (task * 31 + action) % self.unknown_every == 0:
            return None
        return Outcome("valid", toy_true_score(task, action), feedback="graded", source="env")

    def apply(self, action: Any, outcome: Outcome | None):
        self.turn += 1
        self.outcomes.append(outcome)
        score = None if outcome is None else outcome.score
        before = self.best
        if score is not None:
            self.best = score if self.best is None else max(self.best, score)
        reward = 0.0 if self.best is None else self.best - (before or 0.0)
        terminated = self.turn >= self.max_turns
        info: dict[str, Any] = {
            "task_id": self.task,
            "group_id": self.group_id,
            "turn": self.turn,
            "action_type": "execute",
            "outcome": outcome,
            "graded": True,
        }
        if terminated:
            info["trajectory_reward"] = self.best
            info["outcomes"] = list(self.outcomes)
        return self.turn, float(reward), terminated, False, info


class SyntheticWorldModel:
    """``clip(bias(r) + N(0, noise), 0, 1)`` of the toy's true score ``r``; records batch sizes.

    Args:
        bias: the systematic distortion (default :func:`paper_bias`); may be swapped mid-run.
        noise: std of the zero-mean noise.
        seed: noise seed.
        unknown_every: every k-th (task, action) pair gets ``None`` (cannot say); 0 = never.
    """

    def __init__(
        self,
        bias: Callable[[float], float] = paper_bias,
        noise: float = 0.005,
        seed: int = 0,
        unknown_every: int = 0,
    ) -> None:
        self.bias = bias
        self.noise = noise
        self.seed = seed
        self.unknown_every = unknown_every
        self.batch_sizes: list[int] = []

    def score(self, task: int, action: int, turn: int = 0) -> float:
        r = toy_true_score(task, action)
        eps = np.random.default_rng([self.seed, int(task), int(action), int(turn), 11]).normal(0.0, self.noise)
        return float(np.clip(self.bias(r) + eps, 0.0, 1.0))

    def predict(self, contexts: Sequence[Mapping[str, Any]], actions: Sequence[Any]) -> list[Outcome | None]:
        if len(contexts) != len(actions):
            raise ValueError(f"{len(contexts)} contexts but {len(actions)} actions")
        self.batch_sizes.append(len(actions))
        out: list[Outcome | None] = []
        for ctx, action in zip(contexts, actions):
            task = ctx["task_id"]
            if self.unknown_every and (task * 17 + int(action)) % self.unknown_every == 0:
                out.append(None)
            else:
                out.append(Outcome("valid", self.score(task, action, ctx.get("turn", 0)), source="wm"))
        return out


def training_steps(
    env: gym.Env, steps: Iterable[int], groups: int, size: int, seed: int = 0
) -> Iterator[dict[str, Any]]:
    """Drive a single-env wrapper stack like a GRPO trainer: per step, decide ``groups``
    groups with ``begin_step``, then run each group's ``size`` members (one episode each,
    distinct actions on one task). Inputs depend only on ``(seed, step)``, so a resumed run
    replays them. Yields one record per episode: its last step's info plus task, action,
    reward and the reset info."""
    n_actions = env.action_space.n
    for step in steps:
        rng = np.random.default_rng([seed, step])
        gids = [f"s{step}g{k}" for k in range(groups)]
        env.get_wrapper_attr("begin_step")(gids)
        for g in gids:
            task = int(rng.integers(10**6))
            for action in rng.choice(n_actions, size=size, replace=False).tolist():
                _, reset_info = env.reset(options={"task": task, "group_id": g, "group_size": size})
                _, reward, _, _, info = env.step(action)
                yield {"task": task, "action": action, "reward": reward, "reset_info": reset_info, **info}
