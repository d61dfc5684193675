"""Landmark meta-features: how cheap learners fare on a task's *public* training table.

Landmarking describes a table by the cross-validated scores of a few cheap learners. It is a
feature a world model may use: it reads only the training table an agent is given (never the
held-out answers) and is computed once per task, not per solution (~0.5-1 s). It tells the
model what the table rewards -- a linear fit, a shallow tree, neighbours, an ensemble -- which
the column statistics do not, and it is the largest single gain in leave-datasets-out ranking
fidelity measured here (``benchmarks/fidelity_landmarks.py``, docs/results.md).

:func:`grading_context <wmrl_envs.autoresearch.grading.grading_context>` puts them into every
grading context's ``meta`` (:func:`task_landmarks`, cached per task). Execution logs written
before that carry none: :func:`with_landmarks` fills them from the shipped table of every
logged task (:func:`landmark_table`, ``landmark_table.json``), so a model can be fitted on old
logs (``wmrl-wm fit --landmarks``) and graded on live contexts alike.

Functions: :func:`landmarks`, :func:`task_landmarks`, :func:`landmark_table`,
:func:`with_landmarks`. Constants: :data:`LANDMARK_KEYS`, :data:`LANDMARK_TABLE`.

>>> rng = np.random.default_rng(0)
>>> df = pd.DataFrame({"a": rng.normal(size=300), "b": rng.normal(size=300)})
>>> df["y"] = 3 * df["a"] + rng.normal(scale=0.1, size=300)
>>> lm = landmarks(df, "y", "regression")
>>> sorted(lm) == sorted(LANDMARK_KEYS), lm["landmark_linear"], lm["landmark_gain"] > 0.9, lm["landmark_tree4"] < 0
(True, 0.0, True, True)
"""

from __future__ import annotations

import functools
import json
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from wmrl_envs.world_models.logs import LogRecord

__all__ = ["LANDMARK_KEYS", "LANDMARK_TABLE", "landmarks", "task_landmarks", "landmark_table", "with_landmarks"]

_LEARNERS = ("linear", "tree4", "knn15", "forest")
#: ``landmark_<learner>``: the learner's CV score minus the best learner's (0 for the best);
#: ``landmark_gain``: the best learner's score minus a constant predictor's.
LANDMARK_KEYS: tuple[str, ...] = (*(f"landmark_{n}" for n in _LEARNERS), "landmark_gain")
#: The shipped landmarks of every task in the shipped execution logs.
LANDMARK_TABLE = Path(__file__).parent / "landmark_table.json"


def _design(df: pd.DataFrame, max_levels: int = 10) -> np.ndarray:
    num = df.select_dtypes("number")
    parts = [num.fillna(num.median()).astype(float)]
    for c in df.columns.difference(num.columns):
        top = df[c].value_counts().index[:max_levels]
        parts.append(pd.get_dummies(df[c].where(df[c].isin(top), "other"), prefix=str(c), dtype=float))
    x = pd.concat(parts, axis=1).to_numpy(dtype=float)
    return np.nan_to_num(x) if x.shape[1] else np.zeros((len(df), 1))


