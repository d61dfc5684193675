"""``gym.make("wmrl/LIBERO-Long-v0", max_episode_steps=N)`` ends episodes graded.

Gymnasium consumes ``max_episode_steps`` in ``gym.make`` and adds a ``TimeLimit`` wrapper; the
env never sees the number. A ``TimeLimit`` alone would end an episode at step ``N`` after an
ordinary action step, without the simulator's success check, so the episode's outcome would be
silently unknown. The LIBERO ids are therefore registered with :class:`GradedHorizon` as an
additional wrapper, which Gymnasium applies *after* the ``TimeLimit``: it reads the limit and
shortens the env's own horizon (``LiberoLongConfig.max_episode_steps``) to it, so step ``N`` is
the env's final, graded step and the ``TimeLimit`` only agrees with it.

Classes: :class:`GradedHorizon`. Functions: :func:`time_limit_of`.

>>> import gymnasium as gym
>>> env = gym.wrappers.TimeLimit(gym.make("CartPole-v1", max_episode_steps=-1), 7)
>>> time_limit_of(env)
7
"""

from __future__ import annotations

import dataclasses
from typing import Any

import gymnasium as gym
from gymnasium.utils import RecordConstructorArgs

__all__ = ["GradedHorizon", "time_limit_of"]


def time_limit_of(env: Any) -> int | None:
    """The smallest ``TimeLimit`` below ``env`` in its wrapper chain, or ``None``."""
    limits = []
    while isinstance(env, gym.Wrapper):
        if isinstance(env, gym.wrappers.TimeLimit):
            limits.append(int(env._max_episode_steps))  # noqa: SLF001  (gymnasium keeps it private)
        env = env.env
    return min(limits) if limits else None


class GradedHorizon(gym.Wrapper, RecordConstructorArgs):
    """Align a LIBERO env's own (graded) horizon with a ``TimeLimit`` below this wrapper.

    Transparent otherwise: observations, rewards and infos pass through unchanged.
    """

    def __init__(self, env: gym.Env) -> None:
        RecordConstructorArgs.__init__(self)
        gym.Wrapper.__init__(self, env)
        limit = time_limit_of(env)
        base: Any = env.unwrapped
        config = getattr(base, "config", None)
        if limit is not None and config is not None and limit < config.max_episode_steps:
            base.config = dataclasses.replace(config, max_episode_steps=limit)
