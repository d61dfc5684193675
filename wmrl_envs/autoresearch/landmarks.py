"""Landmark meta-features: how cheap learners fare on a task's *public* training table.

Landmarking describes a table by the cross-validated scores of a few cheap learners. It is a
feature a world model may use: it reads only the training table an agent is given (never the
held-out answers) and is computed once per task, not per solution (~1-6 s). It tells the
model what the table rewards -- a linear fit, a shallow or a deep tree, few or many neighbours,
an ensemble, boosting, a small network -- which the column statistics do not. Two blocks: each
learner's gap to the best in R^2 or accuracy (:data:`LANDMARK_KEYS`), and where it lands
between a constant predictor and the best learner on the task's *own* metric
(:data:`METRIC_LANDMARK_KEYS`), which the featurizer maps onto the script's own estimators
(:func:`~wmrl_envs.world_models.features.landmark_features`). Together they are the largest
gain in leave-datasets-out ranking fidelity measured here (``benchmarks/fidelity_landmarks.py``,
docs/results.md).

:func:`grading_context <wmrl_envs.autoresearch.grading.grading_context>` puts them into every
grading context's ``meta`` (:func:`task_landmarks`, cached per task): they are a fact about the
task, computed by the env from its public data, which world models condition on (execution
logs written before carry none: :mod:`wmrl_envs.world_models.landmarks` fills them from a
shipped table).

Functions: :func:`landmarks`, :func:`task_landmarks`. Constants: :data:`LANDMARK_KEYS`,
:data:`METRIC_LANDMARK_KEYS`, :data:`METRIC_LEARNERS`.

>>> rng = np.random.default_rng(0)
>>> df = pd.DataFrame({"a": rng.normal(size=300), "b": rng.normal(size=300)})
>>> df["y"] = 3 * df["a"] + rng.normal(scale=0.1, size=300)
>>> lm = landmarks(df, "y", "regression")
>>> sorted(lm) == sorted(LANDMARK_KEYS), lm["landmark_linear"], lm["landmark_gain"] > 0.9, lm["landmark_tree4"] < 0
(True, 0.0, True, True)
>>> lm = landmarks(df, "y", "regression", metric="rmse")
>>> lm["landmark_metric_linear"], lm["landmark_metric_skill"] > 0.9, "landmark_metric_naive_bayes" in lm
(1.0, True, False)
"""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

__all__ = [
    "LANDMARK_KEYS",
    "METRIC_LANDMARK_KEYS",
    "METRIC_LEARNERS",
    "landmarks",
    "task_landmarks",
]

_LEARNERS = ("linear", "tree4", "knn15", "forest")
#: Learners scored by the task's metric: one for each estimator family the solutions use
#: (:func:`~wmrl_envs.world_models.features.landmark_features` maps a script onto them).
#: ``naive_bayes`` only on classification tables.
METRIC_LEARNERS = (*_LEARNERS, "deeptree", "knn3", "boosting", "mlp", "naive_bayes")
#: ``landmark_<learner>``: the learner's CV score (R^2 or accuracy) minus the best of the four
#: (0 for the best); ``landmark_gain``: the best learner's score minus a constant predictor's.
LANDMARK_KEYS: tuple[str, ...] = (*(f"landmark_{n}" for n in _LEARNERS), "landmark_gain")
#: ``landmark_metric_<learner>``: where the learner lands between a constant predictor (0) and
#: the best learner (1) on the task's own metric (clipped to [-1, 1]); ``landmark_metric_skill``:
#: the best learner's unitless gain over the constant (its score minus the constant's, or the
#: share of the constant's error it removes where lower is better; <= 0 where no learner beats
#: the constant, and then the skill alone).
METRIC_LANDMARK_KEYS: tuple[str, ...] = (*(f"landmark_metric_{n}" for n in METRIC_LEARNERS), "landmark_metric_skill")


def _design(df: pd.DataFrame, max_levels: int = 10) -> np.ndarray:
    num = df.select_dtypes("number")
    parts = [num.fillna(num.median()).astype(float)]
    for c in df.columns.difference(num.columns):
        top = df[c].value_counts().index[:max_levels]
        parts.append(pd.get_dummies(df[c].where(df[c].isin(top), "other"), prefix=str(c), dtype=float))
    x = pd.concat(parts, axis=1).to_numpy(dtype=float)
    return np.nan_to_num(x) if x.shape[1] else np.zeros((len(df), 1))


