"""Leaderboards built for real: a pool of reference solutions executed in the sandbox.

For every task, :func:`reference_pool` writes a diverse pool of complete solution
scripts from templates (constant baselines, linear models under several preprocessings,
kNN, trees of several depths, random forests, extra trees, gradient boosting, an MLP, and
deliberately weak variants), plus a few *broken* scripts (syntax error, a cheating attempt at
``private/`` that fails at run time, no submission, invalid submissions, timeout) that never
enter the leaderboard but are logged so a world model sees every status.

:func:`build_leaderboards` runs the pool through an :class:`~wmrl_envs.sandbox.ExecutorPool`,
keeps the scores of the valid reference solutions as the leaderboard
(``private/leaderboard.json``) and writes one execution-log line per run (the world
model's training data; format in docs/contracts.md) to ``data/logs/<task_id>.jsonl``.

The leaderboards were built under Debian's python3 (numpy 1.24, pandas 1.5, scikit-learn
1.2), before the pinned solutions' runtime (:mod:`wmrl_envs.sandbox.runtime`); the scripts
avoid APIs newer than that, and also run under the runtime.

Classes: :class:`PoolSolution`, :class:`LeaderboardConfig`. Functions:
:func:`reference_pool`, :func:`build_leaderboards`, :func:`load_leaderboard`,
:func:`logs_root`, :func:`refresh_log_contexts`.
"""

from __future__ import annotations

import json
import statistics
import textwrap
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm import tqdm

from wmrl_envs.autoresearch.grading import (
    SUBMISSION_FILE,
    check_syntax,
    grading_context,
    harness_failed,
    outcome_from_execution,
)
from wmrl_envs.autoresearch.metrics import get_metric
from wmrl_envs.autoresearch.tasks import Task, get_task
from wmrl_envs.outcome import Outcome

__all__ = [
    "PoolSolution",
    "LeaderboardConfig",
    "reference_pool",
    "build_leaderboards",
    "load_leaderboard",
    "logs_root",
    "refresh_log_contexts",
    "relabel_pool_logs",
]

_DATA_DIR = Path(__file__).parent / "data"


def logs_root() -> Path:
    """Directory of the shipped pool execution logs (``<task_id>.jsonl``)."""
    return _DATA_DIR / "logs"


@dataclass(frozen=True)
class PoolSolution:
    """One pool script. ``reference`` solutions enter the leaderboard when valid."""

    solution_id: str
    code: str
    reference: bool = True
    timeout_probe: bool = False  # runs under LeaderboardConfig.timeout_probe_seconds


@dataclass(frozen=True)
class LeaderboardConfig:
    """Settings of :func:`build_leaderboards`.

    Attributes:
        max_concurrent: sandbox runs in flight at once.
        wall_seconds: time budget (wall and CPU) of one reference run; ``None`` (default):
            the task's own limit (:meth:`~wmrl_envs.autoresearch.tasks.Task.run_limits`:
            60 s for small-tier tasks, 120 s for full-tier ones). Runs that exceed it are
            logged as ``timeout`` and stay out of the leaderboard.
        memory_bytes: memory cap of one reference run; ``None`` (default): the task's own
            (2 GiB). Runs that hit it are logged as ``runtime_error`` (``exec_status``
            ``killed_memory``) and stay out of the leaderboard.
        timeout_probe_seconds: time budget of the deliberate timeout script.
        size: ``"full"`` (every template, >= 30 reference solutions) or ``"small"`` (a
            cheaper pool of ~12 for on-demand procedural / BYO tasks).
        broken: include the broken scripts in the logs.
        write_logs: write ``logs/<task_id>.jsonl``.
        logs_dir: where logs go (default: the shipped ``data/logs``).
    """

    max_concurrent: int = 2
    wall_seconds: float | None = None
    memory_bytes: int | None = None
    timeout_probe_seconds: float = 3.0
    size: str = "full"
    broken: bool = True
    write_logs: bool = True
    logs_dir: Path | None = None


# ---------------------------------------------------------------------------------------
# Templates. A script = prelude (load data, split columns) + preprocessing + model + writer.

