"""Online Debiasing: a monotone map from world-model scores to true scores.

The map is an increasing isotonic regression (scikit-learn ``IsotonicRegression``,
``out_of_bounds="clip"``) fitted on anchor pairs ``(raw wm_score, true_score)``. It is the
identity until ``start_pairs`` pairs have arrived, then refitted every ``refit_every``
new pairs on the last ``max_pairs`` pairs (FIFO), so it follows a drifting bias. The
fitted map is stored as its breakpoints and applied by linear interpolation with clipped
ends, which is exactly what ``IsotonicRegression.predict`` computes; this keeps the
state JSON-serialisable and the map bit-identical after a resume.

**When to start.** ``start_rule="count"`` (the paper's) fits first at ``start_pairs`` pairs.
``start_rule="cv"`` lets the data decide: from ``start_pairs`` pairs on (a floor, e.g. 16),
each time new pairs have arrived it cross-validates the map on the pairs so far (5
contiguous folds in arrival order, so a group's members stay together and later pairs are
predicted from earlier ones as well as the reverse) and fits once the map's held-out
absolute error beats the identity's by more than one standard error of the paired
difference. A world model whose raw scores are already right never gets a map it does not
need; a biased one gets it as soon as the evidence says so, whatever the budget.

A map needs at least two distinct world-model scores: fitted on pairs that all share one
``wm_score``, an isotonic regression is a constant (every score would be mapped to the mean
true score, erasing all ranking). Such a fit is refused and the current map (the identity
before the first fit) is kept; the fit stays due and happens once a second distinct score
has arrived.

:meth:`OnlineDebiaser.add` refits as soon as a fit is due. A caller that must not change the
map at an arbitrary moment (the calibration wrappers: every member of a GRPO group has to be
calibrated by the same map) passes ``refit=False`` and calls :meth:`OnlineDebiaser.refit_if_due`
at its step boundaries.

Classes: :class:`OnlineDebiaser`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
from sklearn.isotonic import IsotonicRegression

__all__ = ["OnlineDebiaser", "START_RULES", "cross_validated_gain"]

#: When the first isotonic fit happens (see the module docstring).
START_RULES = ("count", "cv")

#: Folds of the ``cv`` start rule.
_CV_FOLDS = 5

_STATE_VERSION = 1


class OnlineDebiaser:
    """Isotonic calibration of world-model scores, refitted as anchor pairs arrive.

    Args:
        start_pairs: pairs needed before the first fit (identity until then); with
            ``start_rule="cv"`` the fewest pairs the first cross-validation looks at.
        refit_every: refit after this many new pairs since the last fit.
        max_pairs: FIFO cap on the pairs kept.
        start_rule: ``"count"`` or ``"cv"`` (see the module docstring).

    Pairs with a ``None`` on either side are unknown and are skipped (counted in
    :attr:`n_skipped`).

    >>> d = OnlineDebiaser(start_pairs=3, refit_every=1)
    >>> d.transform([0.2, None])
    [0.2, None]
    >>> d.add([(0.2, 0.0), (0.5, 0.5), (0.8, 1.0)])
    True
    >>> d.transform([0.5, 0.9])
    [0.5, 1.0]
    """

    def __init__(
        self, start_pairs: int = 200, refit_every: int = 64, max_pairs: int = 5000, start_rule: str = "count"
    ) -> None:
        for name, value in (("start_pairs", start_pairs), ("refit_every", refit_every), ("max_pairs", max_pairs)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        if max_pairs < start_pairs:
            raise ValueError(f"max_pairs ({max_pairs}) must be >= start_pairs ({start_pairs})")
        if start_rule not in START_RULES:
            raise ValueError(f"start_rule must be one of {START_RULES}, got {start_rule!r}")
        self.start_rule = start_rule
        #: The last cross-validation of the ``cv`` start rule (``None`` before one): pairs,
        #: identity and map held-out MAE, their paired difference and its standard error.
        self.last_cv: dict[str, float] | None = None
        self._checked_at = -1  # n_seen at the last cross-validation
        self.start_pairs = start_pairs
        self.refit_every = refit_every
        self.max_pairs = max_pairs
        self._pairs: deque[tuple[float, float]] = deque(maxlen=max_pairs)
        self.n_seen = 0  # known pairs ever added (the FIFO keeps the last max_pairs)
        self.n_skipped = 0
        self.n_fits = 0
        self._since_fit = 0
        self._x: np.ndarray | None = None  # breakpoints of the fitted map
        self._y: np.ndarray | None = None

    @property
    def fitted(self) -> bool:
        """True once the map has been fitted (before that it is the identity)."""
        return self._x is not None

    @property
    def pairs(self) -> list[tuple[float, float]]:
        """The pairs currently kept, oldest first."""
        return list(self._pairs)

    @property
    def due(self) -> bool:
        """True when a fit is due: ``start_pairs`` pairs before the first fit, then
        ``refit_every`` new pairs since the last one."""
        if self.fitted:
            return self._since_fit >= self.refit_every
        if len(self._pairs) < self.start_pairs:
            return False
        if self.start_rule == "count":
            return True
        if self._checked_at != self.n_seen:  # new evidence since the last look
            self._checked_at = self.n_seen
            self.last_cv = cross_validated_gain(self.pairs)
        return self.last_cv is not None and self.last_cv["gain"] > self.last_cv["gain_se"]

    def add(self, pairs: Iterable[Sequence[float | None]], *, refit: bool = True) -> bool:
        """Add ``(wm_score, true_score)`` pairs. With ``refit=True`` (default) refit when due;
        ``refit=False`` only stores them (see :meth:`refit_if_due`). Returns True if it refitted."""
        for pair in pairs:
            if len(pair) != 2:
                raise ValueError(f"a pair is (wm_score, true_score), got {pair!r}")
            wm, true = pair
            if wm is None or true is None:
                self.n_skipped += 1
                continue
            for name, v in (("wm_score", wm), ("true_score", true)):
                if not 0.0 <= float(v) <= 1.0:
                    raise ValueError(f"pair {name} must be in [0, 1] or None, got {v!r}")
            self._pairs.append((float(wm), float(true)))
            self.n_seen += 1
            self._since_fit += 1
        return self.refit_if_due() if refit else False

    def refit_if_due(self) -> bool:
        """Refit if a fit is :attr:`due`; returns True if the map was refitted."""
        return self.refit() if self.due else False

    def refit(self) -> bool:
        """Fit the map on the kept pairs now. Returns False (map unchanged) when the pairs
        hold fewer than two distinct world-model scores (see the module docstring)."""
        if not self._pairs:
            raise ValueError("OnlineDebiaser.refit: no pairs to fit")
        data = np.asarray(self._pairs, dtype=float)
        if np.unique(data[:, 0]).size < 2:
            return False
        iso = IsotonicRegression(y_min=0.0, y_max=1.0, increasing=True, out_of_bounds="clip")
        iso.fit(data[:, 0], data[:, 1])
        self._x = np.asarray(iso.X_thresholds_, dtype=float)
        self._y = np.asarray(iso.y_thresholds_, dtype=float)
        self.n_fits += 1
        self._since_fit = 0
        return True

    def transform(self, scores: Sequence[float | None]) -> list[float | None]:
        """Calibrated scores (identity before the first fit; ``None`` stays ``None``)."""
        out: list[float | None] = [None if s is None else float(s) for s in scores]
        if self._x is None or self._y is None:  # not fitted
            return out
        known = [i for i, s in enumerate(out) if s is not None]
        if known:
            mapped = np.interp([s for s in out if s is not None], self._x, self._y)
            for i, v in zip(known, np.clip(mapped, 0.0, 1.0).tolist()):
                out[i] = v
        return out

    def __call__(self, scores: Sequence[float | None]) -> list[float | None]:
        return self.transform(scores)

    def state_dict(self) -> dict[str, Any]:
        """JSON-serialisable state: config, kept pairs, counters and the fitted map."""
        return {
            "version": _STATE_VERSION,
            "config": {
                "start_pairs": self.start_pairs,
                "refit_every": self.refit_every,
                "max_pairs": self.max_pairs,
                # only when not the paper's rule: states saved before the rule existed still load
                **({"start_rule": self.start_rule} if self.start_rule != "count" else {}),
            },
            "pairs": [list(p) for p in self._pairs],
            "n_seen": self.n_seen,
            "n_skipped": self.n_skipped,
            "n_fits": self.n_fits,
            "since_fit": self._since_fit,
            "map": None if self._x is None or self._y is None else {"x": self._x.tolist(), "y": self._y.tolist()},
            "last_cv": self.last_cv,
            "checked_at": self._checked_at,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output (the config must match)."""
        if state.get("version") != _STATE_VERSION:
            raise ValueError(f"OnlineDebiaser state version {state.get('version')!r} != {_STATE_VERSION}")
        mine = self.state_dict()["config"]
        if state["config"] != mine:
            raise ValueError(f"OnlineDebiaser config mismatch: saved {state['config']!r}, this one {mine!r}")
        self._pairs = deque(((float(a), float(b)) for a, b in state["pairs"]), maxlen=self.max_pairs)
        self.n_seen = int(state["n_seen"])
        self.n_skipped = int(state["n_skipped"])
        self.n_fits = int(state["n_fits"])
        self._since_fit = int(state["since_fit"])
        fitted_map = state["map"]
        self._x = None if fitted_map is None else np.asarray(fitted_map["x"], dtype=float)
        self._y = None if fitted_map is None else np.asarray(fitted_map["y"], dtype=float)
        self.last_cv = state.get("last_cv")
        self._checked_at = int(state.get("checked_at", -1))


