"""An anchor-fraction schedule: spend less on real execution once the calibration holds, more when it slips.

Anchors are what WMRL pays for. Once the calibrated world model agrees with real execution on
the anchor groups (the monitor's ``gap``: mean calibrated minus real score over their members),
fewer anchors keep it honest; when the gap opens up (the policy moved to code the world model
misjudges, or is exploiting it) more are needed, now. :class:`AnchorSchedule` (a callback of
:func:`agents.grpo.train`) is that controller, a two-sided test on the last ``window`` anchored
steps' gaps (mean ``m``, standard error ``se``):

* **decay** when ``|m| + se <= tolerance`` (the calibration is unbiased to within
  ``tolerance``, with the noise accounted for): fraction x ``decay``, not below ``floor``;
* **rise** when ``m - se > max_gap`` (the world model overrates the policy's code, beyond
  noise): fraction / ``decay**2`` (up twice as fast as down), not above ``ceiling``.

After a change the window starts afresh: the new share is judged on its own evidence. A share
that decays to the floor still sees ``floor`` of the groups, so the gap stays measured. The
:class:`~agents.grpo.ExploitationGuard` (on by default in :func:`~agents.grpo.train`) is the
alarm above this: it doubles the share on a large smoothed gap and stops the run when that is
not enough.

Example::

    schedule = AnchorSchedule(env, floor=0.05, tolerance=0.02, max_gap=0.1)
    train(agent, callbacks=[schedule])
    schedule.events  # [{"step": 120, "action": "decay", "fraction": 0.08, ...}, ...]

Classes: :class:`AnchorSchedule`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from wrappers import StackHandle

__all__ = ["AnchorSchedule"]


class AnchorSchedule:
    """Decay the anchor share while the calibration holds, raise it when the gap opens (module docstring).

    Args:
        env: the training stack (with a local anchor layer).
        floor / ceiling: the share's bounds.
        decay: multiplier of a decay step (in (0, 1)); a rise divides by its square.
        window: anchored steps per decision.
        tolerance: the calibration holds when ``|mean gap| + se <= tolerance``.
        max_gap: the calibration slipped when ``mean gap - se > max_gap``.
    """

    def __init__(
        self,
        env: Any,
        *,
        floor: float = 0.05,
        ceiling: float = 0.5,
        decay: float = 0.8,
        window: int = 8,
        tolerance: float = 0.02,
        max_gap: float = 0.1,
    ) -> None:
        if not 0.0 < floor <= ceiling <= 1.0:
            raise ValueError(f"need 0 < floor <= ceiling <= 1, got floor={floor}, ceiling={ceiling}")
        if not 0.0 < decay < 1.0 or window < 2:
            raise ValueError(f"need 0 < decay < 1 and window >= 2, got decay={decay}, window={window}")
        self.handle = StackHandle(env)
        if self.handle.anchor_fraction is None:
            raise TypeError("AnchorSchedule needs a local anchor layer (a stack with anchor groups)")
        self.floor, self.ceiling, self.decay, self.window = floor, ceiling, decay, window
        self.tolerance, self.max_gap = tolerance, max_gap
        self.gaps: list[float] = []
        self.events: list[dict[str, Any]] = []

    def __call__(self, step: int, metrics: Mapping[str, Any]) -> bool:
        """Step boundary: add the step's anchor gap, decide when the window is full. Never stops training."""
        gap = metrics.get("monitor/gap")
        if gap is None:
            return False
        self.gaps.append(float(gap))
        if len(self.gaps) < self.window:
            return False
        m, se = float(np.mean(self.gaps)), float(np.std(self.gaps, ddof=1) / np.sqrt(len(self.gaps)))
        old = self.handle.anchor_fraction or 0.0
        if abs(m) + se <= self.tolerance:
            action, new = "decay", max(self.floor, old * self.decay)
        elif m - se > self.max_gap:
            action, new = "rise", min(self.ceiling, old / self.decay**2)
        else:
            self.gaps.pop(0)  # undecided: slide the window
            return False
        self.gaps = []
        if new != old:
            self.handle.anchor_fraction = new
            self.events.append({"step": step, "action": action, "fraction": new, "gap_mean": m, "gap_se": se})
        return False

    def state_dict(self) -> dict[str, Any]:
        return {"gaps": list(self.gaps), "events": list(self.events)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.gaps, self.events = [float(g) for g in state["gaps"]], list(state["events"])