_PRELUDE = """\
import numpy as np
import pandas as pd
from sklearn.compose import ColumnTransformer
from sklearn.impute import SimpleImputer
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import OneHotEncoder, OrdinalEncoder, StandardScaler
{imports}

train = pd.read_csv("data/train.csv")
test = pd.read_csv("data/test.csv")
TARGET, ID = {target!r}, {id_column!r}
y = train[TARGET]{y_cast}
X = train.drop(columns=[TARGET, ID])
X_test = test.drop(columns=[ID])
num = [c for c in X.columns if pd.api.types.is_numeric_dtype(X[c])]
cat = [c for c in X.columns if c not in num]
"""

_PREP = {
    # one-hot categoricals, standardised numerics: linear models, kNN, MLP, NB
    "onehot": """\
prep = ColumnTransformer([
    ("num", make_pipeline(SimpleImputer(strategy="median"), StandardScaler()), num),
    ("cat", make_pipeline(SimpleImputer(strategy="most_frequent"),
                          OneHotEncoder(handle_unknown="ignore", sparse_output=False)), cat),
])
""",
    # ordinal-coded categoricals, raw numerics: trees and boosting
    "ordinal": """\
prep = ColumnTransformer([
    ("num", SimpleImputer(strategy="median"), num),
    ("cat", make_pipeline(SimpleImputer(strategy="constant", fill_value="missing"),
                          OrdinalEncoder(handle_unknown="use_encoded_value", unknown_value=-1)), cat),
])
""",
    "numeric": """\
prep = ColumnTransformer([("num", make_pipeline(SimpleImputer(strategy="median"), StandardScaler()), num)])
""",
    # a weak variant: only the first two columns
    "two_columns": """\
X, X_test = X.iloc[:, :2], X_test.iloc[:, :2]
num = [c for c in X.columns if pd.api.types.is_numeric_dtype(X[c])]
cat = [c for c in X.columns if c not in num]
prep = ColumnTransformer([
    ("num", SimpleImputer(strategy="median"), num),
    ("cat", make_pipeline(SimpleImputer(strategy="constant", fill_value="missing"),
                          OrdinalEncoder(handle_unknown="use_encoded_value", unknown_value=-1)), cat),
])
""",
}

_FIT = """\
model = make_pipeline(prep, {estimator})
model.fit(X, y)
"""

# a weak variant: fit on a small stratified / random subsample
_FIT_SUBSAMPLE = """\
from sklearn.model_selection import train_test_split
X_small, _, y_small, _ = train_test_split(X, y, train_size=0.15, random_state=0{stratify})
model = make_pipeline(prep, {estimator})
model.fit(X_small, y_small)
"""

_WRITE = {
    "label": """\
pd.DataFrame({{ID: test[ID], TARGET: model.predict(X_test)}}).to_csv("submission.csv", index=False)
""",
    "proba_positive": """\
proba = model.predict_proba(X_test)[:, list(model.classes_).index({positive!r})]
pd.DataFrame({{ID: test[ID], TARGET: proba}}).to_csv("submission.csv", index=False)
""",
    "proba_classes": """\
sub = pd.DataFrame(model.predict_proba(X_test), columns=[str(c) for c in model.classes_])
sub.insert(0, ID, test[ID].values)
sub.to_csv("submission.csv", index=False)
""",
    "value": """\
pred = model.predict(X_test){clip}
pd.DataFrame({{ID: test[ID], TARGET: pred}}).to_csv("submission.csv", index=False)
""",
}

