"""Bring your own task: turn any CSV into an AutoResearch task (Python call or CLI).

>>> import tempfile
>>> tmp = tempfile.TemporaryDirectory()
>>> csv = f"{tmp.name}/houses.csv"
>>> pd.DataFrame({"rooms": range(40), "price": [100.0 + 5 * i for i in range(40)]}).to_csv(csv, index=False)
>>> task = task_from_csv(csv, target="price", metric="rmsle", root=tmp.name)
>>> task.task_type, task.submission_columns
('regression', ['id', 'price'])
>>> tmp.cleanup()

The CSV is split (stratified for classification) into train and held-out rows; the
held-out targets go to ``private/answers.csv``. Task type and metric are inferred when
not given. ``leaderboard=True`` executes the small reference pool to rank submissions.

Functions: :func:`task_from_csv`, :func:`task_from_frame`, :func:`infer_task_type`.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pandas as pd
from sklearn.model_selection import train_test_split

from wmrl_envs.autoresearch.metrics import METRICS_FOR_TYPE
from wmrl_envs.autoresearch.procedural import default_task_cache
from wmrl_envs.autoresearch.tasks import Task, write_task

__all__ = ["task_from_csv", "task_from_frame", "infer_task_type", "DEFAULT_METRIC"]

#: Metric used when none is given.
DEFAULT_METRIC = {"binary": "roc_auc", "multiclass": "accuracy", "regression": "rmse"}
# A numeric target with at most this many distinct values is treated as class labels.
_MAX_NUMERIC_CLASSES = 10


def infer_task_type(y: pd.Series) -> str:
    """``binary`` for 2 values, ``multiclass`` for a few labels, else ``regression``."""
    values = y.dropna()
    k = values.nunique()
    if k == 2:
        return "binary"
    if pd.api.types.is_numeric_dtype(values) and k > _MAX_NUMERIC_CLASSES:
        return "regression"
    if k < 2:
        raise ValueError(f"target has {k} distinct value(s); nothing to predict")
    return "multiclass"


def task_from_frame(
    df: pd.DataFrame,
    target: str,
    *,
    task_id: str,
    root: str | Path | None = None,
    metric: str | None = None,
    task_type: str | None = None,
    id_column: str | None = None,
    test_fraction: float = 0.25,
    seed: int = 0,
    question: str | None = None,
    source: str = "user-supplied data",
    licence: str = "as supplied by the user",
    positive_class: Any = None,
    leaderboard: bool = False,
    executor: Any = None,
) -> Task:
    """Write a task from a DataFrame (see :func:`task_from_csv`)."""
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", task_id):
        raise ValueError(f"task_id may contain only letters, digits, '_', '.', '-'; got {task_id!r}")
    if target not in df.columns:
        raise ValueError(f"target column {target!r} not in the CSV; columns: {list(df.columns)}")
    if id_column is not None and id_column not in df.columns:
        raise ValueError(f"id column {id_column!r} not in the CSV; columns: {list(df.columns)}")
    if not 0 < test_fraction < 1:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    df = df.dropna(subset=[target]).reset_index(drop=True)
    task_type = task_type or infer_task_type(df[target])
    metric = metric or DEFAULT_METRIC[task_type]
    if metric not in METRICS_FOR_TYPE.get(task_type, ()):
        raise ValueError(
            f"metric {metric!r} does not fit a {task_type} task; choose one of {METRICS_FOR_TYPE.get(task_type)}"
        )
    stratify = df[target].astype(str) if task_type != "regression" else None
    train, test = train_test_split(df, test_size=test_fraction, random_state=seed, stratify=stratify)
    task = write_task(
        Path(root) if root is not None else default_task_cache(),
        task_id,
        train.reset_index(drop=True),
        test.reset_index(drop=True),
        target=target,
        task_type=task_type,
        metric=metric,
        id_column=id_column or "id",
        question=question or f"Predict `{target}`.",
        source=source,
        licence=licence,
        origin="byo",
        positive_class=positive_class,
    )
    if leaderboard:
        from wmrl_envs.autoresearch.leaderboard import LeaderboardConfig, build_leaderboards

        build_leaderboards([task], executor, LeaderboardConfig(size="small", broken=False, write_logs=False))
    return task


def task_from_csv(csv_path: str | Path, target: str, *, task_id: str | None = None, **kwargs: Any) -> Task:
    """Turn ``csv_path`` into a task named ``task_id`` (default: the file stem).

    Keyword arguments: ``root`` (default ``$WMRL_TASK_CACHE`` or ``~/.cache/wmrl/tasks``),
    ``metric``, ``task_type``, ``id_column`` (default: ids are assigned), ``test_fraction``
    (0.25), ``seed`` (0), ``question``, ``source``, ``licence``, ``positive_class``,
    ``leaderboard`` (False), ``executor``.
    """
    path = Path(csv_path)
    if not path.is_file():
        raise FileNotFoundError(f"no CSV at {path}")
    df = pd.read_csv(path, low_memory=False)
    return task_from_frame(
        df,
        target,
        task_id=task_id or re.sub(r"[^A-Za-z0-9_.-]", "_", path.stem),
        source=kwargs.pop("source", f"user CSV {path.name}"),
        **kwargs,
    )
