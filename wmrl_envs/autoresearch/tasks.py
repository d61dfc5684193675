"""The AutoResearch task format on disk, and loading it.

A task is a directory::

    <task_id>/
      task.json               public metadata (type, metric, target, columns, licence, ...)
      public/                 what a solution sees, mounted read-only as ./data/
        description.md  train.csv  test.csv  sample_submission.csv
      private/                never mounted into the sandbox
        answers.csv           id + true target of every test row
        leaderboard.json      scores of the reference solution pool (see leaderboard.py)

Catalog tasks, procedural tasks and bring-your-own tasks are all written by
:func:`write_task`, so every consumer reads one format.

Catalog tasks come in two **tiers** (``task.json`` field ``tier``): ``"small"`` (tables
capped at 2,500 rows; reference solutions run in 1-3 s) and ``"full"`` (full-size tables of
>= 20,000 rows; reference solutions run in 5-60 s and some run out of memory or time).
Each task may carry its own resource ``limits`` (``{"wall_seconds", "memory_bytes"}``) --
what one solution run gets by default in the env, the leaderboard builder and evaluation;
:meth:`Task.run_limits` falls back to :data:`DEFAULT_WALL_SECONDS` /
:data:`DEFAULT_MEMORY_BYTES` when a task has none.

Classes: :class:`Task`. Functions: :func:`write_task`, :func:`load_task`,
:func:`catalog_root`, :func:`list_catalog`, :func:`get_task`. Constants: :data:`TIERS`,
:data:`DEFAULT_WALL_SECONDS`, :data:`DEFAULT_MEMORY_BYTES`.
"""

from __future__ import annotations

import functools
import json
import os
import re
import textwrap
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from wmrl_envs.autoresearch.metrics import METRICS_FOR_TYPE, get_metric

__all__ = [
    "Task",
    "TASK_TYPES",
    "SUBMISSION_FORMATS",
    "write_task",
    "check_task_id",
    "protect_private",
    "load_task",
    "catalog_root",
    "list_catalog",
    "get_task",
    "TIERS",
    "DEFAULT_WALL_SECONDS",
    "DEFAULT_MEMORY_BYTES",
]

TASK_TYPES = ("binary", "multiclass", "regression")
#: label: one column of class labels; proba_positive: one column with P(positive class);
#: proba_classes: one probability column per class; value: one numeric column.
SUBMISSION_FORMATS = ("label", "proba_positive", "proba_classes", "value")
#: Catalog tiers: "small" (<= 2,500 rows per table) and "full" (full-size tables, >= 20,000 rows).
TIERS = ("small", "full")
#: Limits of one solution run for a task without its own ``limits`` (procedural, BYO tasks).
DEFAULT_WALL_SECONDS = 60.0
DEFAULT_MEMORY_BYTES = 2 << 30

_DATA_DIR = Path(__file__).parent / "data"


def catalog_root() -> Path:
    """Directory holding the shipped catalog task directories."""
    return _DATA_DIR / "tasks"


