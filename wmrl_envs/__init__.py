"""wmrl-envs: Gymnasium environments with expensive rewards, and what makes them real.

Importing this package registers every environment id with Gymnasium:
``wmrl/AutoResearch-v0``, ``wmrl/AutoResearch-<task>-v0`` per catalog task, and
``wmrl/LIBERO-Long-v0`` plus one id per LIBERO-10 task.

Subpackages: ``sandbox`` (untrusted code execution), ``autoresearch`` (ML tasks, grading,
env), ``libero`` (LIBERO-Long), ``world_models`` (learned simulators of outcomes).
"""

from wmrl_envs.outcome import Outcome
from wmrl_envs.spaces import FreeText

__version__ = "0.1.0"
__all__ = ["Outcome", "FreeText", "__version__"]


def _register_all() -> None:
    # Each family registers itself; a family whose optional deps are missing still
    # registers its ids (the import error surfaces at gym.make with a clear message).
    from wmrl_envs import _registration

    _registration.register_all()


_register_all()
