"""LIBERO-Long (the ``libero_10`` suite) as Gymnasium environments, on the real MuJoCo simulator.

Importing this package does not import MuJoCo; ``gym.make`` (or importing
:mod:`wmrl_envs.libero.env`) does. Needs the ``libero`` extra and ``MUJOCO_GL=egl`` on a
headless machine (set by default).

Modules: ``tasks`` (task table, initial-state splits), ``env`` (:class:`LiberoLongEnv`),
``goals`` (privileged progress labels, goal placement through the simulator), ``registration``
(gym ids). Logging rollouts to train progress world models lives with the world models
(:mod:`wmrl_envs.world_models.progress_rollouts`).
"""

from wmrl_envs.libero.tasks import LIBERO_10_TASKS, SPLITS, LiberoTask, get_task

__all__ = ["LIBERO_10_TASKS", "SPLITS", "LiberoTask", "get_task"]
