"""Scaffolds: how an LLM is prompted, and how its text becomes the env's action.

Both scaffolds produce the AutoResearch text action (a reply holding one fenced Python
script, or an information request), so either feeds the same env and wrappers.

* :class:`RawCodeScaffold` — the paper's setting: the model reads the task overview, writes
  its analysis and then one fenced Python script (or asks for information).
  :func:`extract_script` recovers the script from imperfect output (unterminated fences,
  several blocks, untagged fences, bare code).
* :class:`PlanScaffold` — compact, for small models: the model writes a few ``key: value``
  lines (model family, hyperparameters, preprocessing); :func:`parse_plan` reads them
  tolerantly and :func:`render_plan` turns them into a complete runnable scikit-learn
  script for the task (target, id column, submission format from the task's fields).
  An unreadable plan is passed through as-is, so the env grades it ``malformed``.
* :class:`RichPlanScaffold` — the agent-style plan grammar of
  :mod:`wmrl_envs.autoresearch.plans` (>= 10^4 distinct scripts per task).

Classes: :class:`TaskSpec`, :class:`Plan`, :class:`Scaffold`, :class:`RawCodeScaffold`,
:class:`PlanScaffold`. Functions: :func:`extract_script`, :func:`parse_plan`,
:func:`render_plan`, :func:`make_scaffold`. Constant: :data:`MODEL_FAMILIES`.

>>> parse_plan("- Model: Random Forest\\nn_estimators = 300\\nscale: no").model
'random_forest'
>>> extract_script("Idea: a forest.\\n```python\\nimport pandas as pd\\nprint(1)")
'import pandas as pd\\nprint(1)'
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Protocol

__all__ = [
    "TaskSpec",
    "Plan",
    "Scaffold",
    "RawCodeScaffold",
    "PlanScaffold",
    "RichPlanScaffold",
    "extract_script",
    "fenced_script",
    "parse_plan",
    "render_plan",
    "make_scaffold",
    "MODEL_FAMILIES",
    "SCAFFOLDS",
]

Message = dict[str, str]

#: Model families a plan may choose (canonical names).
MODEL_FAMILIES = ("linear", "random_forest", "extra_trees", "gradient_boosting", "knn", "baseline")

_FAMILY_ALIASES = {
    "linear": "linear",
    "logistic": "linear",
    "logistic_regression": "linear",
    "linear_regression": "linear",
    "ridge": "linear",
    "lasso": "linear",
    "random_forest": "random_forest",
    "randomforest": "random_forest",
    "rf": "random_forest",
    "forest": "random_forest",
    "extra_trees": "extra_trees",
    "extratrees": "extra_trees",
    "gradient_boosting": "gradient_boosting",
    "gradientboosting": "gradient_boosting",
    "boosting": "gradient_boosting",
    "gbm": "gradient_boosting",
    "hist_gradient_boosting": "gradient_boosting",
    "xgboost": "gradient_boosting",
    "lightgbm": "gradient_boosting",
    "knn": "knn",
    "k_nearest_neighbors": "knn",
    "nearest_neighbors": "knn",
    "kneighbors": "knn",
    "baseline": "baseline",
    "dummy": "baseline",
}


_STAT_KEYS = (
    "n_train",
    "n_test",
    "n_cols",
    "n_numeric",
    "n_categorical",
    "missing_fraction",
    "max_cardinality",
    "n_classes",
    "minority_fraction",
)


@dataclass(frozen=True)
class TaskSpec:
    """What a scaffold needs to know about a task (the env's reset ``info`` task fields).

    Attributes mirror :class:`wmrl_envs.autoresearch.tasks.Task`: ``task_type``
    (binary / multiclass / regression), ``metric``, ``target``, ``id_column``,
    ``submission_format`` (label / proba_positive / proba_classes / value), ``classes``
    (strings; ``classes[1]`` is the positive class of a binary task), ``question``,
    ``stats`` (public meta-features).
    """

    task_id: str
    task_type: str
    metric: str
    target: str
    id_column: str
    submission_format: str
    classes: tuple[str, ...] | None = None
    question: str = ""
    stats: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_info(cls, info: Mapping[str, Any]) -> TaskSpec:
        """Build from an AutoResearch reset ``info`` (task fields and meta-features at top level,
        or nested under ``"task"``; meta-features flat or under ``"stats"``)."""
        nested = info.get("task")
        source: Mapping[str, Any] = nested if isinstance(nested, Mapping) else info
        required = ("task_id", "task_type", "metric", "target", "id_column", "submission_format")
        missing = [k for k in required if k not in source]
        if missing:
            raise KeyError(f"reset info lacks task fields {missing}; got keys {sorted(source)}")
        classes = source.get("classes")
        stats = dict(source.get("stats") or {})
        stats.update({k: source[k] for k in _STAT_KEYS if k in source})
        return cls(
            task_id=str(source["task_id"]),
            task_type=source["task_type"],
            metric=source["metric"],
            target=source["target"],
            id_column=source["id_column"],
            submission_format=source["submission_format"],
            classes=tuple(str(c) for c in classes) if classes is not None else None,
            question=source.get("question") or source.get("title") or "",
            stats=stats,
        )

    @classmethod
    def from_task(cls, task: Any) -> TaskSpec:
        """Build from an AutoResearch task (a catalog id, a task directory or a ``Task``),
        with the same fields its env's reset ``info`` carries."""
        from wmrl_envs.autoresearch.tasks import get_task

        t = get_task(task)
        return cls.from_info({**t.to_json(), **t.meta_features()})


class Scaffold(Protocol):
    """Turns observations into chat messages and model text into env actions."""

    name: str
    #: Text that opens every assistant reply (part of the prompt, not sampled; ``""`` = none).
    #: Priming the reply's first words keeps small models on the requested format.
    response_prefix: str

    def initial_messages(self, obs: str, task: TaskSpec) -> list[Message]:
        """The chat for the first turn (system + user)."""

    def followup_message(self, obs: str, task: TaskSpec) -> Message:
        """The user message carrying a later observation (execution feedback, answers)."""

    def to_action(self, text: str, task: TaskSpec) -> str:
        """The env action for the model's reply ``text``."""


# ------------------------------------------------------------------ raw code scaffold
_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)(?:```|\Z)", re.S)
_IMPORT_LINE = re.compile(r"^[ \t]*(?:import|from)[ \t]+[A-Za-z_]", re.M)
_CODE_START = re.compile(r"^(import |from \S+ import |def |class |[A-Za-z_][A-Za-z0-9_]* = )", re.M)


def extract_script(text: str) -> str | None:
    """The Python script in a model reply, or ``None`` if there is none.

    Prefers the last fenced block tagged ``python``/``py``; otherwise the longest fenced
    block; an opening fence without a closing one runs to the end of the text; with no
    fence at all, the text from the first line that looks like code (``import``, ``from``,
    ``def``, an assignment) when an import line follows.
    """
    blocks = [(lang.lower(), body.strip("\n")) for lang, body in _FENCE.findall(text)]
    blocks = [(lang, body) for lang, body in blocks if body.strip()]
    if blocks:
        tagged = [body for lang, body in blocks if lang in ("python", "py", "python3")]
        script = tagged[-1] if tagged else max((body for _, body in blocks), key=len)
        return script.strip() or None
    match = _CODE_START.search(text)
    if match and _IMPORT_LINE.search(text, match.start()):
        return text[match.start() :].strip()
    return None


def fenced_script(script: str) -> str:
    """``script`` as the raw-code scaffold's actions carry it: one fenced ```python block."""
    return f"```python\n{script.rstrip()}\n```"


@dataclass
class RawCodeScaffold:
    """Analysis, then one fenced Python script or an information request (the paper's format).

    Args:
        max_obs_chars: observations are cut to this many characters (head kept) so
            prompts stay within the model's context.
        info_request_prefix: how the env recognises an information request; a reply
            without a script that starts with it is passed through unchanged.
    """

    name: str = "raw"
    response_prefix: str = ""
    max_obs_chars: int = 6000
    info_request_prefix: str = "REQUEST_INFO"

    def initial_messages(self, obs: str, task: TaskSpec) -> list[Message]:
        system = (
            "You are an expert data scientist solving a Kaggle-style task. Read the task, briefly "
            "analyse it, then reply with exactly one complete Python script in a ```python fenced "
            "block. The script reads ./data/train.csv and ./data/test.csv and writes ./submission.csv "
            "in the required format. Available: numpy, pandas, scikit-learn, scipy. "
            f"To ask a question about the data instead, reply with a line starting with {self.info_request_prefix}."
        )
        return [{"role": "system", "content": system}, {"role": "user", "content": obs[: self.max_obs_chars]}]

    def followup_message(self, obs: str, task: TaskSpec) -> Message:
        return {"role": "user", "content": obs[: self.max_obs_chars]}

    def to_action(self, text: str, task: TaskSpec) -> str:
        script = extract_script(text)
        if script is not None:
            return fenced_script(script)
        return text.strip()


# ------------------------------------------------------------------ compact plan scaffold
@dataclass(frozen=True)
class Plan:
    """A parsed plan; every field has a documented default used when a line is missing.

    Attributes:
        model: one of :data:`MODEL_FAMILIES`.
        n_estimators: trees / boosting rounds, clamped to [10, 300]. Default 100.
        max_depth: tree depth, clamped to [1, 30]; ``None`` = unlimited (forests) /
            the library default (boosting). Default ``None``.
        learning_rate: boosting step, clamped to [0.01, 1.0]. Default 0.1.
        C: inverse regularisation of linear models, clamped to [1e-3, 1e3]. Default 1.0.
        n_neighbors: for knn, clamped to [1, 100]. Default 15.
        impute: ``mean`` or ``median`` for numeric columns. Default ``median``.
        scale: standardise numeric columns. Default ``True``.
        categorical: ``onehot`` (up to 20 levels per column) or ``drop``. Default ``onehot``.
    """

    model: str
    n_estimators: int = 100
    max_depth: int | None = None
    learning_rate: float = 0.1
    C: float = 1.0
    n_neighbors: int = 15
    impute: str = "median"
    scale: bool = True
    categorical: str = "onehot"


_LINE = re.compile(r"^[\s>*#`-]*\**\s*([A-Za-z_][A-Za-z0-9_ ]*?)\s*\**\s*[:=]\s*(.+?)\s*$")
_TRUE = {"yes", "true", "1", "on", "y", "standard", "standardize", "standardise"}
_FALSE = {"no", "false", "0", "off", "n", "none"}


def _canon(s: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", s.strip().lower()).strip("_")


def _number(value: str) -> float | None:
    m = re.search(r"[-+]?\d*\.?\d+(?:[eE][-+]?\d+)?", value)
    return float(m.group()) if m else None


def _clamp(x: float, lo: float, hi: float) -> float:
    return min(max(x, lo), hi)


def parse_plan(text: str) -> Plan | None:
    """Read ``key: value`` lines (markdown bullets, bold, ``=`` tolerated); ``None`` without a known model.

    The model value may be a canonical family, an alias (``rf``, ``xgboost``, ``logistic``)
    or a phrase naming exactly one family (``"random forest classifier"``). Unknown keys are ignored; unreadable values fall back to the field default; numbers are
    clamped to the ranges documented on :class:`Plan`. The first ``model`` line wins.
    """
    values: dict[str, str] = {}
    for line in text.splitlines():
        m = _LINE.match(line)
        if m:
            values.setdefault(_canon(m.group(1)), m.group(2).strip().strip("`*\"'"))
    model_text = values.get("model") or values.get("model_family") or values.get("algorithm")
    if model_text is None:
        return None
    family = _FAMILY_ALIASES.get(_canon(model_text))
    if family is None:  # "random forest classifier", "a gradient boosting model", ...
        canon = _canon(model_text)
        found = {fam for alias, fam in _FAMILY_ALIASES.items() if len(alias) > 3 and alias in canon}
        # Only an unambiguous mention counts: copying the list of options is not a choice.
        family = found.pop() if len(found) == 1 else None
    if family is None:
        return None
    plan = Plan(model=family)
    updates: dict[str, Any] = {}
    if (n := _number(values.get("n_estimators", ""))) is not None:
        updates["n_estimators"] = int(_clamp(n, 10, 300))
    depth = values.get("max_depth")
    if depth is not None:
        d = _number(depth)
        updates["max_depth"] = int(_clamp(d, 1, 30)) if d is not None else None
    if (lr := _number(values.get("learning_rate", ""))) is not None:
        updates["learning_rate"] = _clamp(lr, 0.01, 1.0)
    if (c := _number(values.get("c", values.get("regularization", "")))) is not None:
        updates["C"] = _clamp(c, 1e-3, 1e3) if c > 0 else plan.C
    if (k := _number(values.get("n_neighbors", values.get("k", "")))) is not None:
        updates["n_neighbors"] = int(_clamp(k, 1, 100))
    impute = _canon(values.get("impute", ""))
    if impute in ("mean", "median"):
        updates["impute"] = impute
    scale = _canon(values.get("scale", ""))
    if scale in _TRUE or scale in _FALSE:
        updates["scale"] = scale in _TRUE
    categorical = _canon(values.get("categorical", ""))
    if categorical in ("onehot", "one_hot", "drop"):
        updates["categorical"] = "drop" if categorical == "drop" else "onehot"
    return replace(plan, **updates)


_ESTIMATORS = {
    ("linear", False): "LogisticRegression(C={C}, max_iter=2000)",
    ("linear", True): "Ridge(alpha={alpha})",
    (
        "random_forest",
        False,
    ): "RandomForestClassifier(n_estimators={n_estimators}, max_depth={max_depth}, n_jobs=1, random_state=0)",
    (
        "random_forest",
        True,
    ): "RandomForestRegressor(n_estimators={n_estimators}, max_depth={max_depth}, n_jobs=1, random_state=0)",
    (
        "extra_trees",
        False,
    ): "ExtraTreesClassifier(n_estimators={n_estimators}, max_depth={max_depth}, n_jobs=1, random_state=0)",
    (
        "extra_trees",
        True,
    ): "ExtraTreesRegressor(n_estimators={n_estimators}, max_depth={max_depth}, n_jobs=1, random_state=0)",
    (
        "gradient_boosting",
        False,
    ): "HistGradientBoostingClassifier(max_iter={n_estimators}, learning_rate={learning_rate}, max_depth={max_depth}, random_state=0)",
    (
        "gradient_boosting",
        True,
    ): "HistGradientBoostingRegressor(max_iter={n_estimators}, learning_rate={learning_rate}, max_depth={max_depth}, random_state=0)",
    ("knn", False): "KNeighborsClassifier(n_neighbors={n_neighbors})",
    ("knn", True): "KNeighborsRegressor(n_neighbors={n_neighbors})",
    ("baseline", False): "DummyClassifier(strategy='prior')",
    ("baseline", True): "DummyRegressor(strategy='mean')",
}

_SCRIPT = """\
# Rendered from the plan: {plan_json}
import numpy as np
import pandas as pd
from sklearn.compose import ColumnTransformer
from sklearn.dummy import DummyClassifier, DummyRegressor
from sklearn.ensemble import (ExtraTreesClassifier, ExtraTreesRegressor, HistGradientBoostingClassifier,
                              HistGradientBoostingRegressor, RandomForestClassifier, RandomForestRegressor)
from sklearn.impute import SimpleImputer
from sklearn.linear_model import LogisticRegression, Ridge
from sklearn.neighbors import KNeighborsClassifier, KNeighborsRegressor
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import OneHotEncoder, StandardScaler

TARGET, ID = {target!r}, {id_column!r}
REGRESSION = {regression!r}
FORMAT, CLASSES = {submission_format!r}, {classes!r}

train = pd.read_csv("data/train.csv")
test = pd.read_csv("data/test.csv")
y = train[TARGET] if REGRESSION else train[TARGET].astype(str)
X = train.drop(columns=[TARGET, ID])
X_test = test.drop(columns=[c for c in (TARGET, ID) if c in test.columns])[X.columns].copy()
numeric = [c for c in X.columns if pd.api.types.is_numeric_dtype(X[c])]
categorical = [c for c in X.columns if c not in numeric] if {use_categorical!r} else []
if categorical:
    X[categorical] = X[categorical].astype(str)
    X_test[categorical] = X_test[categorical].astype(str)

steps = [SimpleImputer(strategy={impute!r})] + ([StandardScaler()] if {scale!r} else [])
preprocess = ColumnTransformer(
    [("num", make_pipeline(*steps), numeric),
     ("cat", OneHotEncoder(handle_unknown="ignore", max_categories=20, sparse_output=False), categorical)],
    remainder="drop")
model = make_pipeline(preprocess, {estimator})
model.fit(X, y)

submission = pd.DataFrame({{ID: test[ID]}})
if REGRESSION:
    # Clip to the training range: wild extrapolations only hurt, and some metrics need >= 0.
    submission[TARGET] = np.clip(model.predict(X_test), y.min(), y.max())
elif FORMAT == "label":
    submission[TARGET] = model.predict(X_test)
else:
    fitted = [str(c) for c in model.classes_]
    proba = pd.DataFrame(model.predict_proba(X_test), columns=fitted)
    for c in CLASSES:
        if c not in proba.columns:
            proba[c] = 0.0
    if FORMAT == "proba_positive":
        submission[TARGET] = proba[CLASSES[1]].values
    else:
        for c in CLASSES:
            submission[c] = proba[c].values
submission.to_csv("submission.csv", index=False)
print("wrote submission.csv", submission.shape)
"""


def render_plan(plan: Plan, task: TaskSpec) -> str:
    """A complete Python script implementing ``plan`` for ``task`` (scikit-learn >= 1.2)."""
    regression = task.task_type == "regression"
    if not regression and task.submission_format != "label" and not task.classes:
        raise ValueError(f"task {task.task_id!r}: probability submissions need the class list")
    estimator = _ESTIMATORS[(plan.model, regression)].format(
        C=plan.C,
        alpha=round(1.0 / plan.C, 6),
        n_estimators=plan.n_estimators,
        max_depth=plan.max_depth,
        learning_rate=plan.learning_rate,
        n_neighbors=plan.n_neighbors,
    )
    return _SCRIPT.format(
        plan_json=json.dumps(asdict(plan)),
        target=task.target,
        id_column=task.id_column,
        regression=regression,
        submission_format=task.submission_format,
        classes=list(task.classes) if task.classes else None,
        use_categorical=plan.categorical == "onehot",
        impute=plan.impute,
        scale=plan.scale,
        estimator=estimator,
    )


_PLAN_FORMAT = """\
model: one of linear, random_forest, extra_trees, gradient_boosting, knn, baseline
n_estimators: number of trees (10-300)
max_depth: tree depth (1-30) or none
learning_rate: for gradient_boosting (0.01-1)
C: regularisation strength for linear (0.001-1000)
n_neighbors: for knn (1-100)
impute: mean or median
scale: yes or no
categorical: onehot or drop"""


def _plan_messages(task: TaskSpec, system: str, grammar: str) -> list[Message]:
    """A compact task card (question, type, metric, size, column kinds) and the plan's grammar:
    cheaper to prefill than the full overview for small models on CPU."""
    s = task.stats
    card = [
        f"Task: {task.question or task.task_id}",
        f"Type: {task.task_type}; metric: {task.metric}; predict column '{task.target}'.",
    ]
    if s:
        card.append(
            f"Data: {s.get('n_train', '?')} training rows, {s.get('n_numeric', '?')} numeric and "
            f"{s.get('n_categorical', '?')} categorical columns, {100 * float(s.get('missing_fraction') or 0):.0f}% missing."
        )
    user = "\n".join(card) + "\n\nWrite the plan using these lines:\n" + grammar
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def _plan_followup(obs: str, max_chars: int) -> Message:
    text = obs[-max_chars:]
    return {
        "role": "user",
        "content": f"Result of your plan:\n{text}\n\nWrite an improved plan (same key: value lines).",
    }


@dataclass
class PlanScaffold:
    """A few ``key: value`` lines rendered into a full scikit-learn script.

    The prompt is a compact task card (question, type, metric, size, column kinds) rather
    than the full overview, which keeps prefill cheap for small models on CPU.

    Every reply is primed with ``"model:"`` (:attr:`response_prefix`), so the model's first
    sampled words choose the model family.

    Args:
        max_feedback_chars: later observations (execution feedback) are cut to this.
    """

    name: str = "plan"
    response_prefix: str = "model:"
    max_feedback_chars: int = 400

    def initial_messages(self, obs: str, task: TaskSpec) -> list[Message]:
        system = (
            "You are a data scientist. You choose a scikit-learn model by writing a short plan of key: value lines."
        )
        return _plan_messages(task, system, _PLAN_FORMAT)

    def followup_message(self, obs: str, task: TaskSpec) -> Message:
        return _plan_followup(obs, self.max_feedback_chars)

    def to_action(self, text: str, task: TaskSpec) -> str:
        plan = parse_plan(text)
        if plan is None:
            return text.strip()
        # Only the rendered script: the plan itself is recorded in the script's first line.
        return fenced_script(render_plan(plan, task))


@dataclass
class RichPlanScaffold:
    """The agent-style plan grammar (:mod:`wmrl_envs.autoresearch.plans`): family, model and
    its hyperparameters over wide ranges, preprocessing, features, ensembles and searches,
    rendered into the script an agent would write (pipelines, pandas, encodings, LightGBM /
    XGBoost, searches, stacking) -- more than 10^4 distinct scripts per task, including
    settings that exceed a task's limits. Every reply is primed with ``"family:"``.

    Catalog tasks only: the renderer reads the task's columns (``get_task(task_id)``); a
    reply it cannot read, or a task it cannot load, is passed through (graded ``malformed``).

    Args:
        max_feedback_chars: later observations (execution feedback) are cut to this.
    """

    name: str = "rich"
    response_prefix: str = "family:"
    max_feedback_chars: int = 400

    def initial_messages(self, obs: str, task: TaskSpec) -> list[Message]:
        from wmrl_envs.autoresearch.plans import grammar_help

        return _plan_messages(
            task, "You are a data scientist. You write a solution plan as key: value lines.", grammar_help()
        )

    def followup_message(self, obs: str, task: TaskSpec) -> Message:
        return _plan_followup(obs, self.max_feedback_chars)

    def to_action(self, text: str, task: TaskSpec) -> str:
        from wmrl_envs.autoresearch.plans import plan_from_text, render
        from wmrl_envs.autoresearch.tasks import get_task

        try:
            catalog_task = get_task(task.task_id)
        except (FileNotFoundError, KeyError, ValueError):
            return text.strip()
        plan = plan_from_text(text, catalog_task)
        return text.strip() if plan is None else fenced_script(render(plan, catalog_task))


SCAFFOLDS = {"raw": RawCodeScaffold, "plan": PlanScaffold, "rich": RichPlanScaffold}


def make_scaffold(name: str, **kwargs: Any) -> Scaffold:
    """``"raw"``, ``"plan"`` or ``"rich"`` with its keyword arguments."""
    if name not in SCAFFOLDS:
        raise ValueError(f"unknown scaffold {name!r}; choose from {sorted(SCAFFOLDS)}")
    return SCAFFOLDS[name](**kwargs)
