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
not given; a metric that fits only one task type implies that type (``rmse`` on a target
with 5 distinct numbers is a regression). For binary tasks the positive class is
``positive_class`` (default: the minority class) and is reported in
:func:`byo_notes` (and logged). Tables above ``max_rows`` are sampled down (seeded) with a
note; columns that look like row ids or that predict the target on their own are flagged.
``leaderboard=True`` executes the small reference pool; failed reference runs are
counted with their reasons, and fewer than :data:`MIN_LEADERBOARD` valid entries is an
error (a rank among 2 entries means nothing).

Functions: :func:`task_from_csv`, :func:`task_from_frame`, :func:`infer_task_type`,
:func:`resolve_task_type`, :func:`column_warnings`. Classes: :class:`ByoError`.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from sklearn.model_selection import train_test_split

from wmrl_envs.autoresearch.metrics import METRICS_FOR_TYPE
from wmrl_envs.autoresearch.procedural import default_task_cache
from wmrl_envs.autoresearch.tasks import Task, write_task

__all__ = [
    "task_from_csv",
    "task_from_frame",
    "infer_task_type",
    "resolve_task_type",
    "column_warnings",
    "ByoError",
    "byo_notes",
    "DEFAULT_METRIC",
    "MIN_LEADERBOARD",
    "DEFAULT_MAX_ROWS",
]

log = logging.getLogger(__name__)
#: Fewest valid reference solutions a BYO leaderboard needs to be written.
MIN_LEADERBOARD = 5
#: Rows kept by default (a sample of larger tables; reference solutions must fit the run limits).
DEFAULT_MAX_ROWS = 20_000


class ByoError(ValueError):
    """A table that cannot become a task as asked; the message says what to change."""


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


def resolve_task_type(y: pd.Series, task_type: str | None, metric: str | None) -> str:
    """The task type: ``task_type`` if given; else the only type ``metric`` fits; else inferred.

    A contradiction (``metric`` does not fit ``task_type``) is a :class:`ByoError` naming
    ``--task-type`` / ``task_type``.
    """
    if task_type is not None:
        if task_type not in METRICS_FOR_TYPE:
            raise ByoError(f"task type {task_type!r} is not one of {sorted(METRICS_FOR_TYPE)}")
        if metric is not None and metric not in METRICS_FOR_TYPE[task_type]:
            raise ByoError(
                f"metric {metric!r} does not fit a {task_type} task (--task-type / task_type); "
                f"choose one of {list(METRICS_FOR_TYPE[task_type])}"
            )
        return task_type
    if metric is not None:
        fits = [t for t, metrics in METRICS_FOR_TYPE.items() if metric in metrics]
        if not fits:
            known = sorted({m for ms in METRICS_FOR_TYPE.values() for m in ms})
            raise ByoError(f"unknown metric {metric!r}; choose one of {known}")
        inferred = infer_task_type(y)
        if inferred in fits:
            return inferred
        if len(fits) == 1:
            if fits[0] == "regression" and not pd.api.types.is_numeric_dtype(y.dropna()):
                raise ByoError(f"metric {metric!r} needs a numeric target; {y.name!r} is not numeric")
            return fits[0]
        raise ByoError(
            f"metric {metric!r} fits {fits} tasks but the target looks {inferred}; "
            f"pass --task-type (task_type=) to say which"
        )
    return infer_task_type(y)