def landmarks(
    train: pd.DataFrame, target: str, task_type: str, drop: Sequence[str] = (), max_rows: int = 2000, seed: int = 0
) -> dict[str, float]:
    """The landmarks (:data:`LANDMARK_KEYS`) of a training table: a linear model, a depth-4
    tree, 15 nearest neighbours and a 50-tree forest, 3-fold CV on at most ``max_rows`` rows
    (numeric columns median-imputed, categoricals one-hot over their 10 commonest levels).
    Scores are R^2 (clipped at -1) for regression, accuracy otherwise. ``drop``: id columns."""
    from sklearn.dummy import DummyClassifier, DummyRegressor
    from sklearn.ensemble import RandomForestClassifier, RandomForestRegressor
    from sklearn.linear_model import LogisticRegression, Ridge
    from sklearn.model_selection import KFold, StratifiedKFold, cross_val_score
    from sklearn.neighbors import KNeighborsClassifier, KNeighborsRegressor
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler
    from sklearn.tree import DecisionTreeClassifier, DecisionTreeRegressor

    if target not in train.columns:
        raise ValueError(f"landmarks: target {target!r} is not a column of the table ({list(train.columns)[:20]})")
    df = train.drop(columns=[c for c in drop if c in train.columns and c != target])
    if len(df) > max_rows:
        df = df.sample(max_rows, random_state=seed)
    y = df.pop(target)
    x = _design(df)
    regression = task_type == "regression"
    if regression:
        y = y.astype(float)
        learners: dict[str, Any] = {
            "constant": DummyRegressor(),
            "linear": make_pipeline(StandardScaler(), Ridge()),
            "tree4": DecisionTreeRegressor(max_depth=4, random_state=seed),
            "knn15": make_pipeline(StandardScaler(), KNeighborsRegressor(15)),
            "forest": RandomForestRegressor(50, max_depth=8, random_state=seed, n_jobs=1),
        }
        cv: Any = KFold(3, shuffle=True, random_state=seed)
    else:
        y = y.astype(str)
        learners = {
            "constant": DummyClassifier(),
            "linear": make_pipeline(StandardScaler(), LogisticRegression(max_iter=300)),
            "tree4": DecisionTreeClassifier(max_depth=4, random_state=seed),
            "knn15": make_pipeline(StandardScaler(), KNeighborsClassifier(15)),
            "forest": RandomForestClassifier(50, max_depth=8, random_state=seed, n_jobs=1),
        }
        cv = StratifiedKFold(3, shuffle=True, random_state=seed) if y.value_counts().min() >= 3 else KFold(3)
    scores = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name, est in learners.items():
            s = cross_val_score(est, x, y, cv=cv, scoring="r2" if regression else "accuracy", error_score=np.nan)
            scores[name] = max(-1.0, float(np.nanmean(s))) if np.isfinite(s).any() else -1.0
    best = max(scores[n] for n in _LEARNERS)
    out = {f"landmark_{n}": round(scores[n] - best, 6) for n in _LEARNERS}
    out["landmark_gain"] = round(best - scores["constant"], 6)
    return out


@functools.lru_cache(maxsize=512)
def _cached(task_id: str, root: Path, target: str, task_type: str, id_column: str) -> tuple[tuple[str, float], ...]:
    # A failure is cached too (as no landmarks, warned once): grading a task calls this per request.
    try:
        train = pd.read_csv(root / "public" / "train.csv", low_memory=False)  # as Task.read_train
        return tuple(landmarks(train, target, task_type, drop=[id_column] if id_column else []).items())
    except (ValueError, TypeError, KeyError, OSError) as e:
        warnings.warn(f"task {task_id!r}: no landmark features ({type(e).__name__}: {e})", stacklevel=3)
        return ()


def task_landmarks(task: Any) -> dict[str, float]:
    """:func:`landmarks` of a task's public training table, computed once per task directory;
    ``{}`` (unknown, never zeros) where the table defeats them, with a warning: grading goes on."""
    return dict(_cached(task.task_id, Path(task.root), task.target, task.task_type, task.id_column or ""))


@functools.lru_cache(maxsize=1)
def landmark_table(path: str | Path | None = None) -> Mapping[str, Mapping[str, float]]:
    """Task id -> landmarks of every task in the shipped execution logs (catalog and corpus)."""
    p = Path(path) if path is not None else LANDMARK_TABLE
    return json.loads(p.read_text()) if p.is_file() else {}


def with_landmarks(
    records: Sequence[LogRecord], table: Mapping[str, Mapping[str, float]] | None = None
) -> list[LogRecord]:
    """``records`` with landmarks in every context's ``meta`` where it has none, from ``table``
    (default :func:`landmark_table`); a task missing from the table is left as it is (its
    landmark features are unknown, never zero)."""
    table = landmark_table() if table is None else table
    out = []
    for r in records:
        meta = r.context.get("meta")
        lm = table.get(r.task_id)
        if lm is None or (isinstance(meta, Mapping) and "landmark_gain" in meta):
            out.append(r)
            continue
        out.append(replace(r, context={**r.context, "meta": {**(meta if isinstance(meta, Mapping) else {}), **lm}}))
    return out