# (solution_id, imports, estimator, preprocessing, subsample) per task family.
_CLASSIFIERS: list[tuple[str, str, str, str, bool]] = [
    (
        "majority",
        "from sklearn.dummy import DummyClassifier",
        'DummyClassifier(strategy="most_frequent")',
        "numeric",
        False,
    ),
    ("prior", "from sklearn.dummy import DummyClassifier", 'DummyClassifier(strategy="prior")', "numeric", False),
    (
        "stratified_random",
        "from sklearn.dummy import DummyClassifier",
        'DummyClassifier(strategy="stratified", random_state=0)',
        "numeric",
        False,
    ),
    *[
        (
            f"logreg_C{c}",
            "from sklearn.linear_model import LogisticRegression",
            f"LogisticRegression(C={c}, max_iter=2000)",
            "onehot",
            False,
        )
        for c in ("0.001", "0.1", "1.0")
    ],
    (
        "logreg_numeric_only",
        "from sklearn.linear_model import LogisticRegression",
        "LogisticRegression(max_iter=2000)",
        "numeric",
        False,
    ),
    *[
        (
            f"knn_{k}",
            "from sklearn.neighbors import KNeighborsClassifier",
            f"KNeighborsClassifier(n_neighbors={k})",
            "onehot",
            False,
        )
        for k in (1, 5, 15, 50)
    ],
    (
        "knn_5_unscaled",
        "from sklearn.neighbors import KNeighborsClassifier",
        "KNeighborsClassifier(n_neighbors=5)",
        "ordinal",
        False,
    ),
    *[
        (
            f"tree_depth_{d}",
            "from sklearn.tree import DecisionTreeClassifier",
            f"DecisionTreeClassifier(max_depth={d}, random_state=0)",
            "ordinal",
            False,
        )
        for d in (1, 2, 4, 8, None)
    ],
    ("gaussian_nb", "from sklearn.naive_bayes import GaussianNB", "GaussianNB()", "onehot", False),
    (
        "lda",
        "from sklearn.discriminant_analysis import LinearDiscriminantAnalysis",
        "LinearDiscriminantAnalysis()",
        "numeric",
        False,
    ),
    (
        "rf_10_depth4",
        "from sklearn.ensemble import RandomForestClassifier",
        "RandomForestClassifier(n_estimators=10, max_depth=4, random_state=0)",
        "ordinal",
        False,
    ),
    (
        "rf_100",
        "from sklearn.ensemble import RandomForestClassifier",
        "RandomForestClassifier(n_estimators=100, random_state=0)",
        "ordinal",
        False,
    ),
    (
        "rf_150_leaf3",
        "from sklearn.ensemble import RandomForestClassifier",
        "RandomForestClassifier(n_estimators=150, min_samples_leaf=3, random_state=0)",
        "ordinal",
        False,
    ),
    (
        "extra_trees_100",
        "from sklearn.ensemble import ExtraTreesClassifier",
        "ExtraTreesClassifier(n_estimators=100, random_state=0)",
        "ordinal",
        False,
    ),
    (
        "extra_trees_150_leaf2",
        "from sklearn.ensemble import ExtraTreesClassifier",
        "ExtraTreesClassifier(n_estimators=150, min_samples_leaf=2, random_state=0)",
        "ordinal",
        False,
    ),
    (
        "hgb_default",
        "from sklearn.ensemble import HistGradientBoostingClassifier",
        "HistGradientBoostingClassifier(random_state=0)",
        "ordinal",
        False,
    ),
    (
        "hgb_shallow",
        "from sklearn.ensemble import HistGradientBoostingClassifier",
        "HistGradientBoostingClassifier(max_depth=3, learning_rate=0.1, max_iter=200, random_state=0)",
        "ordinal",
        False,
    ),
    (
        "hgb_tuned_es",
        "from sklearn.ensemble import HistGradientBoostingClassifier",
        "HistGradientBoostingClassifier(learning_rate=0.05, max_iter=500, max_leaf_nodes=15, min_samples_leaf=20, l2_regularization=1.0, early_stopping=True, validation_fraction=0.15, n_iter_no_change=20, random_state=0)",
        "ordinal",
        False,
    ),
    (
        "mlp_64",
        "from sklearn.neural_network import MLPClassifier",
        "MLPClassifier(hidden_layer_sizes=(64,), max_iter=300, early_stopping=True, random_state=0)",
        "onehot",
        False,
    ),
    (
        "weak_two_columns_tree",
        "from sklearn.tree import DecisionTreeClassifier",
        "DecisionTreeClassifier(max_depth=3, random_state=0)",
        "two_columns",
        False,
    ),
    (
        "weak_rf_on_15pct",
        "from sklearn.ensemble import RandomForestClassifier",
        "RandomForestClassifier(n_estimators=50, random_state=0)",
        "ordinal",
        True,
    ),
    (
        "weak_logreg_on_15pct",
        "from sklearn.linear_model import LogisticRegression",
        "LogisticRegression(max_iter=2000)",
        "onehot",
        True,
    ),
]