def _learners(regression: bool, seed: int) -> dict[str, Any]:
    from sklearn.dummy import DummyClassifier, DummyRegressor
    from sklearn.ensemble import (
        HistGradientBoostingClassifier,
        HistGradientBoostingRegressor,
        RandomForestClassifier,
        RandomForestRegressor,
    )
    from sklearn.linear_model import LogisticRegression, Ridge
    from sklearn.naive_bayes import GaussianNB
    from sklearn.neighbors import KNeighborsClassifier, KNeighborsRegressor
    from sklearn.neural_network import MLPClassifier, MLPRegressor
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler
    from sklearn.tree import DecisionTreeClassifier, DecisionTreeRegressor

    def scaled(est: Any) -> Any:
        return make_pipeline(StandardScaler(), est)

    pairs = {  # learner: (regressor, classifier); None: not on that kind of table
        "constant": (DummyRegressor(), DummyClassifier()),
        "linear": (scaled(Ridge()), scaled(LogisticRegression(max_iter=300))),
        "tree4": (
            DecisionTreeRegressor(max_depth=4, random_state=seed),
            DecisionTreeClassifier(max_depth=4, random_state=seed),
        ),
        "knn15": (scaled(KNeighborsRegressor(15)), scaled(KNeighborsClassifier(15))),
        "forest": (
            RandomForestRegressor(50, max_depth=8, random_state=seed, n_jobs=1),
            RandomForestClassifier(50, max_depth=8, random_state=seed, n_jobs=1),
        ),
        "deeptree": (DecisionTreeRegressor(random_state=seed), DecisionTreeClassifier(random_state=seed)),
        "knn3": (scaled(KNeighborsRegressor(3)), scaled(KNeighborsClassifier(3))),
        "boosting": (
            HistGradientBoostingRegressor(max_iter=100, random_state=seed),
            HistGradientBoostingClassifier(max_iter=100, random_state=seed),
        ),
        "mlp": (
            scaled(MLPRegressor((64,), max_iter=200, random_state=seed)),
            scaled(MLPClassifier((64,), max_iter=200, random_state=seed)),
        ),
        "naive_bayes": (None, GaussianNB()),
    }
    return {n: est for n, (reg, cls) in pairs.items() if (est := reg if regression else cls) is not None}


