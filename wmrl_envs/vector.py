"""Vector envs of the suite: one factory and one info policy.

**The info policy.** Every env of the suite and every wmrl wrapper emits *typed, vector-safe*
infos:

* an unknown value is left out, never reported as ``None`` (in a vector env its ``_key`` mask
  is then ``False`` for that sub-env, which readers treat as unknown);
* a key has one type: a number that can be fractional is always a ``float``, a count an
  ``int``, a flag a ``bool``.

Why: Gymnasium's vector envs store each info key in an array typed by the first sub-env that
reports it. A ``None`` from a later sub-env then raises ``TypeError`` in an ``int`` array and
silently becomes ``NaN`` in a ``float`` array, and a ``float`` after an ``int`` is truncated.
Under the policy none of this can happen, so the plain ``gym.make_vec`` works and no vector
env subclass is needed. Single-env readers use ``info.get(key)`` (``None`` = unknown).

Functions: :func:`known_info` (apply the policy to one info dict), :func:`sub_info` (one
sub-env's entries of a vector info dict), :func:`make_vector_env` (the suite's one vector-env
factory).

>>> known_info({"trajectory_reward": None, "turn": 0, "final_info": {"score": None}})
{'turn': 0, 'final_info': {}}
>>> import numpy as np
>>> infos = {"turn": np.array([3, 0]), "_turn": np.array([True, False])}
>>> sub_info(infos, 0), sub_info(infos, 1)
({'turn': np.int64(3)}, {})
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import gymnasium as gym
from gymnasium.vector import AutoresetMode, VectorEnv

__all__ = ["known_info", "sub_info", "make_vector_env", "VECTORIZATION_MODES"]

#: Accepted ``vectorization`` values of :func:`make_vector_env`.
VECTORIZATION_MODES = ("sync", "async", "ray")


def known_info(info: Mapping[str, Any]) -> dict[str, Any]:
    """``info`` without its unknown (``None``) values, nested dicts included."""
    return {k: known_info(v) if isinstance(v, Mapping) else v for k, v in info.items() if v is not None}


def sub_info(infos: Mapping[str, Any], i: int, keys: Iterable[str] | None = None) -> dict[str, Any]:
    """Sub-env ``i``'s entries of a vector ``info`` dict (``_key`` masks respected, nested
    dicts such as ``final_info`` too), or only those of ``keys``."""
    out: dict[str, Any] = {}
    for key in infos if keys is None else (k for k in keys if k in infos):
        if key.startswith("_"):
            continue
        mask = infos.get(f"_{key}")
        if mask is not None and not mask[i]:
            continue
        value = infos[key]
        out[key] = sub_info(value, i) if isinstance(value, Mapping) else value[i]
    return out


def make_vector_env(
    env_id: str,
    num_envs: int,
    *,
    vectorization: str = "sync",
    autoreset_mode: AutoresetMode = AutoresetMode.SAME_STEP,
    ray_options: Mapping[str, Any] | None = None,
    **env_kwargs: Any,
) -> VectorEnv:
    """``num_envs`` copies of ``gym.make(env_id, **env_kwargs)`` as one vector env.

    Args:
        env_id: a registered id, e.g. ``"wmrl/AutoResearch-v0"``.
        num_envs: sub-envs (>= 1).
        vectorization: ``"sync"`` (one process; right for envs whose cost is a sandbox run
            or a world-model call) or ``"async"`` (a process per sub-env; Text observations
            need ``shared_memory=False``, which is set here) or ``"ray"`` (each sub-env a Ray
            actor: :class:`~wmrl_envs.ray_vector.RayVectorEnv`, same API and autoreset).
        autoreset_mode: same-step by default: an LLM agent's episode ends on a step, and
            the next group's reset must not cost an extra no-op step per slot.
        ray_options: with ``"ray"`` only: ``num_cpus`` per actor, ``address`` of a cluster
            (default: a local instance, or ``RAY_ADDRESS``), ``local_cpus``, ``actor_options``.
        env_kwargs: passed to every ``gym.make``.

    >>> import wmrl_envs
    >>> env = make_vector_env("wmrl/AutoResearch-v0", 2, split="train", max_turns=1)
    >>> env.num_envs, env.metadata["autoreset_mode"].name
    (2, 'SAME_STEP')
    >>> env.close()
    """
    if num_envs < 1:
        raise ValueError(f"num_envs must be >= 1, got {num_envs}")
    if vectorization not in VECTORIZATION_MODES:
        raise ValueError(f"vectorization must be one of {VECTORIZATION_MODES}, got {vectorization!r}")
    if ray_options is not None and vectorization != "ray":
        raise ValueError(f"ray_options apply to vectorization='ray' only, not {vectorization!r}")
    if vectorization == "ray":
        from wmrl_envs.ray_vector import EnvFactory, RayVectorEnv

        return RayVectorEnv(
            [EnvFactory(env_id, **env_kwargs) for _ in range(num_envs)],
            autoreset_mode=AutoresetMode(autoreset_mode),
            **dict(ray_options or {}),
        )
    vector_kwargs: dict[str, Any] = {"autoreset_mode": AutoresetMode(autoreset_mode)}
    if vectorization == "async":
        vector_kwargs["shared_memory"] = False  # Text observations are stale with shared memory
    return gym.make_vec(
        env_id, num_envs=num_envs, vectorization_mode=vectorization, vector_kwargs=vector_kwargs, **env_kwargs
    )
