"""GRPO for every agent: the objective, the one training loop, and its run-health diagnostics.

* :mod:`agents.grpo.objective` -- group advantages over graded members (anchor-weighted,
  optional Dr.GRPO centring) and the clipped token-level loss (TRL's names).
* :mod:`agents.grpo.loop` -- :class:`GRPOLoopConfig` (the settings every agent shares),
  the :class:`GRPOAgent` protocol an agent implements (select / collect / update), and
  :func:`train`, the loop; checkpoints of policy + optimiser + RNG + stack state; the
  :class:`ExploitationGuard` callback.
* :mod:`agents.grpo.diagnostics` -- warnings for runs that cannot learn.
* :mod:`agents.grpo.rollback` -- :class:`FormatRollback`: the loop restores the last policy
  that wrote its format when a run collapses off it (``GRPOLoopConfig.max_rollbacks``).
* :mod:`agents.grpo.anchor_schedule` -- :class:`AnchorSchedule`, a callback that decays the
  anchor share while the calibration holds and raises it when the gap opens.
* :mod:`agents.grpo.shadow` -- :class:`ShadowProbe`, a callback that grades a sample of the
  policy's world-model-graded scripts for real outside training (exploitation, measured).
* :mod:`agents.grpo.world_model_updates` -- :class:`WorldModelUpdater`, a callback that refits
  the world model on the real outcomes of the policy's own anchor scripts.

Agents: :class:`agents.llm.trainer.LLMAgent`, :class:`agents.vla.trainer.VLAAgent`.
"""

from agents.grpo.anchor_schedule import AnchorSchedule
from agents.grpo.diagnostics import CorrectionsIdleWarning, NoLearningSignalWarning, SignalWatch
from agents.grpo.loop import (
    DEFAULT_GUARD,
    Callback,
    Episode,
    ExploitationGuard,
    GRPOAgent,
    GRPOLoopConfig,
    TrainResult,
    load_checkpoint,
    save_checkpoint,
    step_metrics,
    train,
)
from agents.grpo.objective import (
    LOSS_AGGREGATIONS,
    AdvantageResult,
    AdvantageStats,
    LossAggregation,
    LossOutput,
    concat_segments,
    group_advantages,
    grpo_loss,
)
from agents.grpo.rollback import FormatRollback
from agents.grpo.shadow import ShadowProbe
from agents.grpo.world_model_updates import WorldModelUpdater

__all__ = [
    "GRPOLoopConfig",
    "GRPOAgent",
    "Episode",
    "TrainResult",
    "Callback",
    "ExploitationGuard",
    "DEFAULT_GUARD",
    "WorldModelUpdater",
    "ShadowProbe",
    "FormatRollback",
    "AnchorSchedule",
    "train",
    "step_metrics",
    "save_checkpoint",
    "load_checkpoint",
    "NoLearningSignalWarning",
    "CorrectionsIdleWarning",
    "SignalWatch",
    "group_advantages",
    "grpo_loss",
    "concat_segments",
    "AdvantageResult",
    "AdvantageStats",
    "LossOutput",
    "LOSS_AGGREGATIONS",
    "LossAggregation",
]
