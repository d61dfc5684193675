"""Vector envs for text agents: a ``SyncVectorEnv`` whose info arrays accept ``None``.

Gymnasium types each info key's array by the first sub-env that reports it: after
``trajectory_reward=0.7`` (or an int ``n_classes``) from sub-env 0, a ``None`` (unknown)
from sub-env 1 raises ``TypeError``, and a float after an int is silently truncated.
AutoResearch infos legitimately mix them (a random task after autoreset, an unknown
grade), so :class:`NullableInfoSyncVectorEnv` turns such an array into an object array
instead. :func:`make_vector_env` builds one from a registered id.

Classes: :class:`NullableInfoSyncVectorEnv`. Functions: :func:`make_vector_env`.

>>> import wmrl_envs
>>> env = make_vector_env("wmrl/AutoResearch-v0", 2, split="train", max_turns=1)
>>> env.num_envs, env.metadata["autoreset_mode"].name
(2, 'SAME_STEP')
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode, SyncVectorEnv

__all__ = ["NullableInfoSyncVectorEnv", "make_vector_env"]


class NullableInfoSyncVectorEnv(SyncVectorEnv):
    """``SyncVectorEnv`` that widens a numeric info array to ``object`` when a sub-env
    reports ``None`` or a float where the array holds ints/bools."""

    def _add_info(self, vector_infos: dict[str, Any], env_info: dict[str, Any], env_num: int) -> dict[str, Any]:
        for key, value in env_info.items():
            array = vector_infos.get(key)
            if not isinstance(array, np.ndarray) or array.dtype == object or array.ndim != 1:
                continue
            lossy = value is None or (isinstance(value, float) and array.dtype.kind in "iub")
            if lossy:
                widened = array.astype(object)
                widened[~vector_infos[f"_{key}"]] = None
                vector_infos[key] = widened
        return super()._add_info(vector_infos, env_info, env_num)


def make_vector_env(env_id: str, num_envs: int, *, autoreset_mode: AutoresetMode = AutoresetMode.SAME_STEP, **kwargs: Any) -> NullableInfoSyncVectorEnv:
    """``num_envs`` copies of ``gym.make(env_id, **kwargs)`` in a :class:`NullableInfoSyncVectorEnv`."""
    if num_envs < 1:
        raise ValueError(f"num_envs must be >= 1, got {num_envs}")
    return NullableInfoSyncVectorEnv([lambda: gym.make(env_id, **kwargs) for _ in range(num_envs)], autoreset_mode=autoreset_mode)