def column_warnings(df: pd.DataFrame, target: str, id_column: str | None) -> list[str]:
    """Notes on columns that would make the task meaningless: id-like columns (every value
    distinct, so a model can only memorise them) and single columns that determine the
    target (a leak: the task would be solved by a lookup)."""
    notes = []
    y = df[target]
    n = len(df)
    for c in df.columns:
        if c in (target, id_column):
            continue
        s = df[c]
        k = s.nunique(dropna=True)
        # integers or strings (not floats: a continuous measurement is all-distinct too)
        integral = pd.api.types.is_integer_dtype(s) or (not pd.api.types.is_numeric_dtype(s) and s.notna().all())
        if n >= 20 and k == n and integral:
            notes.append(
                f"column {c!r} looks like a row id (all {n} values distinct): it is kept as a feature; "
                f"pass --id-column {c} to use it as the row id, or drop it"
            )
            continue
        if n >= 20 and 1 < k < n and s.notna().all():
            # one target value per value of the column: the column alone predicts the target
            if y.groupby(s, dropna=True).nunique().max() == 1 and k < 0.5 * n:
                notes.append(f"column {c!r} determines the target {target!r} on its own (a leak?): drop it if so")
                continue
        if (
            pd.api.types.is_numeric_dtype(s)
            and pd.api.types.is_numeric_dtype(y)
            and s.notna().all()
            and s.std() > 0
            and y.std() > 0
            and abs(float(np.corrcoef(s.to_numpy(float), y.to_numpy(float))[0, 1])) > 0.9999
        ):
            notes.append(f"column {c!r} is a linear function of the target {target!r} (a leak?): drop it if so")
    return notes


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
    max_rows: int | None = DEFAULT_MAX_ROWS,
) -> Task:
    """Write a task from a DataFrame (see :func:`task_from_csv`); notes in :func:`byo_notes`."""
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", task_id):
        raise ValueError(f"task_id may contain only letters, digits, '_', '.', '-'; got {task_id!r}")
    if target not in df.columns:
        raise ValueError(f"target column {target!r} not in the CSV; columns: {list(df.columns)}")
    if id_column is not None and id_column not in df.columns:
        raise ValueError(f"id column {id_column!r} not in the CSV; columns: {list(df.columns)}")
    if not 0 < test_fraction < 1:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    df = df.dropna(subset=[target]).reset_index(drop=True)
    notes: list[str] = []
    if max_rows is not None and len(df) > max_rows:
        notes.append(f"the table has {len(df)} rows; a seeded sample of {max_rows} is used (max_rows / --max-rows)")
        df = df.sample(n=max_rows, random_state=seed).reset_index(drop=True)
    task_type = resolve_task_type(df[target], task_type, metric)
    metric = metric or DEFAULT_METRIC[task_type]
    if task_type == "binary":
        labels = sorted(df[target].astype(str).unique())
        if positive_class is not None and str(positive_class) not in labels:
            raise ByoError(f"positive class {positive_class!r} is not a value of {target!r}; values are {labels}")
    notes += column_warnings(df, target, id_column)
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
    if task.positive_class is not None:
        how = "as asked" if positive_class is not None else "the minority class; --positive-class to change"
        notes.append(
            f"positive class: {task.positive_class!r} ({how}); submissions give P({target} = {task.positive_class})"
        )
    if leaderboard:
        notes += _build_leaderboard(task, executor)
    for note in notes:
        log.warning("wmrl byo %s: %s", task_id, note)
    object.__setattr__(task, "_byo_notes", tuple(notes))
    return task


def byo_notes(task: Task) -> tuple[str, ...]:
    """The notes :func:`task_from_frame` produced for ``task`` (empty for other tasks)."""
    return getattr(task, "_byo_notes", ())


def _build_leaderboard(task: Task, executor: Any) -> list[str]:
    """Run the reference pool; notes on failures; :class:`ByoError` when too few are valid."""
    from wmrl_envs.autoresearch.leaderboard import LeaderboardConfig, build_leaderboards, load_leaderboard

    summary = build_leaderboards([task], executor, LeaderboardConfig(size="small", broken=False, write_logs=False))
    s = summary[task.task_id]
    notes = []
    failed = {k: v for k, v in s.get("reference_exec_statuses", {}).items() if k != "ok"}
    n_ref, n_valid = s["n_reference"], s["n_valid"]
    if n_valid < n_ref:
        why = ", ".join(f"{v} {k}" for k, v in sorted(failed.items())) or "invalid submissions"
        notes.append(
            f"{n_ref - n_valid} of {n_ref} reference solutions failed ({why}); the leaderboard has {n_valid} entries"
        )
    if n_valid < MIN_LEADERBOARD:
        (task.private_dir / "leaderboard.json").unlink(missing_ok=True)
        raise ByoError(
            f"only {n_valid} of {n_ref} reference solutions produced a valid submission "
            f"({', '.join(f'{v} {k}' for k, v in sorted(failed.items())) or 'invalid submissions'}); "
            f"a leaderboard needs at least {MIN_LEADERBOARD}. The task is written without one: "
            f"lower --max-rows or raise the run limits"
        )
    board = load_leaderboard(task) or []
    from wmrl_envs.autoresearch.metrics import get_metric

    best = max(board) if get_metric(task.metric).higher_is_better else min(board)
    perfect = {"accuracy": 1.0, "macro_f1": 1.0, "roc_auc": 1.0, "r2": 1.0}.get(task.metric, 0.0)
    if abs(best - perfect) < 1e-9:
        notes.append(
            f"a reference solution scores a perfect {task.metric} = {best:g}: a feature probably leaks the target"
        )
    return notes


def task_from_csv(csv_path: str | Path, target: str, *, task_id: str | None = None, **kwargs: Any) -> Task:
    """Turn ``csv_path`` into a task named ``task_id`` (default: the file stem).

    Keyword arguments: ``root`` (default ``$WMRL_TASK_CACHE`` or ``~/.cache/wmrl/tasks``),
    ``metric``, ``task_type``, ``id_column`` (default: ids are assigned), ``test_fraction``
    (0.25), ``seed`` (0), ``question``, ``source``, ``licence``, ``positive_class``,
    ``leaderboard`` (False), ``executor``, ``max_rows`` (:data:`DEFAULT_MAX_ROWS`; ``None``
    keeps every row).
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