_REGRESSORS: list[tuple[str, str, str, str, bool]] = [
    ("mean", "from sklearn.dummy import DummyRegressor", "DummyRegressor()", "numeric", False),
    ("median", "from sklearn.dummy import DummyRegressor", 'DummyRegressor(strategy="median")', "numeric", False),
    ("linear", "from sklearn.linear_model import LinearRegression", "LinearRegression()", "onehot", False),
    *[
        (f"ridge_{a}", "from sklearn.linear_model import Ridge", f"Ridge(alpha={a})", "onehot", False)
        for a in ("0.1", "10.0", "100.0")
    ],
    ("lasso", "from sklearn.linear_model import Lasso", "Lasso(alpha=0.1, max_iter=5000)", "onehot", False),
    (
        "linear_numeric_only",
        "from sklearn.linear_model import LinearRegression",
        "LinearRegression()",
        "numeric",
        False,
    ),
    *[
        (
            f"knn_{k}",
            "from sklearn.neighbors import KNeighborsRegressor",
            f"KNeighborsRegressor(n_neighbors={k})",
            "onehot",
            False,
        )
        for k in (1, 5, 15, 50)
    ],
    (
        "knn_5_unscaled",
        "from sklearn.neighbors import KNeighborsRegressor",
        "KNeighborsRegressor(n_neighbors=5)",
        "ordinal",
        False,
    ),
    *[
        (
            f"tree_depth_{d}",
            "from sklearn.tree import DecisionTreeRegressor",
            f"DecisionTreeRegressor(max_depth={d}, random_state=0)",
            "ordinal",
            False,
        )
        for d in (1, 2, 4, 8, None)
    ],
    (
        "rf_10_depth4",
        "from sklearn.ensemble import RandomForestRegressor",
        "RandomForestRegressor(n_estimators=10, max_depth=4, random_state=0)",
        "ordinal",
        False,
    ),
    (
        "rf_100",
        "from sklearn.ensemble import RandomForestRegressor",
        "RandomForestRegressor(n_estimators=100, random_state=0)",
        "ordinal",
        False,
    ),
    (
        "rf_150_leaf3",
        "from sklearn.ensemble import RandomForestRegressor",
        "RandomForestRegressor(n_estimators=150, min_samples_leaf=3, random_state=0)",
        "ordinal",
        False,
    ),
    (
        "extra_trees_100",
        "from sklearn.ensemble import ExtraTreesRegressor",
        "ExtraTreesRegressor(n_estimators=100, random_state=0)",
        "ordinal",
        False,
    ),
    (
        "extra_trees_150_leaf2",
        "from sklearn.ensemble import ExtraTreesRegressor",
        "ExtraTreesRegressor(n_estimators=150, min_samples_leaf=2, random_state=0)",
        "ordinal",
        False,
    ),
    (
        "gbr_default",
        "from sklearn.ensemble import GradientBoostingRegressor",
        "GradientBoostingRegressor(random_state=0)",
        "ordinal",
        False,
    ),
    (
        "hgb_default",
        "from sklearn.ensemble import HistGradientBoostingRegressor",
        "HistGradientBoostingRegressor(random_state=0)",
        "ordinal",
        False,
    ),
    (
        "hgb_shallow",
        "from sklearn.ensemble import HistGradientBoostingRegressor",
        "HistGradientBoostingRegressor(max_depth=3, max_iter=200, random_state=0)",
        "ordinal",
        False,
    ),
    (
        "hgb_tuned_es",
        "from sklearn.ensemble import HistGradientBoostingRegressor",
        "HistGradientBoostingRegressor(learning_rate=0.05, max_iter=500, max_leaf_nodes=15, min_samples_leaf=20, l2_regularization=1.0, early_stopping=True, validation_fraction=0.15, n_iter_no_change=20, random_state=0)",
        "ordinal",
        False,
    ),
    (
        "mlp_64",
        "from sklearn.neural_network import MLPRegressor",
        "MLPRegressor(hidden_layer_sizes=(64,), max_iter=300, early_stopping=True, random_state=0)",
        "onehot",
        False,
    ),
    (
        "weak_two_columns_tree",
        "from sklearn.tree import DecisionTreeRegressor",
        "DecisionTreeRegressor(max_depth=3, random_state=0)",
        "two_columns",
        False,
    ),
    (
        "weak_rf_on_15pct",
        "from sklearn.ensemble import RandomForestRegressor",
        "RandomForestRegressor(n_estimators=50, random_state=0)",
        "ordinal",
        True,
    ),
]

# A log-target variant: strong for skewed positive targets (rmsle tasks especially).
_LOG_TARGET = (
    "hgb_log_target",
    "from sklearn.compose import TransformedTargetRegressor\nfrom sklearn.ensemble import HistGradientBoostingRegressor",
    "TransformedTargetRegressor(regressor=HistGradientBoostingRegressor(random_state=0), func=np.log1p, inverse_func=np.expm1)",
    "ordinal",
    False,
)