@dataclass(frozen=True)
class Task:
    """One task: metadata from ``task.json`` plus the directory it lives in.

    Attributes:
        task_id: unique name (directory name).
        title: one-line human title.
        task_type: ``binary`` / ``multiclass`` / ``regression``.
        metric: a name from :data:`wmrl_envs.autoresearch.metrics.METRICS`.
        target: target column in ``train.csv`` (and in ``private/answers.csv``).
        id_column: row id column in every CSV.
        submission_format: one of :data:`SUBMISSION_FORMATS`.
        classes: class labels as strings (classification), ``None`` for regression. For
            binary tasks ``classes[1]`` is the positive class.
        question: the research question shown to agents.
        source, licence: provenance of the data.
        origin: ``catalog`` / ``procedural`` / ``byo``.
        split: catalog split (``train`` / ``test``) or ``None`` outside the catalog.
        tier: catalog tier (``small`` / ``full``, see :data:`TIERS`) or ``None`` outside the catalog.
        limits: the task's own limits of one solution run, ``{"wall_seconds": float,
            "memory_bytes": int}`` (wall and CPU budget; memory cap), or ``None`` for the
            defaults. See :meth:`run_limits`.
        dropped_columns: columns removed when the task was built (leaks, ids) and why.
        stats: meta-features computed from the data at build time (n_train, n_test,
            n_cols, n_numeric, n_categorical, missing_fraction, max_cardinality,
            onehot_width, n_classes, minority_fraction). ``onehot_width`` is the number of
            feature columns after one-hot encoding every categorical column (numeric columns
            + the sum of the categorical cardinalities in ``train.csv``).
        root: the task directory.
    """

    task_id: str
    title: str
    task_type: str
    metric: str
    target: str
    id_column: str
    submission_format: str
    classes: tuple[str, ...] | None
    question: str
    source: str
    licence: str
    origin: str = "catalog"
    split: str | None = None
    dropped_columns: dict[str, str] = field(default_factory=dict)
    stats: dict[str, Any] = field(default_factory=dict)
    tier: str | None = None
    limits: dict[str, Any] | None = None
    root: Path = Path(".")

    @property
    def public_dir(self) -> Path:
        return self.root / "public"

    @property
    def private_dir(self) -> Path:
        return self.root / "private"

    @property
    def submission_columns(self) -> list[str]:
        """Columns ``submission.csv`` must have, in order."""
        if self.submission_format == "proba_classes":
            assert self.classes is not None  # a classification format
            return [self.id_column, *self.classes]
        return [self.id_column, self.target]

    @property
    def positive_class(self) -> str | None:
        return self.classes[1] if self.task_type == "binary" and self.classes is not None else None

    def run_limits(self) -> dict[str, Any]:
        """Limits of one solution run: ``{"wall_seconds": float, "memory_bytes": int}``.

        The task's own ``limits`` where set, else :data:`DEFAULT_WALL_SECONDS` /
        :data:`DEFAULT_MEMORY_BYTES`. The env, the leaderboard builder and evaluation use
        these unless their config overrides them.
        """
        own = dict(self.limits or {})
        return {
            "wall_seconds": float(own.get("wall_seconds", DEFAULT_WALL_SECONDS)),
            "memory_bytes": int(own.get("memory_bytes", DEFAULT_MEMORY_BYTES)),
        }

    def inputs(self) -> dict[str, Path]:
        """Executor ``inputs``: the public files at ``data/<name>`` (never ``private/``)."""
        return {f"data/{p.name}": p for p in sorted(self.public_dir.iterdir()) if p.is_file()}

    def meta_features(self) -> dict[str, Any]:
        """Public meta-features of the task (what a world model may condition on)."""
        return {
            "task_type": self.task_type,
            "metric": self.metric,
            "higher_is_better": get_metric(self.metric).higher_is_better,
            "submission_format": self.submission_format,
            "origin": self.origin,
            **self.stats,
        }

    def read_train(self) -> pd.DataFrame:
        return _read_csv(self.public_dir / "train.csv")

    def read_test(self) -> pd.DataFrame:
        return _read_csv(self.public_dir / "test.csv")

    def read_answers(self) -> pd.DataFrame:
        """The hidden test targets (host side only: graders, never agents)."""
        return _read_csv(self.private_dir / "answers.csv")

    def description(self) -> str:
        return (self.public_dir / "description.md").read_text()

    def overview(self, max_chars: int = 4000) -> str:
        """Task overview for agents: description plus a data inventory, at most ``max_chars``.

        The inventory lists every column of ``train.csv`` with dtype, missing share and
        cardinality, so an agent can write a solution without looking at the data first.
        """
        return _overview(self.root, max_chars)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("root")
        d["classes"] = list(self.classes) if self.classes is not None else None
        return d


@functools.lru_cache(maxsize=256)
def _overview(root: Path, max_chars: int) -> str:
    from wmrl_envs.sandbox.runtime import runtime_prompt_line

    task = load_task(root)
    train = task.read_train()
    lines = [
        task.description().rstrip(),
        "",
        f"Runtime: {runtime_prompt_line()}",
        "",
        f"## Data inventory ({len(train)} train rows, {task.stats['n_test']} test rows)",
        "",
    ]
    lines.append("column | dtype | missing | unique | examples")
    for c in train.columns:
        s = train[c]
        role = " (target)" if c == task.target else " (id)" if c == task.id_column else ""
        examples = ", ".join(map(str, s.dropna().unique()[:3]))
        lines.append(f"{c}{role} | {s.dtype} | {s.isna().mean():.0%} | {s.nunique()} | {examples[:40]}")
    text = "\n".join(lines) + "\n"
    if len(text) > max_chars:
        cut = text[: max_chars - 40].rsplit("\n", 1)[0]
        text = cut + f"\n... ({len(text) - len(cut)} more characters cut)\n"
    return text


