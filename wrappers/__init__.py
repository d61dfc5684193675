"""Wrappers that let a world model grade an expensive env, corrected by anchor groups.

Stack, outermost first (single env, or the ``Vector*`` forms on a ``VectorEnv``)::

    CalibrationWrapper(AnchorWrapper(WorldModelWrapper(env, world_model)))

* :class:`WorldModelWrapper` / :class:`VectorWorldModelWrapper`: world-model grading
  through the env's outcome seam (modes ``"wm"``, ``"both"``, ``"env"``).
* :class:`AnchorWrapper` / :class:`VectorAnchorWrapper`: a seeded share of GRPO groups is
  graded for real too, yielding ``(wm_score, true_score)`` pairs.
* :class:`CalibrationWrapper` / :class:`VectorCalibrationWrapper`: Online Debiasing
  (isotonic map on every world-model score) and Inverse-Variance Denoising (``anchor_weight``),
  driven by a :class:`Calibrator` (also usable without an env) set by :class:`CalibrationConfig`.
* Plain, serialisable state machines shared by both forms: :class:`AnchorScheduler`,
  :class:`OnlineDebiaser`, :class:`InverseVarianceWeighter`.
* :func:`build_stack`: the one builder of the ``real`` / ``wm`` / ``wmrl`` stacks.
* :func:`stack_state_dict` / :func:`load_stack_state_dict`: resume a whole stack.
* :class:`StackHandle`: the one object a training loop uses to talk to a stack.
* :func:`find_layer` / :func:`require_layer`: a wrapper of a given class in a stack.
"""

from wrappers._common import find_layer, require_layer
from wrappers.anchor import AnchorWrapper, GroupBook, VectorAnchorWrapper
from wrappers.calibration import (
    CalibrationConfig,
    CalibrationWrapper,
    Calibrator,
    VectorCalibrationWrapper,
    load_stack_state_dict,
    stack_state_dict,
)
from wrappers.handle import StackHandle
from wrappers.parts.debiasing import OnlineDebiaser
from wrappers.parts.denoising import InverseVarianceWeighter
from wrappers.parts.scheduling import AnchorScheduler
from wrappers.stack import STACKS, build_stack
from wrappers.world_model import MODES, GradingCounters, VectorWorldModelWrapper, WorldModelWrapper

__all__ = [
    "WorldModelWrapper",
    "VectorWorldModelWrapper",
    "AnchorWrapper",
    "VectorAnchorWrapper",
    "CalibrationWrapper",
    "VectorCalibrationWrapper",
    "CalibrationConfig",
    "Calibrator",
    "AnchorScheduler",
    "OnlineDebiaser",
    "InverseVarianceWeighter",
    "GroupBook",
    "GradingCounters",
    "MODES",
    "stack_state_dict",
    "load_stack_state_dict",
    "build_stack",
    "STACKS",
    "StackHandle",
    "find_layer",
    "require_layer",
]