#: Templates in the "small" pool (procedural / BYO leaderboards on demand).
_SMALL = {
    "majority",
    "prior",
    "mean",
    "median",
    "logreg_C1.0",
    "ridge_10.0",
    "knn_15",
    "tree_depth_2",
    "tree_depth_8",
    "rf_100",
    "extra_trees_100",
    "hgb_default",
    "hgb_tuned_es",
    "weak_two_columns_tree",
    "lasso",
    "gaussian_nb",
}


def _script(task: Task, imports: str, estimator: str, prep: str, subsample: bool) -> str:
    classification = task.task_type != "regression"
    head = _PRELUDE.format(
        imports=imports, target=task.target, id_column=task.id_column, y_cast=".astype(str)" if classification else ""
    )
    fit = (
        _FIT_SUBSAMPLE.format(estimator=estimator, stratify=", stratify=y" if classification else "")
        if subsample
        else _FIT.format(estimator=estimator)
    )
    write = _WRITE[task.submission_format].format(
        positive=task.positive_class, clip=".clip(min=0)" if task.metric == "rmsle" else ""
    )
    return head + "\n" + _PREP[prep] + fit + write


def _broken(task: Task) -> list[PoolSolution]:
    """Scripts that fail in each way the reward ladder distinguishes (logged, never ranked)."""
    ok = _script(
        task,
        "from sklearn.dummy import DummyClassifier" if task.classes else "from sklearn.dummy import DummyRegressor",
        "DummyClassifier()" if task.classes else "DummyRegressor()",
        "numeric",
        False,
    )
    cols = task.submission_columns
    return [
        PoolSolution("broken_syntax_error", ok.replace("model.fit(X, y)", "model.fit(X, y"), reference=False),
        PoolSolution(
            "broken_reads_private_answers",
            ok.replace(
                'test = pd.read_csv("data/test.csv")',
                'test = pd.read_csv("data/test.csv")\nanswers = pd.read_csv("../private/answers.csv")',
            ),
            reference=False,
        ),
        PoolSolution("broken_no_submission", ok.replace('"submission.csv"', '"predictions.csv"'), reference=False),
        PoolSolution(
            "broken_wrong_columns",
            ok
            + textwrap.dedent(f"""\
            sub = pd.read_csv("submission.csv")
            sub.columns = [{cols[0]!r}] + ["prediction_" + str(i) for i in range(len(sub.columns) - 1)]
            sub.to_csv("submission.csv", index=False)
            """),
            reference=False,
        ),
        PoolSolution(
            "broken_missing_rows",
            ok
            + textwrap.dedent("""\
            sub = pd.read_csv("submission.csv")
            sub.iloc[: len(sub) // 2].to_csv("submission.csv", index=False)
            """),
            reference=False,
        ),
        PoolSolution(
            "broken_timeout",
            "import time\n" + ok.replace("model.fit(X, y)", "time.sleep(600)\nmodel.fit(X, y)"),
            reference=False,
            timeout_probe=True,
        ),
    ]


def reference_pool(task: str | Task, *, size: str = "full", broken: bool = True) -> list[PoolSolution]:
    """The pool of solution scripts for ``task`` (deterministic).

    ``size="full"``: >= 30 reference solutions; ``"small"``: ~12 for on-demand builds.
    """
    task = get_task(task)
    if size not in ("full", "small"):
        raise ValueError(f"size must be 'full' or 'small', got {size!r}")
    templates = list(_CLASSIFIERS if task.task_type != "regression" else _REGRESSORS)
    if task.task_type == "regression":
        y = task.read_train()[task.target]
        if (y >= 0).all():
            templates.append(_LOG_TARGET)
    if size == "small":
        templates = [t for t in templates if t[0] in _SMALL]
    pool = [PoolSolution(sid, _script(task, imp, est, prep, sub)) for sid, imp, est, prep, sub in templates]
    return pool + (_broken(task) if broken else [])


def _run_limits(task: Task, config: LeaderboardConfig) -> dict[str, Any]:
    """The task's per-run limits, with the config's overrides (``None`` = the task's own)."""
    lim = task.run_limits()
    if config.wall_seconds is not None:
        lim["wall_seconds"] = float(config.wall_seconds)
    if config.memory_bytes is not None:
        lim["memory_bytes"] = int(config.memory_bytes)
    return lim


