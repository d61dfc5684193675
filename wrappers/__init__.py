"""Wrappers that let a world model grade an expensive env, corrected by anchor groups.

Stack, outermost first (single env, or the ``Vector*`` forms on a ``VectorEnv``)::

    CalibrationWrapper(AnchorWrapper(WorldModelWrapper(env, world_model)))

* :class:`WorldModelWrapper` / :class:`VectorWorldModelWrapper`: world-model grading
  through the env's outcome seam (modes ``"wm"``, ``"both"``, ``"env"``).
* :class:`AnchorWrapper` / :class:`VectorAnchorWrapper`: a seeded share of GRPO groups is
  graded for real too, yielding ``(wm_score, true_score)`` pairs.
* :class:`CalibrationWrapper` / :class:`VectorCalibrationWrapper`: Online Debiasing
  (isotonic map on every world-model score) and Inverse-Variance Denoising (``anchor_weight``).
* Plain, serialisable state machines shared by both forms: :class:`AnchorScheduler`,
  :class:`OnlineDebiaser`, :class:`InverseVarianceWeighter`.
* :func:`stack_state_dict` / :func:`load_stack_state_dict`: resume a whole stack.
"""

from wrappers.anchor import AnchorWrapper, GroupBook, VectorAnchorWrapper
from wrappers.calibration import (
    CalibrationConfig,
    CalibrationWrapper,
    VectorCalibrationWrapper,
    load_stack_state_dict,
    stack_state_dict,
)
from wrappers.debiasing import OnlineDebiaser
from wrappers.denoising import InverseVarianceWeighter
from wrappers.scheduling import AnchorScheduler
from wrappers.world_model import MODES, GradingCounters, VectorWorldModelWrapper, WorldModelWrapper

__all__ = [
    "WorldModelWrapper",
    "VectorWorldModelWrapper",
    "AnchorWrapper",
    "VectorAnchorWrapper",
    "CalibrationWrapper",
    "VectorCalibrationWrapper",
    "CalibrationConfig",
    "AnchorScheduler",
    "OnlineDebiaser",
    "InverseVarianceWeighter",
    "GroupBook",
    "GradingCounters",
    "MODES",
    "stack_state_dict",
    "load_stack_state_dict",
]