def _read_csv(path: Path) -> pd.DataFrame:
    # Class labels such as "1"/"0" or "yes"/"no" stay strings where the writer made them
    # strings; keep_default_na keeps real missing values as NaN.
    return pd.read_csv(path, low_memory=False)


def protect_private(private: Path) -> None:
    """Make a task's ``private/`` directory root-only (0700) when this process owns it.

    Git and wheels do not carry directory modes, so a checkout or an install leaves
    ``private/`` world-readable; any uid that can reach the path (a sandbox run without
    isolation, another local user) could then copy the answers. Without ownership nothing
    changes (the sandbox's mount namespace still hides the directory).
    """
    try:
        st = private.stat()
        if st.st_mode & 0o077 and st.st_uid == os.geteuid():
            os.chmod(private, 0o700)
    except OSError:  # missing (a task being written) or read-only file system: nothing to do
        pass


@functools.cache
def load_task(path: str | Path) -> Task:
    """Load the task in directory ``path`` (cached per path)."""
    root = Path(path)
    meta_path = root / "task.json"
    if not meta_path.is_file():
        raise FileNotFoundError(f"{root} is not an AutoResearch task directory: {meta_path} is missing")
    protect_private(root / "private")
    d = json.loads(meta_path.read_text())
    d["classes"] = tuple(d["classes"]) if d.get("classes") is not None else None
    if d.get("tier") is None and d.get("origin") == "catalog":
        d["tier"] = "small"  # catalog tasks written before tiers existed
    return Task(root=root, **d)


def list_catalog(split: str | None = None, tier: str | None = "small") -> list[str]:
    """Ids of the shipped catalog tasks of ``tier`` (default ``"small"``; ``None``: every
    tier), optionally only those of catalog ``split`` (``"train"`` / ``"test"``)."""
    if split not in (None, "train", "test"):
        raise ValueError(f"split must be 'train', 'test' or None, got {split!r}")
    if tier not in (None, *TIERS):
        raise ValueError(f"tier must be one of {TIERS} or None (every tier), got {tier!r}")
    root = catalog_root()
    ids = sorted(p.name for p in root.iterdir() if (p / "task.json").is_file()) if root.is_dir() else []
    tasks = [load_task(root / t) for t in ids]
    return [t.task_id for t in tasks if (split is None or t.split == split) and (tier is None or t.tier == tier)]


def get_task(task: str | Path | Task) -> Task:
    """A :class:`Task` from a catalog id, a task directory or a :class:`Task`."""
    if isinstance(task, Task):
        return task
    path = Path(task)
    if (path / "task.json").is_file():
        return load_task(path.resolve())
    if (catalog_root() / str(task) / "task.json").is_file():
        return load_task(catalog_root() / str(task))
    raise ValueError(
        f"unknown task {task!r}: not a catalog id ({', '.join(list_catalog(tier=None)) or 'catalog not built'}) nor a task directory"
    )


def _stats(
    train: pd.DataFrame, test: pd.DataFrame, target: str, id_column: str, classes: Sequence[str] | None
) -> dict[str, Any]:
    features = train.drop(columns=[target, id_column])
    categorical = [c for c in features.columns if not pd.api.types.is_numeric_dtype(features[c])]
    stats: dict[str, Any] = {
        "n_train": int(len(train)),
        "n_test": int(len(test)),
        "n_cols": int(features.shape[1]),
        "n_numeric": int(features.shape[1] - len(categorical)),
        "n_categorical": len(categorical),
        "missing_fraction": round(float(features.isna().to_numpy().mean()), 4) if features.size else 0.0,
        "max_cardinality": int(max((features[c].nunique() for c in categorical), default=0)),
        "onehot_width": int(features.shape[1] - len(categorical) + sum(features[c].nunique() for c in categorical)),
        "n_classes": len(classes) if classes is not None else None,
        "minority_fraction": None,
    }
    if classes is not None:
        stats["minority_fraction"] = round(float(train[target].astype(str).value_counts(normalize=True).min()), 4)
    return stats