def load_leaderboard(task: str | Task) -> list[float] | None:
    """The task's leaderboard scores, or ``None`` if it has not been built."""
    path = get_task(task).private_dir / "leaderboard.json"
    if not path.is_file():
        return None
    return [e["score"] for e in json.loads(path.read_text())["entries"]]


def _log_line(
    task: Task, sol: PoolSolution, outcome: Outcome | None, limits: dict[str, Any] | None = None
) -> dict[str, Any]:
    return {
        "task_id": task.task_id,
        "solution_id": sol.solution_id,
        "code": sol.code,
        "context": grading_context(task, limits=limits),
        "outcome": None if outcome is None else outcome.to_dict(),
        "origin": "leaderboard-pool",
    }


def refresh_log_contexts(tasks: Iterable[str | Task], logs_dir: str | Path | None = None) -> dict[str, int]:
    """Rewrite the ``context`` of every line of each task's pool log from the task's current
    public metadata (e.g. after new meta-features were added to ``task.json``); code,
    outcome and everything else stay as executed. A line's recorded ``context["limits"]``
    is kept; lines written before limits were recorded get the task's own limits (what
    the builder used). Returns the number of lines rewritten per task.
    """
    out = Path(logs_dir) if logs_dir else logs_root()
    counts: dict[str, int] = {}
    for task in (get_task(t) for t in tasks):
        path = out / f"{task.task_id}.jsonl"
        lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        for rec in lines:
            rec["context"] = grading_context(task, limits=rec.get("context", {}).get("limits"))
        path.write_text("".join(json.dumps(rec) + "\n" for rec in lines))
        counts[task.task_id] = len(lines)
    return counts


def _first_outcome(task: Task, sol: PoolSolution, result: Any, answers: Any) -> Outcome | None:
    """Outcome before ranking (``None`` when the sandbox itself failed twice)."""
    syntax = check_syntax(sol.code)
    if syntax is not None:
        return syntax
    if harness_failed(result):
        return None
    return outcome_from_execution(task, result, None, answers=answers)


def _execute_pools(
    resolved: list[Task], run_limits: Mapping[str, Mapping[str, Any]], executor: Any, config: LeaderboardConfig
) -> tuple[list[tuple[Task, PoolSolution]], dict[tuple[str, str], Any], float]:
    """Run every task's pool in the sandbox: ``(plan, results by (task_id, solution_id), seconds)``.
    Syntax errors never reach the sandbox (same rule as the env); a run whose sandbox died from
    outside says nothing about the script, so it is retried once."""
    from wmrl_envs.sandbox import ExecutorPool, Job, Limits, default_executor

    executor = executor or default_executor()
    ref_limits = {
        tid: Limits(wall_seconds=lim["wall_seconds"], cpu_seconds=lim["wall_seconds"], memory_bytes=lim["memory_bytes"])
        for tid, lim in run_limits.items()
    }
    probe_limits = Limits(wall_seconds=config.timeout_probe_seconds, cpu_seconds=config.timeout_probe_seconds)
    plan = [(task, sol) for task in resolved for sol in reference_pool(task, size=config.size, broken=config.broken)]
    runnable = [(t, s) for t, s in plan if check_syntax(s.code) is None]
    jobs = [
        Job(s.code, t.inputs(), (SUBMISSION_FILE,), probe_limits if s.timeout_probe else ref_limits[t.task_id])
        for t, s in runnable
    ]
    start = time.perf_counter()
    with ExecutorPool(executor, max_concurrent=config.max_concurrent, progress=True) as pool:
        results = dict(zip([(t.task_id, s.solution_id) for t, s in runnable], pool.map(jobs)))
        retry = [(key, job) for key, job in zip(results, jobs) if harness_failed(results[key])]
        for key, result in zip([k for k, _ in retry], pool.map([j for _, j in retry])):
            results[key] = result
    return plan, results, time.perf_counter() - start


