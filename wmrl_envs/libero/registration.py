"""Gymnasium ids of LIBERO-Long (registered on ``import wmrl_envs``; MuJoCo is imported only by ``gym.make``).

* ``wmrl/LIBERO-Long-v0`` -- any task, chosen with the ``task_id`` kwarg (default 0).
* ``wmrl/LIBERO-Long-Task{k}-v0`` for k = 0..9 -- one id per task (see
  :data:`wmrl_envs.libero.tasks.LIBERO_10_TASKS` for the order).

No ``max_episode_steps`` is registered: the env truncates (and grades) episodes itself. A
``gym.make(..., max_episode_steps=N)`` still works: every id carries the additional wrapper
:class:`~wmrl_envs.libero.horizon.GradedHorizon`, which makes step ``N`` the env's graded final
step instead of letting Gymnasium's ``TimeLimit`` end the episode ungraded.

Functions: :func:`register_envs`.
"""

from __future__ import annotations

from typing import Any

from gymnasium.envs.registration import WrapperSpec, register, registry

from wmrl_envs.libero.tasks import LIBERO_10_TASKS

__all__ = ["register_envs", "ENTRY_POINT", "GENERIC_ID"]

ENTRY_POINT = "wmrl_envs.libero.env:LiberoLongEnv"
GENERIC_ID = "wmrl/LIBERO-Long-v0"
_HORIZON = WrapperSpec("GradedHorizon", "wmrl_envs.libero.horizon:GradedHorizon", {})


def register_envs() -> None:
    """Register the generic id and one id per task (idempotent)."""
    ids: list[tuple[str, dict[str, Any]]] = [(GENERIC_ID, {})] + [
        (task.gym_id, {"task_id": task.index}) for task in LIBERO_10_TASKS
    ]
    for env_id, kwargs in ids:
        if env_id not in registry:
            register(id=env_id, entry_point=ENTRY_POINT, kwargs=kwargs, additional_wrappers=(_HORIZON,))
