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
``positive_class``, by default the conventional one (``1``, ``yes``, ``true``, ... or the
class named like the target; the minority class only when none is), and is reported in
:func:`byo_notes` (and logged). Rows without a target are dropped and counted in a note.
Tables above ``max_rows`` are sampled down (seeded) with a note; columns that look like row
ids or that predict the target on their own are flagged. A CSV with more than
``max_columns`` columns is refused from its header line, before it is parsed. Each run of
a solution gets ``time_limit`` seconds and ``memory_limit`` bytes (default: scaled to the
table by :func:`default_limits`).
``leaderboard=True`` executes the small reference pool; failed reference runs are
counted with their reasons, and fewer than :data:`MIN_LEADERBOARD` valid entries is an
error (a rank among 2 entries means nothing).

Functions: :func:`task_from_csv`, :func:`task_from_frame`, :func:`infer_task_type`,
:func:`resolve_task_type`, :func:`column_warnings`, :func:`default_limits`,
:func:`default_positive_class`. Classes: :class:`ByoError`.
"""

from __future__ import annotations

import csv
import logging
import re
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from sklearn.model_selection import train_test_split

from wmrl_envs.autoresearch.metrics import METRICS_FOR_TYPE
from wmrl_envs.autoresearch.procedural import default_task_cache
from wmrl_envs.autoresearch.tasks import DEFAULT_MEMORY_BYTES, DEFAULT_WALL_SECONDS, Task, check_task_id, write_task

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
    "DEFAULT_MAX_COLUMNS",
    "default_limits",
    "default_positive_class",
]

log = logging.getLogger(__name__)
#: Fewest valid reference solutions a BYO leaderboard needs to be written.
MIN_LEADERBOARD = 5
#: Rows kept by default (a sample of larger tables; reference solutions must fit the run limits).
DEFAULT_MAX_ROWS = 20_000
#: Columns a BYO CSV may have (checked on the header line, before parsing: 10^6 columns
#: would take minutes and GBs to parse).
DEFAULT_MAX_COLUMNS = 2_000
# The header line is read with this cap (a line longer than that is refused as such).
_HEADER_BYTES = 4 << 20
#: Class labels that conventionally name the positive class of a binary target (lowercase).
POSITIVE_LABELS = ("1", "1.0", "yes", "y", "true", "t", "positive", "pos")


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


def default_positive_class(y: pd.Series) -> tuple[str, str]:
    """``(class, why)``: the positive class a user most likely means for binary target ``y``.

    The conventional label (``1``, ``yes``, ``true``, ...) if one class has it; else the class
    named like the target (``switch`` for a target ``switch``); else the minority class.

    >>> default_positive_class(pd.Series(["no", "yes", "no"], name="smoker"))
    ('yes', "the conventional positive label 'yes'")
    >>> default_positive_class(pd.Series(["stay", "switch", "switch"], name="switch"))
    ('switch', 'the class named like the target')
    >>> default_positive_class(pd.Series(["a", "b", "b"], name="kind"))
    ('a', 'the minority class (no class is named like the target or a conventional positive label)')
    """
    labels = sorted(y.dropna().astype(str).unique())
    lowered = {label.strip().lower(): label for label in labels}
    for conventional in POSITIVE_LABELS:
        if conventional in lowered:
            return lowered[conventional], f"the conventional positive label {lowered[conventional]!r}"
    name = str(y.name).strip().lower()
    named = [label for low, label in lowered.items() if low == name]
    if named:
        return named[0], "the class named like the target"
    minority = str(y.dropna().astype(str).value_counts().idxmin())
    return minority, "the minority class (no class is named like the target or a conventional positive label)"


def default_limits(n_rows: int, n_columns: int) -> dict[str, Any]:
    """Run limits scaled to a table: the catalog's 60 s / 2 GiB up to 5,000 rows, then wall
    time in proportion to the rows (capped at 600 s) and 4 GiB past 2 x 10^6 cells.

    >>> default_limits(2500, 10)
    {'wall_seconds': 60.0, 'memory_bytes': 2147483648}
    >>> default_limits(20000, 12)
    {'wall_seconds': 240.0, 'memory_bytes': 2147483648}
    """
    wall = min(600.0, DEFAULT_WALL_SECONDS * max(1.0, n_rows / 5000))
    memory = DEFAULT_MEMORY_BYTES if n_rows * n_columns <= 2_000_000 else 2 * DEFAULT_MEMORY_BYTES
    return {"wall_seconds": float(wall), "memory_bytes": int(memory)}


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
    time_limit: float | None = None,
    memory_limit: int | None = None,
) -> Task:
    """Write a task from a DataFrame (see :func:`task_from_csv`); notes in :func:`byo_notes`."""
    root = Path(root) if root is not None else default_task_cache()
    try:
        check_task_id(task_id, root)
    except ValueError as err:
        raise ByoError(f"{err} (--task-id / task_id)") from None
    for name, value in (("time_limit", time_limit), ("memory_limit", memory_limit)):
        if value is not None and not value > 0:
            raise ByoError(f"{name} must be positive, got {value!r}")
    if target not in df.columns:
        raise ValueError(f"target column {target!r} not in the CSV; columns: {list(df.columns)}")
    if id_column is not None and id_column not in df.columns:
        raise ValueError(f"id column {id_column!r} not in the CSV; columns: {list(df.columns)}")
    if not 0 < test_fraction < 1:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    notes: list[str] = []
    missing = int(df[target].isna().sum())
    if missing:
        notes.append(f"{missing} of {len(df)} rows ({missing / len(df):.0%}) have no {target!r} value and are dropped")
        df = df.dropna(subset=[target]).reset_index(drop=True)
    if max_rows is not None and len(df) > max_rows:
        notes.append(f"the table has {len(df)} rows; a seeded sample of {max_rows} is used (max_rows / --max-rows)")
        df = df.sample(n=max_rows, random_state=seed).reset_index(drop=True)
    task_type = resolve_task_type(df[target], task_type, metric)
    metric = metric or DEFAULT_METRIC[task_type]
    chosen_positive, why_positive = _positive_class(df[target], task_type, positive_class)
    notes += column_warnings(df, target, id_column)
    train, test = _split(df, target, task_type, metric, test_fraction, seed)
    limits = default_limits(len(df), df.shape[1] - 1)
    limits.update({k: v for k, v in (("wall_seconds", time_limit), ("memory_bytes", memory_limit)) if v is not None})
    notes.append(
        f"each solution run gets {limits['wall_seconds']:g} s and {limits['memory_bytes'] / 2**30:g} GiB"
        + (
            " (scaled to the table; --time-limit / --memory-limit to change)"
            if None in (time_limit, memory_limit)
            else ""
        )
    )
    task = write_task(
        root,
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
        positive_class=chosen_positive,
        limits=limits,
    )
    if task.positive_class is not None:
        notes.append(
            f"positive class: {task.positive_class!r} ({why_positive}); submissions give P({target} = {task.positive_class})"
        )
    if leaderboard:
        notes += _build_leaderboard(task, executor)
    for note in notes:
        log.warning("wmrl byo %s: %s", task_id, note)
    object.__setattr__(task, "_byo_notes", tuple(notes))
    return task


def _positive_class(y: pd.Series, task_type: str, asked: Any) -> tuple[Any, str]:
    """The positive class of a binary target and why (``(None, "")`` for other task types)."""
    if task_type != "binary":
        return None, ""
    labels = sorted(y.astype(str).unique())
    if asked is not None:
        if str(asked) not in labels:
            raise ByoError(f"positive class {asked!r} is not a value of {y.name!r}; values are {labels}")
        return asked, "as asked"
    chosen, why = default_positive_class(y)
    return chosen, why + "; --positive-class to change"


def _split(
    df: pd.DataFrame, target: str, task_type: str, metric: str, test_fraction: float, seed: int
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Train / held-out rows, stratified for classification; a class too rare to split is a
    :class:`ByoError` with a hint (not scikit-learn's bare "least populated class" error)."""
    if task_type == "regression":
        return tuple(train_test_split(df, test_size=test_fraction, random_state=seed))  # type: ignore[return-value]
    counts = df[target].astype(str).value_counts()
    rare = counts[counts < 2]
    if len(rare):
        numeric = pd.api.types.is_numeric_dtype(df[target])
        hint = (
            f"if {target!r} is a quantity, pass --task-type regression (or --metric rmse)"
            if numeric
            else f"drop or merge the rare classes, or pass --metric / --task-type to say what {target!r} is"
        )
        raise ByoError(
            f"{target!r} looks {task_type} ({len(counts)} classes, metric {metric}) but class(es) "
            f"{list(rare.index[:5])} have a single row, too few to split into train and held-out: {hint}"
        )
    train, test = train_test_split(df, test_size=test_fraction, random_state=seed, stratify=df[target].astype(str))
    return train, test


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
    keeps every row), ``max_columns`` (:data:`DEFAULT_MAX_COLUMNS`, checked before parsing),
    ``time_limit`` / ``memory_limit`` (per solution run; default :func:`default_limits`).
    """
    path = Path(csv_path)
    if not path.is_file():
        raise FileNotFoundError(f"no CSV at {path}")
    max_columns = kwargs.pop("max_columns", DEFAULT_MAX_COLUMNS)
    _check_header(path, max_columns)
    if task_id is None:
        task_id = re.sub(r"[^A-Za-z0-9_.-]", "_", path.stem)
        try:
            check_task_id(task_id)
        except ValueError:
            raise ByoError(f"cannot name a task after the file {path.name!r}; pass --task-id (task_id=)") from None
    df = pd.read_csv(path, low_memory=False)
    return task_from_frame(df, target, task_id=task_id, source=kwargs.pop("source", f"user CSV {path.name}"), **kwargs)


def _check_header(path: Path, max_columns: int | None) -> None:
    """Refuse a CSV whose header line has more than ``max_columns`` fields, reading only that line."""
    if max_columns is None:
        return
    with open(path, newline="", errors="replace") as f:
        line = f.readline(_HEADER_BYTES)
    if len(line) >= _HEADER_BYTES and not line.endswith("\n"):
        raise ByoError(
            f"the header line of {path.name} is longer than {_HEADER_BYTES >> 20} MiB; "
            f"at most {max_columns} columns are accepted (max_columns / --max-columns)"
        )
    n = len(next(csv.reader([line]), []))
    if n > max_columns:
        raise ByoError(f"{path.name} has {n} columns; at most {max_columns} are accepted (max_columns / --max-columns)")
