"""Inverse-Variance Denoising: how much more an anchor group's real-reward gradient is worth.

For each complete anchor group the weighter measures the *within-group disagreement*
between calibrated world-model scores ``w`` and true scores ``t`` of its members,

    d = mean_i ((w_i - mean w) - (t_i - mean t))^2 / var(t),

i.e. the residual variance of the calibrated world model that survives GRPO's
within-group centring, relative to the signal (the true scores' within-group variance).
Members with a ``None`` on either side are left out; a group with fewer than two known
members, or whose true scores are equal up to rounding (degenerate: no signal to compare
against; ``std(t) <= DEGENERATE_STD``, i.e. ``var(t) <= 1e-12``), is skipped. The tolerance
matters: a group like ``[.5, .5, .5, .5 + 1e-9]`` has ``var(t) ~ 2e-19``, and dividing by it
would turn any world-model disagreement into a huge ``d`` that pins the weight at its clip.
An EMA with half-life ``half_life`` (in observed groups) tracks ``d``. After
``freeze_after`` observations the scale constant ``c`` is frozen so that the weight is
exactly ``weight_at_freeze`` then; afterwards

    anchor_weight = clip(1 + c * ema, 1, max_weight),

which is the paper's rule rho = 1 + eta^2 / eta^2_cal. :attr:`InverseVarianceWeighter.weight_se`
is its uncertainty: the standard error of the EMA (from an EMA of ``d^2`` with the same
half-life, for an EMA's effective sample of ``(2 - alpha) / alpha`` groups) carried through the
same map. Before the freeze the weight is
exactly 1.0. If the EMA is exactly 0 at ``freeze_after`` (a perfect world model), the
freeze waits for the first non-zero EMA. A disagreement below :data:`ROUNDING_TOL` is
rounding, not disagreement, and counts as exactly 0: an isotonic map fitted on a perfect
world model's pairs reproduces the true scores up to ~1e-17, and freezing the scale on such
an EMA would let the next rounding residual pin the weight at ``max_weight``.

Classes: :class:`InverseVarianceWeighter`. Constants: :data:`DEGENERATE_STD`, :data:`ROUNDING_TOL`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["InverseVarianceWeighter", "DEGENERATE_STD", "ROUNDING_TOL"]

_STATE_VERSION = 1

#: Groups whose true scores have a (population) standard deviation at or below this are
#: degenerate (the same tolerance as the ``eps`` of :func:`agents.grpo.group_advantages`).
DEGENERATE_STD = 1e-6

#: Normalised disagreements below this are floating-point rounding and count as exactly 0.
ROUNDING_TOL = 1e-12


class InverseVarianceWeighter:
    """EMA of calibrated-vs-true within-group disagreement, turned into an anchor weight.

    Args:
        half_life: EMA half-life, in observed (non-skipped) anchor groups.
        freeze_after: observations before the scale constant is frozen.
        weight_at_freeze: the weight at the moment of the freeze (> 1).
        max_weight: upper clip of the weight.

    >>> w = InverseVarianceWeighter(freeze_after=2)
    >>> w.observe([0.1, 0.5, 0.9], [0.0, 0.5, 1.0]), w.weight
    (True, 1.0)
    >>> w.observe([0.3, 0.3], [0.2, 0.2])  # degenerate: no within-group signal
    False
    >>> w.observe([0.1, 0.9, 0.5, 0.5], [0.5, 0.5, 0.5, 0.5 + 1e-9])  # equal up to rounding: degenerate too
    False
    >>> w.observe([0.1, 0.5, 0.9], [0.0, 0.5, 1.0]), w.weight
    (True, 2.0)
    """

    def __init__(
        self,
        half_life: float = 64.0,
        freeze_after: int = 32,
        weight_at_freeze: float = 2.0,
        max_weight: float = 4.0,
    ) -> None:
        if not isinstance(half_life, (int, float)) or not half_life > 0:
            raise ValueError(f"half_life must be > 0, got {half_life!r}")
        if not isinstance(freeze_after, int) or freeze_after < 1:
            raise ValueError(f"freeze_after must be an int >= 1, got {freeze_after!r}")
        if not isinstance(weight_at_freeze, (int, float)) or not weight_at_freeze > 1.0:
            raise ValueError(f"weight_at_freeze must be > 1, got {weight_at_freeze!r}")
        if not isinstance(max_weight, (int, float)) or not max_weight >= weight_at_freeze:
            raise ValueError(f"max_weight must be >= weight_at_freeze ({weight_at_freeze}), got {max_weight!r}")
        self.half_life = float(half_life)
        self.freeze_after = freeze_after
        self.weight_at_freeze = float(weight_at_freeze)
        self.max_weight = float(max_weight)
        self._alpha = 1.0 - 0.5 ** (1.0 / self.half_life)
        self.ema: float | None = None
        self.ema_sq: float | None = None  # EMA of d^2: the spread behind weight_se
        self.n_observed = 0
        self.n_degenerate = 0
        self.ema_at_freeze: float | None = None

    @property
    def frozen(self) -> bool:
        """True once the scale constant is frozen (the weight may then leave 1.0)."""
        return self.ema_at_freeze is not None

    @property
    def scale(self) -> float | None:
        """The frozen scale constant ``c`` (``None`` before the freeze)."""
        if self.ema_at_freeze is None:
            return None
        return (self.weight_at_freeze - 1.0) / self.ema_at_freeze

    @property
    def weight(self) -> float:
        """``clip(1 + c * ema, 1, max_weight)``; exactly 1.0 before the freeze."""
        if self.ema_at_freeze is None:
            return 1.0
        # (w_f - 1) * (ema / ema_f) rather than c * ema: at the freeze ema / ema_f is
        # exactly 1.0 in floating point, so the weight is exactly weight_at_freeze.
        assert self.ema is not None  # the EMA exists once the scale is frozen
        raw = 1.0 + (self.weight_at_freeze - 1.0) * (self.ema / self.ema_at_freeze)
        return float(min(max(raw, 1.0), self.max_weight))

    @property
    def weight_se(self) -> float | None:
        """Standard error of :attr:`weight` from the EMA's own noise (``None`` before the
        freeze, when the weight is exactly 1.0 by rule; 0 where the weight sits at a clip)."""
        if self.ema_at_freeze is None or self.ema is None or self.ema_sq is None:
            return None
        if self.weight in (1.0, self.max_weight):
            return 0.0
        variance = max(self.ema_sq - self.ema**2, 0.0)
        se_ema = float(np.sqrt(variance * self._alpha / (2.0 - self._alpha)))
        return (self.weight_at_freeze - 1.0) * se_ema / self.ema_at_freeze

    @staticmethod
    def disagreement(calibrated: Sequence[float | None], true: Sequence[float | None]) -> float | None:
        """The normalised within-group disagreement ``d`` of one group, or ``None`` if skipped."""
        if len(calibrated) != len(true):
            raise ValueError(f"calibrated ({len(calibrated)}) and true ({len(true)}) scores differ in length")
        known = [(w, t) for w, t in zip(calibrated, true) if w is not None and t is not None]
        if len(known) < 2:
            return None
        arr = np.asarray(known, dtype=float)
        w, t = arr[:, 0], arr[:, 1]
        var_t = float(np.var(t))
        if var_t <= DEGENERATE_STD**2:  # degenerate: equal up to rounding, no signal to compare against
            return None
        resid = (w - w.mean()) - (t - t.mean())
        d = float(np.mean(resid**2) / var_t)
        return 0.0 if d < ROUNDING_TOL else d

    def observe(self, calibrated: Sequence[float | None], true: Sequence[float | None]) -> bool:
        """Feed one complete anchor group. Returns False if it was skipped."""
        d = self.disagreement(calibrated, true)
        if d is None:
            self.n_degenerate += 1
            return False
        self.ema = d if self.ema is None else self.ema + self._alpha * (d - self.ema)
        self.ema_sq = d * d if self.ema_sq is None else self.ema_sq + self._alpha * (d * d - self.ema_sq)
        self.n_observed += 1
        if self.ema_at_freeze is None and self.n_observed >= self.freeze_after and self.ema > 0.0:
            self.ema_at_freeze = self.ema
        return True

    def state_dict(self) -> dict[str, Any]:
        """JSON-serialisable state: config, EMA, counters and the frozen scale."""
        return {
            "version": _STATE_VERSION,
            "config": {
                "half_life": self.half_life,
                "freeze_after": self.freeze_after,
                "weight_at_freeze": self.weight_at_freeze,
                "max_weight": self.max_weight,
            },
            "ema": self.ema,
            "ema_sq": self.ema_sq,
            "n_observed": self.n_observed,
            "n_degenerate": self.n_degenerate,
            "ema_at_freeze": self.ema_at_freeze,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output (the config must match)."""
        if state.get("version") != _STATE_VERSION:
            raise ValueError(f"InverseVarianceWeighter state version {state.get('version')!r} != {_STATE_VERSION}")
        mine = self.state_dict()["config"]
        if state["config"] != mine:
            raise ValueError(f"InverseVarianceWeighter config mismatch: saved {state['config']!r}, this one {mine!r}")
        self.ema = None if state["ema"] is None else float(state["ema"])
        self.ema_sq = None if state.get("ema_sq") is None else float(state["ema_sq"])  # absent before weight_se
        self.n_observed = int(state["n_observed"])
        self.n_degenerate = int(state["n_degenerate"])
        self.ema_at_freeze = None if state["ema_at_freeze"] is None else float(state["ema_at_freeze"])
