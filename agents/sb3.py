"""Adapters for fixed-space RL libraries such as Stable-Baselines3.

SB3's policies need numeric observation and action spaces, and both env families carry text:
AutoResearch observes and acts in free text (a task overview in, a Python script out), and
LIBERO's observation dict holds the language instruction, which ``MultiInputPolicy`` cannot
encode. These wrappers give each family the view SB3 can learn from; the world-model stack
stays *inside* them, so rewards are still graded (and calibrated) by the suite's wrappers.

* :class:`PlanChoiceWrapper` (AutoResearch): the action picks one of a fixed set of plans
  (model family + hyperparameters), rendered into a complete script for the current task by
  :func:`agents.llm.scaffolds.render_plan`; the observation is the task's numeric
  meta-features (:data:`META_FEATURES`), so a policy can learn which plan suits which table.
* :func:`libero_observation` (LIBERO): keeps the numeric entries of the observation dict and
  drops the instruction (one env is one task, so it carries no information within an env).

Classes: :class:`PlanChoiceWrapper`. Functions: :func:`libero_observation`. Constants:
:data:`DEFAULT_PLANS`, :data:`META_FEATURES`.

>>> import gymnasium as gym, wmrl_envs
>>> from wmrl_envs.world_models import CodeOutcomeModel
>>> from wrappers import build_stack
>>> env = PlanChoiceWrapper(build_stack(gym.make("wmrl/AutoResearch-v0", split="train", max_turns=1),
...                                     "wm", CodeOutcomeModel.load_default()))
>>> obs, info = env.reset(seed=0)
>>> obs.shape, env.action_space
((10,), Discrete(6))
>>> obs, reward, terminated, truncated, info = env.step(3)  # gradient boosting, graded by the world model
>>> terminated, info["source"], 0.0 <= reward <= 1.0
(True, 'wm', True)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np

from agents.llm.scaffolds import Plan, TaskSpec, parse_plan, render_plan

__all__ = ["PlanChoiceWrapper", "libero_observation", "DEFAULT_PLANS", "META_FEATURES"]

#: One plan per model family (the plan scaffold's ``key: value`` format).
DEFAULT_PLANS = (
    "model: linear\nC: 1.0\nscale: yes",
    "model: random_forest\nn_estimators: 200\nmax_depth: 12",
    "model: extra_trees\nn_estimators: 200",
    "model: gradient_boosting\nn_estimators: 200\nlearning_rate: 0.05\nmax_depth: 6",
    "model: knn\nn_neighbors: 15\nscale: yes",
    "model: baseline",
)

#: Reset-info entries in the observation of :class:`PlanChoiceWrapper` (counts log-scaled).
#: ``n_classes`` is 0 for regression tasks, where it does not apply; ``is_classification``
#: says which case it is.
META_FEATURES = (
    "n_train",
    "n_test",
    "n_cols",
    "n_numeric",
    "n_categorical",
    "missing_fraction",
    "max_cardinality",
    "onehot_width",
    "n_classes",
    "is_classification",
)
_LOG_SCALED = {"n_train", "n_test", "n_cols", "n_numeric", "n_categorical", "max_cardinality", "onehot_width"}


def _features(info: dict[str, Any]) -> np.ndarray:
    values = []
    for key in META_FEATURES:
        if key == "is_classification":
            value = float(info.get("task_type") != "regression")
        else:
            value = float(info.get(key) or 0.0)  # absent = not applicable (n_classes of a regression)
        values.append(np.log1p(value) if key in _LOG_SCALED else value)
    return np.asarray(values, dtype=np.float32)


class PlanChoiceWrapper(gym.Wrapper):
    """An AutoResearch env (or a world-model stack around one) with a ``Discrete`` action over
    ``plans`` and a ``Box`` observation of the task's meta-features.

    Args:
        env: an AutoResearch env or stack (single env; its actions are reply texts).
        plans: plan texts (``model: ...`` lines); default :data:`DEFAULT_PLANS`.

    Raises:
        ValueError: a plan names no known model family.
    """

    def __init__(self, env: gym.Env, plans: Sequence[str] = DEFAULT_PLANS) -> None:
        super().__init__(env)
        parsed = [parse_plan(p) for p in plans]
        bad = [p for p, q in zip(plans, parsed) if q is None]
        if bad or not plans:
            raise ValueError(f"plans must name a model family (model: <family>); unreadable: {bad}")
        self.plans: list[Plan] = [q for q in parsed if q is not None]
        self.action_space = gym.spaces.Discrete(len(self.plans))
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (len(META_FEATURES),), np.float32)
        self._spec: TaskSpec | None = None
        self._obs = np.zeros(len(META_FEATURES), np.float32)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        _, info = self.env.reset(seed=seed, options=options)
        self._spec = TaskSpec.from_info(info)
        self._obs = _features(info)
        return self._obs.copy(), info

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        if self._spec is None:
            raise RuntimeError("call reset() before step()")
        script = render_plan(self.plans[int(action)], self._spec)
        _, reward, terminated, truncated, info = self.env.step(f"```python\n{script}\n```")
        return self._obs.copy(), float(reward), terminated, truncated, info


def libero_observation(env: gym.Env, keys: Sequence[str] | None = None) -> gym.Env:
    """``env`` with only numeric observation entries (default: every ``Box`` entry, i.e.
    without the text ``instruction``), for SB3's ``MultiInputPolicy``.

    Raises:
        ValueError: ``keys`` names an entry the observation does not have, or a text entry.
    """
    space = env.observation_space
    if not isinstance(space, gym.spaces.Dict):
        raise ValueError(f"expected a Dict observation space (a LIBERO env), got {space}")
    numeric = [k for k, s in space.spaces.items() if isinstance(s, gym.spaces.Box)]
    chosen = list(keys) if keys is not None else numeric
    bad = [k for k in chosen if k not in numeric]
    if bad:
        raise ValueError(f"observation keys {bad} are not numeric entries of this env; choose from {numeric}")
    return gym.wrappers.FilterObservation(env, chosen)