def relabel_pool_logs(
    tasks: Iterable[str | Task], out_dir: str | Path, executor: Any = None, config: LeaderboardConfig | None = None
) -> dict[str, dict[str, int]]:
    """Re-execute each task's pool under the sandbox's *current* runtime and write
    ``out_dir/<task_id>.jsonl`` (the shipped logs' format), graded against the task's
    **existing** leaderboard, which stays as it is. For checking a world model against the
    runtime it will be graded by when the shipped logs were executed under an older one.
    Resumable per task: a task whose log is already in ``out_dir`` is skipped.
    Returns per task the outcome statuses."""
    config = config or LeaderboardConfig()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    summary: dict[str, dict[str, int]] = {}
    for task in tqdm([get_task(t) for t in tasks], desc="relabel", unit="task"):
        path = out / f"{task.task_id}.jsonl"
        if path.is_file():
            continue
        limits = {task.task_id: _run_limits(task, config)}
        plan, results, _ = _execute_pools([task], limits, executor, config)
        board, answers = load_leaderboard(task), task.read_answers()
        lines: list[str] = []
        statuses: dict[str, int] = {}
        for _, sol in plan:
            o = _first_outcome(task, sol, results.get((task.task_id, sol.solution_id)), answers)
            if o is not None and o.status == "valid":
                o = outcome_from_execution(task, results[(task.task_id, sol.solution_id)], board, answers=answers)
            statuses[o.status if o else "unknown"] = statuses.get(o.status if o else "unknown", 0) + 1
            lines.append(json.dumps(_log_line(task, sol, o, limits[task.task_id])) + "\n")
        tmp = path.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(lines))
        tmp.replace(path)  # atomic: a killed run leaves no half-written log to be skipped next time
        summary[task.task_id] = statuses
    return summary


def build_leaderboards(
    tasks: Iterable[str | Task], executor: Any = None, config: LeaderboardConfig | None = None
) -> dict[str, dict[str, Any]]:
    """Execute each task's pool in the sandbox; write leaderboards (and logs).

    Returns per task: ``{"n_reference", "n_valid", "median_seconds", "statuses": {...}}``.
    """
    config = config or LeaderboardConfig()
    resolved = [get_task(t) for t in tasks]
    run_limits = {t.task_id: _run_limits(t, config) for t in resolved}
    plan, results, elapsed = _execute_pools(resolved, run_limits, executor, config)

    summary: dict[str, dict[str, Any]] = {}
    for task in tqdm(resolved, desc="leaderboards", unit="task"):
        sols = [s for t, s in plan if t is task]
        answers = task.read_answers()
        # First pass: raw scores (no leaderboard yet) to build the board itself.
        first = {
            s.solution_id: _first_outcome(task, s, results.get((task.task_id, s.solution_id)), answers) for s in sols
        }
        entries = [
            {
                "solution_id": s.solution_id,
                "score": o.metrics["value"],
                "wall_seconds": results[(task.task_id, s.solution_id)].wall_seconds,
            }
            for s in sols
            if s.reference and (o := first[s.solution_id]) is not None and o.status == "valid"
        ]
        board = [e["score"] for e in entries]
        (task.private_dir / "leaderboard.json").write_text(
            json.dumps(
                {
                    "task_id": task.task_id,
                    "metric": task.metric,
                    "higher_is_better": get_metric(task.metric).higher_is_better,
                    "entries": sorted(
                        entries, key=lambda e: e["score"], reverse=get_metric(task.metric).higher_is_better
                    ),
                },
                indent=1,
            )
            + "\n"
        )
        final = {
            sid: (
                o
                if o is None or o.status != "valid"
                else outcome_from_execution(task, results[(task.task_id, sid)], board, answers=answers)
            )
            for sid, o in first.items()
        }
        statuses: dict[str, int] = {}
        for o in final.values():
            status = "unknown" if o is None else o.status
            statuses[status] = statuses.get(status, 0) + 1
        times = [e["wall_seconds"] for e in entries]
        exec_statuses: dict[str, int] = {}
        for s in sols:
            r = results.get((task.task_id, s.solution_id))
            if s.reference and r is not None:
                exec_statuses[r.status] = exec_statuses.get(r.status, 0) + 1
        summary[task.task_id] = {
            "n_reference": sum(s.reference for s in sols),
            "n_valid": len(entries),
            "median_seconds": round(statistics.median(times), 2) if times else None,
            "max_seconds": round(max(times), 2) if times else None,
            "limits": run_limits[task.task_id],
            "statuses": statuses,
            "reference_exec_statuses": exec_statuses,
        }
        if config.write_logs:
            out = Path(config.logs_dir) if config.logs_dir else logs_root()
            out.mkdir(parents=True, exist_ok=True)
            with open(out / f"{task.task_id}.jsonl", "w") as f:
                for s in sols:
                    f.write(json.dumps(_log_line(task, s, final[s.solution_id], run_limits[task.task_id])) + "\n")
    summary["_total"] = {"wall_seconds": round(elapsed, 1), "runs": len(results)}
    return summary
