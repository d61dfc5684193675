"""The outcome seam every world-model-ready env implements.

``step(action)`` is ``apply(action, grade(grading_request(action)))``, with one twist: a
wrapper may set :attr:`OutcomeSeam.pending_outcome` before ``step`` to supply the outcome
itself (a world-model prediction, or ``None`` for "unknown"), so the real ``grade`` is
skipped while turn counting, observations, truncation and ``info`` stay the same code.
Because it is a plain attribute, it works through ``set_wrapper_attr`` and through
``VectorEnv.set_attr`` (one value per sub-env), including ``AsyncVectorEnv`` workers.

Vector wrappers that need the requests of all sub-envs first set ``pending_action`` (one
action per sub-env) and then ``call("pending_grading_request")``.

``step`` applies the suite's info policy (:mod:`wmrl_envs.vector`): unknown values (``None``)
are left out of ``info``, so ``apply`` may use ``None`` freely.

Classes: :class:`GradingRequest`, :class:`OutcomeSeam`. Constant: :data:`GRADE_FOR_REAL`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from wmrl_envs.outcome import Outcome
from wmrl_envs.vector import known_info

__all__ = ["GradingRequest", "OutcomeSeam", "GRADE_FOR_REAL"]

#: Value of ``pending_outcome`` meaning "no override: grade for real".
GRADE_FOR_REAL = "grade-for-real"


@dataclass(frozen=True)
class GradingRequest:
    """What needs grading, and everything a world model is allowed to see about it.

    Attributes:
        context: public information only (task id, task overview text, meta-features,
            turn index, earlier feedback). Never hidden labels.
        action: the thing graded (a Python script for AutoResearch; a trajectory record
            for embodied envs).
        group_id: the GRPO group of the episode, if any.
    """

    context: Mapping[str, Any]
    action: Any
    group_id: Any = None
    meta: Mapping[str, Any] = field(default_factory=dict)


class OutcomeSeam:
    """Mixin for a ``gymnasium.Env`` whose grading a world model can replace.

    Subclasses implement :meth:`grading_request`, :meth:`grade` and :meth:`apply`;
    :meth:`step` is provided.
    """

    pending_outcome: Outcome | None | str = GRADE_FOR_REAL
    pending_action: Any = None

    def grading_request(self, action: Any) -> GradingRequest | None:
        """The request that ``step(action)`` would grade, or ``None`` if nothing needs grading.

        Must not change the env's state.
        """
        raise NotImplementedError

    def grade(self, request: GradingRequest) -> Outcome | None:
        """Grade for real (execution / simulation). ``None`` when the grader itself failed."""
        raise NotImplementedError

    def apply(self, action: Any, outcome: Outcome | None) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        """Everything in ``step`` except grading: advance the state, build obs/reward/info."""
        raise NotImplementedError

    def pending_grading_request(self) -> GradingRequest | None:
        """:meth:`grading_request` of :attr:`pending_action` (for vector wrappers).

        ``None`` when no action is pending (e.g. a sub-env whose episode ended and that
        autoresets on its next step).
        """
        if self.pending_action is None:
            return None
        return self.grading_request(self.pending_action)

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        request = self.grading_request(action)
        pending, self.pending_outcome = self.pending_outcome, GRADE_FOR_REAL
        self.pending_action = None
        if request is None:
            outcome = None
        elif isinstance(pending, str):
            outcome = self.grade(request)
        else:
            outcome = pending
        obs, reward, terminated, truncated, info = self.apply(action, outcome)
        return obs, reward, terminated, truncated, known_info(info)