def cross_validated_gain(pairs: Sequence[tuple[float, float]], folds: int = _CV_FOLDS) -> dict[str, float] | None:
    """How much an isotonic map beats the identity out of fold on ``pairs`` ``(wm, true)``:
    ``{"pairs", "identity_mae", "map_mae", "gain", "gain_se"}`` (``gain`` = identity MAE - map
    MAE, ``gain_se`` its standard error over pairs), or ``None`` with fewer than ``2 * folds``
    pairs. Folds are contiguous in the order given; a training fold with a single distinct
    world-model score predicts with the identity (no map can be fitted on it).

    >>> wm = [i / 40 for i in range(40)]
    >>> cv = cross_validated_gain([(w, w**2) for w in wm])  # a strong monotone bias
    >>> cv["gain"] > cv["gain_se"] > 0
    True
    >>> rng = np.random.default_rng(0)
    >>> cv = cross_validated_gain([(w, float(np.clip(w + rng.normal(0, 0.05), 0, 1))) for w in wm])
    >>> cv["gain"] > cv["gain_se"]  # already calibrated: nothing to gain
    False
    """
    data = np.asarray(pairs, dtype=float).reshape(-1, 2)
    n = len(data)
    if n < 2 * folds:
        return None
    fold = (np.arange(n) * folds) // n
    mapped = data[:, 0].copy()
    for k in range(folds):
        test, train = fold == k, fold != k
        if np.unique(data[train, 0]).size < 2:
            continue
        iso = IsotonicRegression(y_min=0.0, y_max=1.0, increasing=True, out_of_bounds="clip")
        mapped[test] = iso.fit(data[train, 0], data[train, 1]).predict(data[test, 0])
    identity_err = np.abs(data[:, 0] - data[:, 1])
    map_err = np.abs(mapped - data[:, 1])
    diff = identity_err - map_err
    return {
        "pairs": float(n),
        "identity_mae": float(identity_err.mean()),
        "map_mae": float(map_err.mean()),
        "gain": float(diff.mean()),
        "gain_se": float(diff.std(ddof=1) / np.sqrt(n)),
    }
