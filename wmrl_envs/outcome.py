"""The outcome seam: what happened when an action was graded, independent of who graded it.

An env that supports world models splits ``step`` into *deciding what happened*
(``grade`` -> :class:`Outcome`) and *turning it into an observation* (``apply``).
The real env grades by execution or simulation; a world model grades by prediction.
Either way the result is an :class:`Outcome`, so everything downstream is shared.

Classes: :class:`Outcome`. Constants: :data:`AUTORESEARCH_STATUSES`, :data:`EMBODIED_STATUSES`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["Outcome", "AUTORESEARCH_STATUSES", "EMBODIED_STATUSES", "SOURCES"]

AUTORESEARCH_STATUSES = ("malformed", "syntax_error", "runtime_error", "timeout", "no_submission", "valid")
EMBODIED_STATUSES = ("success", "failure")
SOURCES = ("env", "wm")


@dataclass(frozen=True)
class Outcome:
    """The graded result of one action.

    Attributes:
        status: one of :data:`AUTORESEARCH_STATUSES` or :data:`EMBODIED_STATUSES`.
        score: reward-scale score in [0, 1], or ``None`` when unknown. Unknown is never 0:
            consumers exclude ``None`` instead of scoring it.
        feedback: text the agent may read on its next turn.
        metrics: free-form numbers (raw metric value, percentile, ...).
        cost: seconds (wall or CPU, see ``metrics``) spent producing this outcome.
        source: ``"env"`` (real execution / simulation) or ``"wm"`` (world-model prediction).

    >>> Outcome("valid", 0.8, source="wm").with_score(0.7).score
    0.7
    """

    status: str
    score: float | None
    feedback: str = ""
    metrics: Mapping[str, Any] = field(default_factory=dict)
    cost: float = 0.0
    source: Literal["env", "wm"] = "env"

    def __post_init__(self) -> None:
        if self.status not in AUTORESEARCH_STATUSES + EMBODIED_STATUSES:
            raise ValueError(
                f"Outcome.status must be one of {AUTORESEARCH_STATUSES + EMBODIED_STATUSES}, got {self.status!r}"
            )
        if self.source not in SOURCES:
            raise ValueError(f"Outcome.source must be one of {SOURCES}, got {self.source!r}")
        if self.score is not None:
            if not isinstance(self.score, (int, float)) or math.isnan(self.score) or not 0.0 <= self.score <= 1.0:
                raise ValueError(f"Outcome.score must be a number in [0, 1] or None, got {self.score!r}")
            object.__setattr__(self, "score", float(self.score))

    @property
    def graded(self) -> bool:
        """True when the score is known."""
        return self.score is not None

    def with_score(self, score: float | None) -> Outcome:
        """A copy with another score (e.g. after calibration)."""
        return dataclasses.replace(self, score=score)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (round-trips through :meth:`from_dict`)."""
        d = dataclasses.asdict(self)
        d["metrics"] = dict(self.metrics)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Outcome:
        return cls(**{f.name: d[f.name] for f in dataclasses.fields(cls) if f.name in d})