def landmarks(  # noqa: C901 -- complexity over 15 before the limit (issue 26)
    train: pd.DataFrame,
    target: str,
    task_type: str,
    drop: Sequence[str] = (),
    max_rows: int = 2000,
    seed: int = 0,
    metric: str | None = None,
    classes: Sequence[str] | None = None,
) -> dict[str, float]:
    """The landmarks of a training table: :data:`LANDMARK_KEYS`, and with ``metric`` (a name
    from :data:`~wmrl_envs.autoresearch.metrics.METRICS`) :data:`METRIC_LANDMARK_KEYS`.

    Each learner of :data:`METRIC_LEARNERS` (a linear model, depth-4 and unlimited trees, 3
    and 15 nearest neighbours, a 50-tree forest, boosted trees, a small MLP, naive Bayes) is
    cross-validated once (3 folds, at most ``max_rows`` rows; numeric columns
    median-imputed, categoricals one-hot over their 10 commonest levels; regression fitted
    on ``log1p`` of the target where the metric is ``rmsle``, as a solution would), and its
    out-of-fold predictions are scored twice: R^2 in the fitted space (clipped at -1) or
    accuracy, and the task's metric (probabilities where it scores them, the positive
    class from ``classes[1]``). A learner that fails scores -1 on the first and is left out
    of the second; a metric that fails (e.g. ``rmsle`` of a negative target) leaves the
    metric keys out: unknown, never zero. ``drop``: id columns."""
    from sklearn.model_selection import KFold, StratifiedKFold, cross_val_predict
    from threadpoolctl import threadpool_limits

    from wmrl_envs.autoresearch.metrics import get_metric

    if target not in train.columns:
        raise ValueError(f"landmarks: target {target!r} is not a column of the table ({list(train.columns)[:20]})")
    scorer = get_metric(metric) if metric is not None else None
    df = train.drop(columns=[c for c in drop if c in train.columns and c != target])
    if len(df) > max_rows:
        df = df.sample(max_rows, random_state=seed)
    y_col = df.pop(target)
    x = _design(df)
    regression = task_type == "regression"
    cv: Any
    if regression:
        y = y_col.astype(float).to_numpy()
        log_target = metric == "rmsle" and bool((y >= 0).all())
        fit_y = np.log1p(y) if log_target else y
        cv = KFold(3, shuffle=True, random_state=seed)
    else:
        y = fit_y = y_col.astype(str).to_numpy()
        labels = sorted(set(y))  # the column order of predict_proba
        order = [str(c) for c in classes] if classes is not None else labels
        cv = StratifiedKFold(3, shuffle=True, random_state=seed) if y_col.value_counts().min() >= 3 else KFold(3)
    generic: dict[str, float] = {}
    scored: dict[str, float] = {}  # the task's metric, higher is better
    with warnings.catch_warnings(), threadpool_limits(1):
        warnings.simplefilter("ignore")
        for name, est in _learners(regression, seed).items():
            try:
                p = cross_val_predict(est, x, fit_y, cv=cv, method="predict" if regression else "predict_proba")
            except Exception:  # noqa: BLE001 -- any learner may fail on some table; it is then unknown
                generic[name] = -1.0
                continue
            if regression:
                generic[name] = max(-1.0, float(1.0 - np.mean((fit_y - p) ** 2) / max(np.var(fit_y), 1e-300)))
                pred: Any = np.clip(np.expm1(p), 0, None) if log_target else p
            else:
                pred_labels = np.asarray(labels)[p.argmax(axis=1)]
                generic[name] = float(np.mean(pred_labels == y))
                cols = [labels.index(c) if c in labels else None for c in order]
                proba = np.column_stack([p[:, i] if i is not None else np.zeros(len(p)) for i in cols])
                if scorer is None or scorer.prediction == "label":
                    pred = pred_labels
                else:  # probabilities: P(classes[1]) on a binary task, a column per class otherwise
                    pred = proba[:, 1] if task_type == "binary" else proba
            if scorer is not None:
                try:
                    v = scorer(y, pred, classes=None if regression else order)
                except ValueError:
                    continue
                if math.isfinite(v):
                    scored[name] = v if scorer.higher_is_better else -v
    best = max(generic.get(n, -1.0) for n in _LEARNERS)
    out = {f"landmark_{n}": round(generic.get(n, -1.0) - best, 6) for n in _LEARNERS}
    out["landmark_gain"] = round(best - generic.get("constant", -1.0), 6)
    if scorer is not None and "constant" in scored and len(scored) > 1:
        const = scored["constant"]
        top = max(v for n, v in scored.items() if n != "constant")
        if top - const > 1e-12:  # where no learner beats the constant, where they land is undefined
            for n in METRIC_LEARNERS:
                if n in scored:
                    out[f"landmark_metric_{n}"] = round(float(np.clip((scored[n] - const) / (top - const), -1, 1)), 6)
        if scorer.higher_is_better or const < 0:  # an error metric's constant error is > 0
            out["landmark_metric_skill"] = round(top - const if scorer.higher_is_better else 1.0 - top / const, 6)
    return out


@functools.lru_cache(maxsize=512)
def _cached(
    task_id: str, root: Path, target: str, task_type: str, id_column: str, metric: str, classes: tuple[str, ...] | None
) -> tuple[tuple[str, float], ...]:
    # A failure is cached too (as no landmarks, warned once): grading a task calls this per request.
    try:
        train = pd.read_csv(root / "public" / "train.csv", low_memory=False)  # as Task.read_train
        drop = [id_column] if id_column else []
        return tuple(landmarks(train, target, task_type, drop=drop, metric=metric, classes=classes).items())
    except (ValueError, TypeError, KeyError, OSError) as e:
        warnings.warn(f"task {task_id!r}: no landmark features ({type(e).__name__}: {e})", stacklevel=3)
        return ()


def task_landmarks(task: Any) -> dict[str, float]:
    """:func:`landmarks` of a task's public training table, computed once per task directory;
    ``{}`` (unknown, never zeros) where the table defeats them, with a warning: grading goes on."""
    classes = tuple(task.classes) if task.classes is not None else None
    return dict(
        _cached(task.task_id, Path(task.root), task.target, task.task_type, task.id_column or "", task.metric, classes)
    )