def _description(task: Task) -> str:
    metric = get_metric(task.metric)
    direction = "higher is better" if metric.higher_is_better else "lower is better"
    classes = task.classes or ()  # () only for regression formats, which do not list classes
    if task.submission_format == "proba_classes":
        sub = f"one row per test id with columns `{task.id_column}` and one probability column per class ({', '.join(f'`{c}`' for c in classes)}); rows should sum to 1"
    elif task.submission_format == "proba_positive":
        sub = f"columns `{task.id_column}`, `{task.target}`: the probability that `{task.target}` is `{task.positive_class}`"
    elif task.submission_format == "label":
        sub = f"columns `{task.id_column}`, `{task.target}`: the predicted class, one of {', '.join(f'`{c}`' for c in classes)}"
    else:
        sub = f"columns `{task.id_column}`, `{task.target}`: the predicted value"
    dropped = "".join(f"\n- `{c}` removed: {why}" for c, why in task.dropped_columns.items())
    return textwrap.dedent(
        f"""\
        # {task.title}

        {task.question}

        - Task type: {task.task_type}; target column: `{task.target}`; row id: `{task.id_column}`.
        - Metric: {task.metric} ({metric.description}; {direction}).
        - Files (in `./data/`): `train.csv` (features + target, {task.stats["n_train"]} rows),
          `test.csv` (features only, {task.stats["n_test"]} rows), `sample_submission.csv`.
        - Submission: write `./submission.csv` with {sub}; exactly one row per id of `test.csv`.
        - Source: {task.source}. Licence: {task.licence}.
        """
    ) + (f"\nColumns removed when the task was built:{dropped}\n" if dropped else "")


_TASK_ID = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")


def check_task_id(task_id: str, root: str | Path | None = None) -> str:
    """``task_id`` if it names one directory directly under ``root``, else ``ValueError``.

    Letters, digits, ``_``, ``.``, ``-``, not starting with ``.`` or ``-`` (so never ``.``,
    ``..`` or a hidden file), at most 128 characters, no path separator.

    >>> check_task_id("houses_v2")
    'houses_v2'
    >>> check_task_id("..")
    Traceback (most recent call last):
    ...
    ValueError: task id '..' is not allowed: use letters, digits, '_', '.', '-' (not starting with '.' or '-'; at most 128 characters)
    """
    if not isinstance(task_id, str) or not _TASK_ID.fullmatch(task_id):
        raise ValueError(
            f"task id {task_id!r} is not allowed: use letters, digits, '_', '.', '-' "
            "(not starting with '.' or '-'; at most 128 characters)"
        )
    if root is not None:
        base = Path(root).resolve()
        if (base / task_id).resolve().parent != base:
            raise ValueError(f"task id {task_id!r} would leave the task root {str(base)!r}")
    return task_id


