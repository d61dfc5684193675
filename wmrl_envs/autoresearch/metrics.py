"""Evaluation metrics with a direction, as used by AutoResearch leaderboards.

Every metric takes the true labels/values and the submission's prediction array and
returns a float. :data:`METRICS` maps a metric name to its :class:`Metric` record
(direction, what kind of prediction it expects).

Classes: :class:`Metric`. Functions: :func:`get_metric`, :func:`score`.
Constants: :data:`METRICS`, :data:`METRICS_FOR_TYPE`.

>>> get_metric("rmse").higher_is_better
False
>>> round(score("accuracy", ["a", "b", "b"], ["a", "b", "a"]), 3)
0.667
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
from sklearn import metrics as skm

__all__ = ["Metric", "METRICS", "METRICS_FOR_TYPE", "get_metric", "score"]

# Kaggle convention: probabilities are clipped away from 0/1 so one confident miss
# costs a large but finite amount.
_EPS = 1e-15

Prediction = Literal["label", "proba", "value"]


@dataclass(frozen=True)
class Metric:
    """A metric and how to read it.

    Attributes:
        name: registry key.
        higher_is_better: direction used for ranking on the leaderboard.
        prediction: ``"label"`` (class labels), ``"proba"`` (probabilities: a vector of
            P(positive) for binary tasks, an ``(n, n_classes)`` matrix for multiclass) or
            ``"value"`` (numbers, regression).
        description: one line shown to agents.
    """

    name: str
    higher_is_better: bool
    prediction: Prediction
    description: str
    fn: Callable[..., float]

    def __call__(self, y_true: Sequence, y_pred: Sequence | np.ndarray, *, classes: Sequence | None = None) -> float:
        return float(self.fn(np.asarray(y_true), np.asarray(y_pred), classes))


def _accuracy(y, p, classes):
    return skm.accuracy_score(y.astype(str), p.astype(str))


def _macro_f1(y, p, classes):
    labels = [str(c) for c in classes] if classes is not None else None
    return skm.f1_score(y.astype(str), p.astype(str), average="macro", labels=labels, zero_division=0)


def _roc_auc(y, p, classes):
    # Binary only: ``p`` is P(positive), ``classes[1]`` the positive class.
    if classes is None or len(classes) != 2:
        raise ValueError("roc_auc needs exactly two classes (negative, positive)")
    return skm.roc_auc_score((y.astype(str) == str(classes[1])).astype(int), p.astype(float))


def _log_loss(y, p, classes):
    if classes is None:
        raise ValueError("log_loss needs the class list")
    labels = [str(c) for c in classes]
    p = p.astype(float)
    if p.ndim == 1:  # binary: P(positive)
        p = np.column_stack([1.0 - p, p])
    p = np.clip(p, _EPS, 1 - _EPS)
    p = p / p.sum(axis=1, keepdims=True)
    index = {c: i for i, c in enumerate(labels)}
    rows = np.array([index[v] for v in y.astype(str)])
    return float(-np.mean(np.log(p[np.arange(len(rows)), rows])))


def _rmse(y, p, classes):
    return float(np.sqrt(np.mean((y.astype(float) - p.astype(float)) ** 2)))


def _mae(y, p, classes):
    return float(np.mean(np.abs(y.astype(float) - p.astype(float))))


def _rmsle(y, p, classes):
    y, p = y.astype(float), p.astype(float)
    if (p < 0).any() or (y < 0).any():
        raise ValueError("rmsle is undefined for negative values")
    return float(np.sqrt(np.mean((np.log1p(y) - np.log1p(p)) ** 2)))


def _r2(y, p, classes):
    return float(skm.r2_score(y.astype(float), p.astype(float)))


METRICS: dict[str, Metric] = {
    m.name: m
    for m in (
        Metric("accuracy", True, "label", "fraction of rows whose predicted class equals the true class", _accuracy),
        Metric("macro_f1", True, "label", "F1 score averaged over classes with equal weight", _macro_f1),
        Metric("roc_auc", True, "proba", "area under the ROC curve of P(positive class)", _roc_auc),
        Metric(
            "log_loss",
            False,
            "proba",
            "mean negative log-likelihood of the true class (probabilities clipped to [1e-15, 1-1e-15] and renormalised)",
            _log_loss,
        ),
        Metric("rmse", False, "value", "root mean squared error", _rmse),
        Metric("mae", False, "value", "mean absolute error", _mae),
        Metric("rmsle", False, "value", "root mean squared error of log(1 + value); predictions must be >= 0", _rmsle),
        Metric("r2", True, "value", "coefficient of determination R^2", _r2),
    )
}

#: Metrics that make sense for each task type.
METRICS_FOR_TYPE: dict[str, tuple[str, ...]] = {
    "binary": ("accuracy", "macro_f1", "roc_auc", "log_loss"),
    "multiclass": ("accuracy", "macro_f1", "log_loss"),
    "regression": ("rmse", "mae", "rmsle", "r2"),
}


def get_metric(name: str) -> Metric:
    """The :class:`Metric` called ``name``; a clear error listing the known names otherwise."""
    try:
        return METRICS[name]
    except KeyError:
        raise ValueError(f"unknown metric {name!r}; known metrics: {sorted(METRICS)}") from None


def score(name: str, y_true: Sequence, y_pred: Sequence | np.ndarray, *, classes: Sequence | None = None) -> float:
    """Compute metric ``name`` (see :data:`METRICS`)."""
    return get_metric(name)(y_true, y_pred, classes=classes)