def write_task(  # noqa: C901 -- complexity over 15 before the limit (issue 26)
    root: str | Path,
    task_id: str,
    train: pd.DataFrame,
    test: pd.DataFrame,
    *,
    target: str,
    task_type: str,
    metric: str,
    question: str,
    source: str,
    licence: str,
    title: str | None = None,
    id_column: str = "id",
    origin: str = "catalog",
    split: str | None = None,
    dropped_columns: dict[str, str] | None = None,
    positive_class: Any = None,
    tier: str | None = None,
    limits: dict[str, Any] | None = None,
) -> Task:
    """Write a task directory under ``root/task_id`` and return the loaded :class:`Task`.

    ``train`` and ``test`` both hold features and the target (and ``id_column`` if
    present; otherwise ids are assigned). The test target goes to ``private/answers.csv``
    only. Class labels are written as strings; for binary tasks ``positive_class`` (default:
    the minority class) becomes ``classes[1]``. ``tier`` and ``limits``: see :class:`Task`.
    """
    check_task_id(task_id, root)
    if tier not in (None, *TIERS):
        raise ValueError(f"tier must be one of {TIERS} or None, got {tier!r}")
    if limits is not None:
        if set(limits) - {"wall_seconds", "memory_bytes"}:
            raise ValueError(f"limits may hold 'wall_seconds' and 'memory_bytes' only, got {sorted(limits)}")
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 for v in limits.values()):
            raise ValueError(f"limits must be positive numbers, got {limits}")
        limits = {k: (int(v) if k == "memory_bytes" else float(v)) for k, v in limits.items()}
    if task_type not in TASK_TYPES:
        raise ValueError(f"task_type must be one of {TASK_TYPES}, got {task_type!r}")
    if metric not in METRICS_FOR_TYPE[task_type]:
        raise ValueError(
            f"metric {metric!r} does not fit a {task_type} task; choose one of {METRICS_FOR_TYPE[task_type]}"
        )
    for name, df in (("train", train), ("test", test)):
        if target not in df.columns:
            raise ValueError(f"target column {target!r} is missing from the {name} frame (columns: {list(df.columns)})")
        if df[target].isna().any():
            raise ValueError(f"target column {target!r} has missing values in the {name} frame; drop those rows first")
    train, test = train.copy(), test.copy()
    if id_column not in train.columns:
        train.insert(0, id_column, np.arange(len(train)))
        test.insert(0, id_column, np.arange(len(train), len(train) + len(test)))
    elif pd.concat([train[id_column], test[id_column]]).duplicated().any():
        raise ValueError(f"id column {id_column!r} has duplicate values")

    classes = None
    if task_type == "regression":
        for df in (train, test):
            df[target] = pd.to_numeric(df[target], errors="raise").astype(float)
        if metric == "rmsle" and (pd.concat([train[target], test[target]]) < 0).any():
            raise ValueError("rmsle needs a non-negative target")
        fmt = "value"
    else:
        for df in (train, test):
            df[target] = df[target].astype(str)
        labels = sorted(set(train[target]) | set(test[target]))
        if set(test[target]) - set(train[target]):
            raise ValueError(f"test has classes absent from train: {sorted(set(test[target]) - set(train[target]))}")
        if task_type == "binary":
            if len(labels) != 2:
                raise ValueError(f"a binary task needs exactly 2 classes, found {len(labels)}: {labels[:10]}")
            pos = str(positive_class) if positive_class is not None else train[target].value_counts().idxmin()
            if pos not in labels:
                raise ValueError(f"positive_class {positive_class!r} is not one of the classes {labels}")
            labels = [c for c in labels if c != pos] + [pos]
        elif len(labels) < 3:
            raise ValueError(f"a multiclass task needs >= 3 classes, found {labels}")
        classes = tuple(labels)
        fmt = {"accuracy": "label", "macro_f1": "label"}.get(metric) or (
            "proba_positive" if task_type == "binary" else "proba_classes"
        )

    task = Task(
        task_id=task_id,
        title=title or task_id.replace("_", " ").title(),
        task_type=task_type,
        metric=metric,
        target=target,
        id_column=id_column,
        submission_format=fmt,
        classes=classes,
        question=question,
        source=source,
        licence=licence,
        origin=origin,
        split=split,
        dropped_columns=dict(dropped_columns or {}),
        stats=_stats(train, test, target, id_column, classes),
        tier=tier,
        limits=limits,
        root=Path(root) / task_id,
    )
    pub, priv = task.public_dir, task.private_dir
    pub.mkdir(parents=True, exist_ok=True)
    priv.mkdir(parents=True, exist_ok=True)
    os.chmod(priv, 0o700)  # the answers: readable by the grader only
    features = [c for c in train.columns if c not in (id_column, target)]
    train[[id_column, *features, target]].to_csv(pub / "train.csv", index=False)
    test[[id_column, *features]].to_csv(pub / "test.csv", index=False)
    test[[id_column, target]].to_csv(priv / "answers.csv", index=False)
    _sample_submission(task, train, test).to_csv(pub / "sample_submission.csv", index=False)
    (pub / "description.md").write_text(_description(task))
    (task.root / "task.json").write_text(json.dumps(task.to_json(), indent=1) + "\n")
    load_task.cache_clear()
    return load_task(task.root)


def _sample_submission(task: Task, train: pd.DataFrame, test: pd.DataFrame) -> pd.DataFrame:
    """A valid placeholder submission (the train prior), so agents see the exact format."""
    ids = test[task.id_column].to_numpy()
    y = train[task.target]
    if task.submission_format == "value":
        return pd.DataFrame({task.id_column: ids, task.target: float(y.mean())})
    if task.submission_format == "label":
        return pd.DataFrame({task.id_column: ids, task.target: y.value_counts().idxmax()})
    prior = y.value_counts(normalize=True)
    if task.submission_format == "proba_positive":
        return pd.DataFrame({task.id_column: ids, task.target: round(float(prior.get(task.positive_class, 0.0)), 6)})
    assert task.classes is not None  # proba_classes
    return pd.DataFrame({task.id_column: ids, **{c: round(float(prior.get(c, 0.0)), 6) for c in task.classes}})
