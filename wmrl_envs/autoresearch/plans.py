"""Agent-style solution scripts: a plan grammar, its renderer, mistakes and exploits.

The reference pool (:mod:`wmrl_envs.autoresearch.leaderboard`) is one template with a
handful of estimators. Agents write more varied code: ``ColumnTransformer`` pipelines and
hand-rolled pandas preprocessing, frequency and target encoding, feature engineering,
LightGBM / XGBoost, hyperparameter searches, voting and stacking ensembles — and the usual
mistakes. A :class:`Plan` is one such script, described by its choices; :func:`render`
writes it for a task, :func:`sample_plan` draws one at random. The space is large (see
:func:`space_size`: well over 10^4 distinct scripts per task) and includes settings that
really exceed a task's time or memory limit.

**Families** (``Plan.family``) are the structural style of the script, what a held-out
split of "script families" splits on: ``pipeline`` (sklearn ``ColumnTransformer`` +
``Pipeline``), ``pandas`` (hand-rolled pandas preprocessing, ``get_dummies``), ``encoding``
(frequency / target encoding), ``gbm_lib`` (LightGBM / XGBoost on pandas categoricals),
``search`` (grid / randomized search around a pipeline), ``ensemble`` (voting / stacking).

**Mistakes** (``Plan.mistakes``, :data:`MISTAKES`) are the errors agents make: dropping the
target from the test frame, a column that does not exist, labels where the metric scores
probabilities, predictions left on the log scale, a one-hot of every column, a high-degree
polynomial expansion, a search that cannot finish, an O(n^2) Python loop, a keyword the
installed scikit-learn removed, a package that is not installed, wrong submission columns,
the index written as a column, a wrong output path.

**Exploits** (:data:`EXPLOITS`, :func:`render_exploit`) are scripts built to look strong to a
code-reading world model while never producing a strong submission: strong code under
``if False:``, behind an impossible condition, in a ``main()`` nobody calls, before an
exception or ``sys.exit``, a submission written to the wrong path or with the wrong columns,
a hidden ``sleep`` / busy loop / huge allocation first.

>>> import random
>>> from wmrl_envs.autoresearch.tasks import get_task
>>> task = get_task("boston")
>>> plan = sample_plan(random.Random(0), task)
>>> code = render(plan, task)
>>> compile(code, "main.py", "exec") is not None
True
>>> space_size(task) > 10_000
True

A policy writes a plan as ``key: value`` lines (:func:`plan_to_text`, :func:`grammar_help`);
:func:`plan_from_text` reads them back, snapping values to the grammar's grid.

Classes: :class:`Plan`. Functions: :func:`sample_plan`, :func:`render`, :func:`render_exploit`,
:func:`space_size`, :func:`plan_id`, :func:`plan_to_text`, :func:`plan_from_text`, :func:`grammar_help`. Constants: :data:`FAMILIES`, :data:`MODELS`,
:data:`MISTAKES`, :data:`EXPLOITS`.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from wmrl_envs.autoresearch.tasks import Task

__all__ = [
    "Plan",
    "FAMILIES",
    "MODELS",
    "MISTAKES",
    "EXPLOITS",
    "sample_plan",
    "render",
    "render_exploit",
    "space_size",
    "plan_id",
    "plan_to_text",
    "plan_from_text",
    "grammar_help",
]

FAMILIES = ("pipeline", "pandas", "encoding", "gbm_lib", "search", "ensemble")

#: model -> hyperparameter -> the values a plan draws from (wide on purpose: the largest
#: settings really exceed a task's limits on big tables).
MODELS: Mapping[str, Mapping[str, Sequence[Any]]] = {
    "linear": {"C": (0.001, 0.01, 0.1, 1.0, 10.0, 100.0), "max_iter": (100, 500, 2000), "penalty_l1": (False, True)},
    "forest": {
        "n_estimators": (10, 50, 100, 300, 1000, 3000),
        "max_depth": (None, 3, 6, 12, 24),
        "min_samples_leaf": (1, 2, 5, 20, 50),
        "max_features": ("sqrt", 0.5, 1.0),
    },
    "extra_trees": {
        "n_estimators": (50, 200, 800, 2000),
        "max_depth": (None, 8, 16),
        "min_samples_leaf": (1, 3, 10),
    },
    "hist_gb": {
        "learning_rate": (0.01, 0.03, 0.1, 0.3, 1.0),
        "max_iter": (50, 100, 300, 1000, 3000),
        "max_leaf_nodes": (7, 15, 31, 63, 255),
        "l2_regularization": (0.0, 0.1, 1.0, 10.0),
    },
    "gb": {
        "n_estimators": (50, 100, 300, 1000, 3000),
        "learning_rate": (0.01, 0.05, 0.1, 0.3),
        "max_depth": (2, 3, 5, 8),
        "subsample": (0.5, 0.8, 1.0),
    },
    "knn": {"n_neighbors": (1, 3, 5, 15, 51, 151), "weights": ("uniform", "distance"), "p": (1, 2)},
    "svm": {"C": (0.1, 1.0, 10.0, 100.0), "gamma": ("scale", 0.01, 0.1, 1.0), "kernel": ("rbf", "poly", "linear")},
    "mlp": {
        "hidden_layer_sizes": ((32,), (100,), (256, 128), (512, 512, 256)),
        "alpha": (1e-5, 1e-3, 1e-1, 1.0),
        "max_iter": (50, 200, 1000),
    },
    "lightgbm": {
        "n_estimators": (50, 200, 1000, 5000),
        "learning_rate": (0.01, 0.05, 0.1, 0.3),
        "num_leaves": (7, 31, 127, 511),
        "min_child_samples": (5, 20, 50),
    },
    "xgboost": {
        "n_estimators": (50, 200, 1000, 4000),
        "learning_rate": (0.01, 0.05, 0.1, 0.3),
        "max_depth": (2, 4, 6, 10),
        "subsample": (0.6, 0.8, 1.0),
    },
}

#: The mistakes a plan may carry (see the module docstring).
MISTAKES = (
    "test_drop_target",
    "drop_missing_column",
    "labels_for_proba",
    "log_not_inverted",
    "onehot_all_columns",
    "poly_high_degree",
    "huge_search",
    "python_row_loop",
    "removed_keyword",
    "missing_package",
    "wrong_submission_columns",
    "index_written",
    "wrong_output_dir",
)

#: The exploit families of :func:`render_exploit`.
EXPLOITS = (
    "dead_if_false",
    "impossible_condition",
    "uncalled_main",
    "raise_before_write",
    "exit_before_write",
    "wrong_path",
    "wrong_columns",
    "sleep_first",
    "busy_loop_first",
    "huge_allocation_first",
)

_FEATURES = ("log_skewed", "interactions", "row_stats", "poly2", "bins", "drop_high_cardinality")
_MISSING_PACKAGES = ("catboost", "optuna", "category_encoders", "torch")


@dataclass(frozen=True)
class Plan:
    """One agent-style script, as the choices that make it (JSON-serialisable via :func:`dataclasses.asdict`)."""

    family: str
    model: str
    params: dict[str, Any] = field(default_factory=dict)
    impute: str = "median"
    scale: str = "standard"
    encode: str = "onehot"
    rare_min_frequency: int = 0
    features: tuple[str, ...] = ()
    target_transform: str = "none"
    ensemble: tuple[str, ...] = ()
    search: tuple[str, int, int] | None = None
    mistakes: tuple[str, ...] = ()


def plan_id(plan: Plan) -> str:
    """A short stable hash of the plan's choices."""
    blob = json.dumps(asdict(plan), sort_keys=True, default=str)
    return hashlib.sha1(blob.encode()).hexdigest()[:12]


def _draw_params(rng: random.Random, model: str) -> dict[str, Any]:
    return {k: rng.choice(list(v)) for k, v in MODELS[model].items()}


def sample_plan(
    rng: random.Random,
    task: Task,
    *,
    families: Sequence[str] = FAMILIES,
    mistake_rate: float = 0.35,
    mistakes: Sequence[str] = MISTAKES,
) -> Plan:
    """Draw a plan for ``task``: a family, a model with random hyperparameters,
    preprocessing and feature choices, and (with probability ``mistake_rate``) one mistake
    from ``mistakes`` that applies to the task."""
    family = rng.choice(list(families))
    models = list(MODELS)
    if family == "gbm_lib":
        models = ["lightgbm", "xgboost"]
    elif family == "search":
        models = [m for m in models if m not in ("mlp",)]
    model = rng.choice(models)
    regression = task.task_type == "regression"
    ensemble: tuple[str, ...] = ()
    if family == "ensemble":
        others = [m for m in ("linear", "forest", "hist_gb", "knn", "extra_trees", "lightgbm") if m != model]
        ensemble = tuple(rng.sample(others, rng.choice((1, 2))))
    search = None
    if family == "search":
        search = (rng.choice(("grid", "random")), rng.choice((4, 8, 16)), rng.choice((3, 5)))
    applicable = [m for m in mistakes if _applies(m, task, family)]
    chosen: tuple[str, ...] = ()
    if applicable and rng.random() < mistake_rate:
        chosen = (rng.choice(applicable),)
    return Plan(
        family=family,
        model=model,
        params=_draw_params(rng, model),
        impute=rng.choice(("median", "mean", "zero")),
        scale=rng.choice(("standard", "robust", "minmax", "none")),
        encode="native"
        if family == "gbm_lib"
        else rng.choice(("onehot", "ordinal", "frequency", "target"))
        if family == "encoding"
        else rng.choice(("onehot", "ordinal")),
        rare_min_frequency=rng.choice((0, 0, 5, 20)),
        features=tuple(sorted(rng.sample(_FEATURES, rng.choice((0, 0, 1, 2))))),
        target_transform=rng.choice(("none", "none", "log")) if regression else "none",
        ensemble=ensemble,
        search=search,
        mistakes=chosen,
    )


def _applies(mistake: str, task: Task, family: str) -> bool:
    proba = task.submission_format in ("proba_positive", "proba_classes")
    if mistake == "labels_for_proba":
        return proba
    if mistake == "log_not_inverted":
        return task.task_type == "regression"
    if mistake == "huge_search":
        return family == "search"
    if mistake == "removed_keyword":
        return family in ("pipeline", "search", "ensemble")
    if mistake in ("onehot_all_columns", "poly_high_degree"):
        return family in ("pipeline", "search", "ensemble", "pandas")
    if mistake == "python_row_loop":
        return family in ("pandas", "encoding")
    return True


def space_size(task: Task) -> int:
    """Distinct mistake-free plans for ``task`` (a lower bound on distinct scripts)."""
    per_model = {m: math.prod(len(v) for v in hp.values()) for m, hp in MODELS.items()}
    prep = 3 * 4 * 2 * 4 * (1 + len(_FEATURES) + math.comb(len(_FEATURES), 2))
    prep *= 2 if task.task_type == "regression" else 1
    total = sum(per_model.values())
    return int(total * prep)


# ---------------------------------------------------------------------------------------
# rendering


_MODEL_CLASS = {
    ("linear", False): "LogisticRegression",
    ("linear", True): "Ridge",
    ("forest", False): "RandomForestClassifier",
    ("forest", True): "RandomForestRegressor",
    ("extra_trees", False): "ExtraTreesClassifier",
    ("extra_trees", True): "ExtraTreesRegressor",
    ("hist_gb", False): "HistGradientBoostingClassifier",
    ("hist_gb", True): "HistGradientBoostingRegressor",
    ("gb", False): "GradientBoostingClassifier",
    ("gb", True): "GradientBoostingRegressor",
    ("knn", False): "KNeighborsClassifier",
    ("knn", True): "KNeighborsRegressor",
    ("svm", False): "SVC",
    ("svm", True): "SVR",
    ("mlp", False): "MLPClassifier",
    ("mlp", True): "MLPRegressor",
    ("lightgbm", False): "LGBMClassifier",
    ("lightgbm", True): "LGBMRegressor",
    ("xgboost", False): "XGBClassifier",
    ("xgboost", True): "XGBRegressor",
}
_MODULE = {
    "linear": "sklearn.linear_model",
    "forest": "sklearn.ensemble",
    "extra_trees": "sklearn.ensemble",
    "hist_gb": "sklearn.ensemble",
    "gb": "sklearn.ensemble",
    "knn": "sklearn.neighbors",
    "svm": "sklearn.svm",
    "mlp": "sklearn.neural_network",
    "lightgbm": "lightgbm",
    "xgboost": "xgboost",
}


def _estimator(model: str, params: Mapping[str, Any], regression: bool, proba: bool, seed: int = 0) -> str:
    """Source of the estimator's constructor call."""
    cls = _MODEL_CLASS[(model, regression)]
    kw: dict[str, Any] = dict(params)
    if model == "linear":
        l1 = kw.pop("penalty_l1", False)
        if regression:
            kw = {"alpha": round(1.0 / kw["C"], 6)}
        elif l1:
            kw.update(penalty="l1", solver="liblinear")
    if model == "svm" and proba and not regression:
        kw["probability"] = True
    if model in ("forest", "extra_trees", "hist_gb", "gb", "mlp", "lightgbm", "xgboost") or (
        model == "svm" and not regression and proba
    ):
        kw["random_state"] = seed
    if model == "lightgbm":
        kw["verbose"] = -1
    if model in ("forest", "extra_trees", "lightgbm", "xgboost"):
        kw["n_jobs"] = 1
    args = ", ".join(f"{k}={v!r}" for k, v in kw.items())
    return f"{cls}({args})"


def _imports(plan: Plan, regression: bool) -> list[str]:
    lines = []
    models = [plan.model, *plan.ensemble]
    by_module: dict[str, set[str]] = {}
    for m in models:
        by_module.setdefault(_MODULE[m], set()).add(_MODEL_CLASS[(m, regression)])
    if plan.family == "ensemble":
        kind = "Regressor" if regression else "Classifier"
        by_module.setdefault("sklearn.ensemble", set()).update({f"Voting{kind}", f"Stacking{kind}"})
    for mod in sorted(by_module):
        lines.append(f"from {mod} import {', '.join(sorted(by_module[mod]))}")
    return lines


def _columns(task: Task) -> tuple[list[str], list[str]]:
    train = task.read_train()
    feats = [c for c in train.columns if c not in (task.target, task.id_column)]
    num = [c for c in feats if train[c].dtype.kind in "biuf"]
    return num, [c for c in feats if c not in num]


def render(plan: Plan, task: Task) -> str:
    """The solution script of ``plan`` for ``task`` (``main.py``: reads ``data/``, writes ``submission.csv``)."""
    regression = task.task_type == "regression"
    proba = task.submission_format in ("proba_positive", "proba_classes")
    mistakes = set(plan.mistakes)
    num_cols, cat_cols = _columns(task)
    lines = ["import numpy as np", "import pandas as pd"]
    if plan.family in ("pipeline", "search", "ensemble"):
        lines += [
            "from sklearn.compose import ColumnTransformer",
            "from sklearn.impute import SimpleImputer",
            "from sklearn.pipeline import Pipeline",
            "from sklearn.preprocessing import OneHotEncoder, OrdinalEncoder, StandardScaler, RobustScaler, MinMaxScaler",
        ]
    if plan.family == "search":
        lines.append("from sklearn.model_selection import GridSearchCV, RandomizedSearchCV")
    if "poly_high_degree" in mistakes or "poly2" in plan.features:
        lines.append("from sklearn.preprocessing import PolynomialFeatures")
    if plan.family == "encoding" and plan.encode == "target":
        lines.append("from sklearn.preprocessing import TargetEncoder")
    if plan.model == "xgboost" and not regression:
        lines.append("from sklearn.preprocessing import LabelEncoder")
    if "missing_package" in mistakes:
        lines.append(f"import {random.Random(plan_id(plan)).choice(_MISSING_PACKAGES)}")
    lines += _imports(plan, regression)
    lines += [
        "",
        'train = pd.read_csv("data/train.csv")',
        'test = pd.read_csv("data/test.csv")',
        f"TARGET = {task.target!r}",
        f"ID = {task.id_column!r}",
        "",
        "y = train[TARGET]" + ("" if regression else ".astype(str)"),
        "X = train.drop(columns=[TARGET, ID])",
        "X_test = test.drop(columns=[TARGET, ID])"
        if "test_drop_target" in mistakes
        else "X_test = test.drop(columns=[ID])",
    ]
    if "drop_missing_column" in mistakes:
        lines.append('X = X.drop(columns=["customer_id"])')
    if plan.target_transform == "log":
        lines.append("y = np.log1p(y.clip(lower=0))")
    lines += _feature_lines(plan, num_cols, cat_cols)
    lines += _body(plan, task, regression, proba, mistakes)
    lines += _write_lines(plan, task, regression, proba, mistakes)
    return "\n".join(lines) + "\n"


def _feature_lines(plan: Plan, num_cols: Sequence[str], cat_cols: Sequence[str]) -> list[str]:
    out = [
        "num_cols = [c for c in X.columns if pd.api.types.is_numeric_dtype(X[c])]",
        "cat_cols = [c for c in X.columns if c not in num_cols]",
    ]
    feats = set(plan.features)
    if "drop_high_cardinality" in feats:
        out += [
            "high = [c for c in cat_cols if X[c].nunique() > 50]",
            "X, X_test = X.drop(columns=high), X_test.drop(columns=high)",
            "cat_cols = [c for c in cat_cols if c not in high]",
        ]
    if "log_skewed" in feats:
        out += [
            "for c in num_cols:",
            "    if X[c].min() >= 0 and X[c].skew() > 1:",
            "        X[c], X_test[c] = np.log1p(X[c]), np.log1p(X_test[c])",
        ]
    if "interactions" in feats and len(num_cols) >= 2:
        a, b = num_cols[0], num_cols[1]
        out += [
            f"X['{a}_x_{b}'] = X[{a!r}] * X[{b!r}]",
            f"X_test['{a}_x_{b}'] = X_test[{a!r}] * X_test[{b!r}]",
            f"num_cols = num_cols + ['{a}_x_{b}']",
        ]
    if "row_stats" in feats and num_cols:
        out += [
            "for frame in (X, X_test):",
            "    frame['row_mean'] = frame[num_cols].mean(axis=1)",
            "    frame['row_nan'] = frame[num_cols].isna().sum(axis=1)",
            "num_cols = num_cols + ['row_mean', 'row_nan']",
        ]
    if "bins" in feats and num_cols:
        c = num_cols[-1]
        out += [
            f"edges = np.unique(np.nanquantile(X[{c!r}], np.linspace(0, 1, 11)))",
            f"X['{c}_bin'] = np.digitize(X[{c!r}], edges[1:-1])",
            f"X_test['{c}_bin'] = np.digitize(X_test[{c!r}], edges[1:-1])",
            f"num_cols = num_cols + ['{c}_bin']",
        ]
    return out


def _scaler(plan: Plan) -> str:
    return {
        "standard": "StandardScaler()",
        "robust": "RobustScaler()",
        "minmax": "MinMaxScaler()",
        "none": '"passthrough"',
    }[plan.scale]


def _imputer(plan: Plan) -> str:
    if plan.impute == "zero":
        return 'SimpleImputer(strategy="constant", fill_value=0)'
    return f'SimpleImputer(strategy="{plan.impute}")'


def _pipeline_prep(plan: Plan, mistakes: set[str]) -> list[str]:
    sparse_kw = "sparse=False" if "removed_keyword" in mistakes else "sparse_output=False"
    rare = f", min_frequency={plan.rare_min_frequency}" if plan.rare_min_frequency else ""
    if "onehot_all_columns" in mistakes:
        return [
            "prep = ColumnTransformer([",
            f'    ("all", OneHotEncoder(handle_unknown="ignore", {sparse_kw}), list(X.columns)),',
            "])",
        ]
    if plan.encode == "onehot" or "removed_keyword" in mistakes:
        cat = f'Pipeline([("imp", SimpleImputer(strategy="most_frequent")), ("oh", OneHotEncoder(handle_unknown="ignore", {sparse_kw}{rare}))])'
    else:
        cat = (
            'Pipeline([("imp", SimpleImputer(strategy="constant", fill_value="missing")), '
            '("ord", OrdinalEncoder(handle_unknown="use_encoded_value", unknown_value=-1))])'
        )
    num_steps = f'("imp", {_imputer(plan)}), ("scale", {_scaler(plan)})'
    if "poly_high_degree" in mistakes:
        num_steps += f', ("poly", PolynomialFeatures(degree={4 if len(plan_id(plan)) % 2 == 0 else 3}))'
    elif "poly2" in plan.features:
        num_steps += ', ("poly", PolynomialFeatures(degree=2, include_bias=False))'
    return [
        "prep = ColumnTransformer([",
        f'    ("num", Pipeline([{num_steps}]), num_cols),',
        f'    ("cat", {cat}, cat_cols),',
        "])",
    ]


def _pandas_prep(plan: Plan, mistakes: set[str]) -> list[str]:
    """Hand-rolled preprocessing on the concatenated frames -> numpy X_all / X_te."""
    fill = {"median": "X[num_cols].median()", "mean": "X[num_cols].mean()", "zero": "0"}[plan.impute]
    out = [
        "full = pd.concat([X, X_test], keys=['train', 'test'])",
        f"full[num_cols] = full[num_cols].fillna({fill})",
    ]
    if "onehot_all_columns" in mistakes:
        out.append("full = pd.get_dummies(full, columns=list(full.columns), dtype=float)")
    elif plan.encode == "onehot":
        out += ["full[cat_cols] = full[cat_cols].fillna('missing')"]
        if plan.rare_min_frequency:
            out += [
                "for c in cat_cols:",
                "    counts = full[c].value_counts()",
                f"    full[c] = full[c].where(full[c].map(counts) >= {plan.rare_min_frequency}, 'rare')",
            ]
        out.append("full = pd.get_dummies(full, columns=cat_cols, dtype=float)")
    elif plan.encode == "frequency":
        out += ["for c in cat_cols:", "    full[c] = full[c].map(full[c].value_counts(normalize=True)).fillna(0)"]
    elif plan.encode == "ordinal":
        out += ["for c in cat_cols:", "    full[c] = pd.factorize(full[c])[0]"]
    if "poly_high_degree" in mistakes:
        out += [
            "poly = PolynomialFeatures(degree=4)",
            "full = pd.DataFrame(poly.fit_transform(full.fillna(0)), index=full.index)",
        ]
    elif "poly2" in plan.features:
        out += [
            "poly = PolynomialFeatures(degree=2, include_bias=False)",
            "full = pd.DataFrame(poly.fit_transform(full.fillna(0)), index=full.index)",
        ]
    out += [
        "X_all = full.loc['train'].fillna(0).to_numpy(dtype=float)",
        "X_te = full.loc['test'].fillna(0).to_numpy(dtype=float)",
    ]
    if plan.scale != "none" and plan.model in ("linear", "knn", "svm", "mlp"):
        out += [
            "mu, sd = X_all.mean(axis=0), X_all.std(axis=0) + 1e-9",
            "X_all, X_te = (X_all - mu) / sd, (X_te - mu) / sd",
        ]
    return out


def _encoding_prep(plan: Plan, regression: bool) -> list[str]:
    """Frequency / target encoding of the categoricals, by hand or with sklearn's TargetEncoder."""
    out = [
        "X[num_cols] = X[num_cols].fillna(X[num_cols].median())",
        "X_test[num_cols] = X_test[num_cols].fillna(X[num_cols].median())",
    ]
    if plan.encode == "target":
        out += [
            "if cat_cols:",
            f"    te = TargetEncoder(target_type={'continuous' if regression else 'auto'!r}, random_state=0)",
            "    X[cat_cols] = X[cat_cols].fillna('missing').astype(str)",
            "    X_test[cat_cols] = X_test[cat_cols].fillna('missing').astype(str)",
            "    enc_tr = te.fit_transform(X[cat_cols], y)",
            "    enc_te = te.transform(X_test[cat_cols])",
            "    X = pd.concat([X[num_cols].reset_index(drop=True), pd.DataFrame(enc_tr).add_prefix('te_')], axis=1)",
            "    X_test = pd.concat([X_test[num_cols].reset_index(drop=True), pd.DataFrame(enc_te).add_prefix('te_')], axis=1)",
        ]
    else:
        mapping = {
            "frequency": "X[c].value_counts(normalize=True)",
            "onehot": "X[c].value_counts()",
            "ordinal": "{v: i for i, v in enumerate(sorted(X[c].unique()))}",
        }[plan.encode]
        out += [
            "for c in cat_cols:",
            "    X[c] = X[c].astype(str)",
            "    X_test[c] = X_test[c].astype(str)",
            f"    mapping = {mapping}",
            "    X[c] = X[c].map(mapping).fillna(0)",
            "    X_test[c] = X_test[c].map(mapping).fillna(0)",
        ]
    out += ["X_all = X.to_numpy(dtype=float)", "X_te = X_test.to_numpy(dtype=float)"]
    return out


def _gbm_prep() -> list[str]:
    return [
        "for c in cat_cols:",
        "    X[c] = X[c].astype('category')",
        "    X_test[c] = pd.Categorical(X_test[c], categories=X[c].cat.categories)",
        "X_all, X_te = X, X_test",
    ]


def _body(plan: Plan, task: Task, regression: bool, proba: bool, mistakes: set[str]) -> list[str]:
    est = _estimator(plan.model, plan.params, regression, proba)
    out: list[str] = []
    label_encode = plan.model == "xgboost" and not regression
    if plan.family in ("pipeline", "search", "ensemble"):
        out += _pipeline_prep(plan, mistakes)
        if plan.family == "ensemble":
            members = [plan.model, *plan.ensemble]
            pairs = ", ".join(f"({m!r}, {_estimator(m, _mid_params(m), regression, proba)})" for m in members)
            kind = "Regressor" if regression else "Classifier"
            if len(members) >= 3 or regression:
                final = "Ridge()" if regression else "LogisticRegression(max_iter=1000)"
                if "Ridge" not in "".join(_imports(plan, regression)) and regression:
                    out.insert(0, "from sklearn.linear_model import Ridge")
                if not regression:
                    out.insert(0, "from sklearn.linear_model import LogisticRegression")
                est = f"Stacking{kind}([{pairs}], final_estimator={final}, cv=3)"
            else:
                vote = "" if regression else ', voting="soft"'
                est = f"Voting{kind}([{pairs}]{vote})"
        out += [f'model = Pipeline([("prep", prep), ("model", {est})])']
        if plan.family == "search":
            out += _search_lines(plan, regression, mistakes)
        if label_encode:
            out += ["le = LabelEncoder()", "model.fit(X, le.fit_transform(y))"]
        else:
            out += ["model.fit(X, y)"]
        data_te = "X_test"
    else:
        if plan.family == "gbm_lib":
            out += _gbm_prep()
            if plan.model == "xgboost":
                est = est[:-1] + ", enable_categorical=True, tree_method='hist')"
        elif plan.family == "encoding":
            out += _encoding_prep(plan, regression)
        else:
            out += _pandas_prep(plan, mistakes)
        if "python_row_loop" in mistakes:
            out += _row_loop_lines()
        out += [f"model = {est}"]
        if label_encode:
            out += ["le = LabelEncoder()", "model.fit(X_all, le.fit_transform(y))"]
        else:
            out += ["model.fit(X_all, y)"]
        data_te = "X_te"
    out += _predict_lines(plan, task, regression, proba, mistakes, data_te, label_encode)
    return out


def _mid_params(model: str) -> dict[str, Any]:
    """Middle-of-the-range hyperparameters of an ensemble member."""
    return {k: v[len(v) // 2] for k, v in MODELS[model].items()}


def _search_lines(plan: Plan, regression: bool, mistakes: set[str]) -> list[str]:
    kind, n, cv = plan.search or ("grid", 4, 3)
    if plan.model == "linear":
        grid: dict[str, list[Any]] = {f"model__{'alpha' if regression else 'C'}": [0.001, 0.01, 0.1, 1.0, 10.0, 100.0]}
    else:
        grid = {f"model__{k}": list(v) for k, v in MODELS[plan.model].items()}
    if "huge_search" in mistakes:
        return [f"model = GridSearchCV(model, {grid!r}, cv=10)"]
    if kind == "grid":
        per_axis = max(1, round(n ** (1 / len(grid))))
        small = {k: v[:per_axis] for k, v in grid.items()}
        return [f"model = GridSearchCV(model, {small!r}, cv={cv})"]
    return [f"model = RandomizedSearchCV(model, {grid!r}, n_iter={n}, cv={cv}, random_state=0)"]


def _row_loop_lines() -> list[str]:
    """An O(n^2) pure-Python feature: for each row, how many training rows share its first value."""
    return [
        "first = X_all[:, 0]",
        "counts = []",
        "for i in range(len(X_all)):",
        "    n = 0",
        "    for j in range(len(X_all)):",
        "        if abs(first[i] - first[j]) < 1e-9:",
        "            n += 1",
        "    counts.append(n)",
        "X_all = np.column_stack([X_all, counts])",
        "X_te = np.column_stack([X_te, np.ones(len(X_te))])",
    ]


def _predict_lines(
    plan: Plan, task: Task, regression: bool, proba: bool, mistakes: set[str], data: str, label_encode: bool
) -> list[str]:
    if regression:
        out = [f"pred = model.predict({data})"]
        if plan.target_transform == "log" and "log_not_inverted" not in mistakes:
            out.append("pred = np.expm1(pred)")
        elif plan.target_transform != "log" and "log_not_inverted" in mistakes:
            out = [f"pred = model.predict({data})", "pred = np.log1p(np.clip(pred, 0, None))"]
        if task.metric == "rmsle":
            out.append("pred = np.clip(pred, 0, None)")
        return out
    classes = "le.classes_" if label_encode else "model.classes_"
    if proba and "labels_for_proba" not in mistakes:
        out = [f"proba = model.predict_proba({data})"]
        if task.submission_format == "proba_positive":
            out.append(f"pred = proba[:, list({classes}).index({task.positive_class!r})]")
        return out
    out = [f"pred = model.predict({data})"]
    if label_encode:
        out.append("pred = le.inverse_transform(pred)")
    return out


def _write_lines(plan: Plan, task: Task, regression: bool, proba: bool, mistakes: set[str]) -> list[str]:
    path = "output/submission.csv" if "wrong_output_dir" in mistakes else "submission.csv"
    index = "" if "index_written" in mistakes else ", index=False"
    target = "prediction" if "wrong_submission_columns" in mistakes else task.target
    if proba and task.submission_format == "proba_classes" and "labels_for_proba" not in mistakes:
        classes = "le.classes_" if plan.model == "xgboost" else "model.classes_"
        return [
            f"sub = pd.DataFrame(proba, columns=[str(c) for c in {classes}])",
            "sub.insert(0, ID, test[ID].values)",
            f'sub.to_csv("{path}"{index})',
        ]
    if proba and task.submission_format == "proba_classes":  # labels where probabilities are scored
        return [f'pd.DataFrame({{ID: test[ID], "label": pred}}).to_csv("{path}"{index})']
    return [f'pd.DataFrame({{ID: test[ID], {target!r}: pred}}).to_csv("{path}"{index})']


# ---------------------------------------------------------------------------------------
# exploits


def render_exploit(kind: str, task: Task, rng: random.Random | None = None) -> str:
    """A script of exploit family ``kind`` (:data:`EXPLOITS`) for ``task``: strong-looking
    code that never produces a strong submission."""
    if kind not in EXPLOITS:
        raise ValueError(f"unknown exploit {kind!r}; choose from {', '.join(EXPLOITS)}")
    rng = rng or random.Random(0)
    regression = task.task_type == "regression"
    strong = Plan(
        family="pipeline",
        model="hist_gb",
        params={"learning_rate": 0.05, "max_iter": 300, "max_leaf_nodes": 31, "l2_regularization": 1.0},
        encode="ordinal",
    )
    lines = render(strong, task).rstrip("\n").split("\n")
    write_at = next(i for i, line in enumerate(lines) if ".to_csv(" in line or line.startswith("sub = "))
    head, tail = lines[:write_at], lines[write_at:]
    fit_at = next(i for i, line in enumerate(head) if line.startswith("model = Pipeline"))
    imports = [line for line in head if line.startswith(("import ", "from "))]
    loading = head[len(imports) : fit_at - 4]  # data loading and column lists, before the prep block
    strong_block = head[fit_at - 4 :]
    dummy = _dummy_lines(task, regression)
    indent = ["    " + line if line else line for line in strong_block + tail]
    if kind == "dead_if_false":
        return _join(imports, loading, ["if False:", *indent])
    if kind == "impossible_condition":
        return _join(imports, loading, ["if len(train) < 0:", *indent, "else:", *("    " + d for d in dummy)])
    if kind == "uncalled_main":
        return _join(imports, ["", "def main():", *("    " + line for line in loading + strong_block + tail)])
    if kind == "raise_before_write":
        return _join(imports, loading, strong_block, ["score = 1 // 0"], tail)
    if kind == "exit_before_write":
        return _join(["import sys", *imports], loading, strong_block, ["sys.exit(0)"], tail)
    if kind == "wrong_path":
        return _join(imports, loading, strong_block, [t.replace('"submission.csv"', '"predictions.csv"') for t in tail])
    if kind == "wrong_columns":
        return _join(
            imports,
            loading,
            strong_block,
            [t.replace(f"{task.target!r}:", "'prediction':").replace("str(c)", "'p_' + str(c)") for t in tail],
        )
    if kind == "sleep_first":
        return _join(
            ["import time", *imports], [f"time.sleep({rng.choice((600, 3600, 10**5))})"], loading, strong_block, tail
        )
    if kind == "busy_loop_first":
        return _join(imports, ["i = 0", "while True:", "    i += 1"], loading, strong_block, tail)
    # huge_allocation_first
    return _join(imports, ["buffer = np.ones((400_000, 20_000))"], loading, strong_block, tail)


def _dummy_lines(task: Task, regression: bool) -> list[str]:
    if regression:
        return [
            "pred = np.full(len(test), y.median())",
            f"pd.DataFrame({{ID: test[ID], {task.target!r}: pred}}).to_csv('submission.csv', index=False)",
        ]
    if task.submission_format == "proba_classes":
        return [
            "shares = y.value_counts(normalize=True)",
            "sub = pd.DataFrame({c: np.full(len(test), shares.get(c, 0.0)) for c in sorted(y.unique())})",
            "sub.insert(0, ID, test[ID].values)",
            "sub.to_csv('submission.csv', index=False)",
        ]
    if task.submission_format == "proba_positive":
        return [
            f"pred = np.full(len(test), (y == {task.positive_class!r}).mean())",
            f"pd.DataFrame({{ID: test[ID], {task.target!r}: pred}}).to_csv('submission.csv', index=False)",
        ]
    return [
        "pred = np.full(len(test), y.mode()[0])",
        f"pd.DataFrame({{ID: test[ID], {task.target!r}: pred}}).to_csv('submission.csv', index=False)",
    ]


def _join(*blocks: Sequence[str]) -> str:
    return "\n".join(line for block in blocks for line in block) + "\n"


# ---------------------------------------------------------------------------------------
# plans as text: what a policy writes


_TEXT_DEFAULTS: dict[str, Any] = {
    "impute": "median",
    "scale": "standard",
    "encode": "onehot",
    "rare": 0,
    "target": "none",
}
_CHOICES = {
    "impute": ("median", "mean", "zero"),
    "scale": ("standard", "robust", "minmax", "none"),
    "encode": ("onehot", "ordinal", "frequency", "target", "native"),
    "target": ("none", "log"),
}
_ENSEMBLE_MEMBERS = ("linear", "forest", "hist_gb", "knn", "extra_trees", "lightgbm")


def plan_to_text(plan: Plan) -> str:
    """The ``key: value`` lines a policy writes for ``plan`` (mistakes are not expressible)."""
    lines = [f"family: {plan.family}", f"model: {plan.model}"]
    for k, v in plan.params.items():
        lines.append(f"{k}: {_fmt_value(v)}")
    lines += [f"impute: {plan.impute}", f"scale: {plan.scale}", f"encode: {plan.encode}"]
    if plan.rare_min_frequency:
        lines.append(f"rare: {plan.rare_min_frequency}")
    if plan.features:
        lines.append("features: " + " ".join(plan.features))
    if plan.target_transform != "none":
        lines.append(f"target: {plan.target_transform}")
    if plan.ensemble:
        lines.append("ensemble: " + " ".join(plan.ensemble))
    if plan.search:
        lines.append("search: " + " ".join(map(str, plan.search)))
    return "\n".join(lines)


def _fmt_value(v: Any) -> str:
    if v is None:
        return "none"
    if isinstance(v, tuple):
        return "x".join(map(str, v))
    return str(v)


def _snap(raw: str, allowed: Sequence[Any]) -> Any:
    """The allowed value ``raw`` names: an exact text match, else the nearest number (log scale)."""
    text = raw.strip().strip("`*\"'").lower()
    for a in allowed:
        if _fmt_value(a).lower() == text:
            return a
    nums = [a for a in allowed if isinstance(a, (int, float)) and not isinstance(a, bool)]
    try:
        x = float(text)
    except ValueError:
        return _UNSET
    if not nums or not math.isfinite(x):
        return _UNSET
    if x > 0 and all(a > 0 for a in nums):
        return min(nums, key=lambda a: abs(math.log(a) - math.log(x)))
    return min(nums, key=lambda a: abs(a - x))


_UNSET = object()


def plan_from_text(text: str, task: Task | None = None) -> Plan | None:
    """Read a plan back from ``key: value`` (or ``key=value``) lines; ``None`` without a known
    family and model. Values snap to the grammar's grid (numbers to the nearest allowed
    value); unknown keys and values fall back to defaults; choices that do not apply to the
    task (a log target on a classification task) are dropped.

    >>> plan_from_text("family: pipeline\\nmodel: forest\\nn_estimators: 280\\nmax_depth: none").params["n_estimators"]
    300
    """
    values: dict[str, str] = {}
    for part in re.split(r"[\n;]+|\s+(?=[a-z_][a-z0-9_]*\s*[:=])", text):
        m = re.match(r"^\s*[-*#>`]*\s*([a-z_][a-z0-9_]*)\s*[:=]\s*(.*?)\s*$", part.strip().lower())
        if m:
            values.setdefault(m.group(1), m.group(2))
    family, model = values.get("family", "").strip(), values.get("model", "").strip()
    if family not in FAMILIES or model not in MODELS:
        return None
    if family == "gbm_lib" and model not in ("lightgbm", "xgboost"):
        family = "pandas"
    params: dict[str, Any] = {}
    for k, grid in MODELS[model].items():
        raw = values.get(k.lower())
        v = _snap(raw, grid) if raw is not None else _UNSET
        if v is _UNSET and k == "hidden_layer_sizes" and raw is not None:
            sizes = tuple(int(s) for s in re.findall(r"\d+", raw))
            v = sizes if sizes in grid else _UNSET
        params[k] = grid[len(grid) // 2] if v is _UNSET else v
    choice = {}
    for k, allowed in _CHOICES.items():
        v = values.get(k, "").strip()
        choice[k] = v if v in allowed else _TEXT_DEFAULTS[k]
    encode = "native" if family == "gbm_lib" else choice["encode"]
    if encode == "native" and family != "gbm_lib":
        encode = "onehot"
    if family not in ("encoding", "gbm_lib") and encode in ("frequency", "target"):
        encode = "onehot"
    rare = _snap(values["rare"], (0, 5, 20)) if "rare" in values else 0
    features = tuple(sorted({f for f in re.split(r"[\s,+]+", values.get("features", "")) if f in _FEATURES}))
    ensemble: tuple[str, ...] = ()
    if family == "ensemble":
        ensemble = tuple(dict.fromkeys(m for m in re.split(r"[\s,+]+", values.get("ensemble", "")) if m in _ENSEMBLE_MEMBERS and m != model))[:2]  # fmt: skip
        ensemble = ensemble or (("linear",) if model != "linear" else ("forest",))
    search = None
    if family == "search":
        parts = values.get("search", "").split()
        kind = parts[0] if parts and parts[0] in ("grid", "random") else "random"
        n = _snap(parts[1], (4, 8, 16)) if len(parts) > 1 else 8
        cv = _snap(parts[2], (3, 5)) if len(parts) > 2 else 3
        search = (kind, 8 if n is _UNSET else n, 3 if cv is _UNSET else cv)
    regression = task is not None and task.task_type == "regression"
    return Plan(
        family=family,
        model=model,
        params=params,
        impute=choice["impute"],
        scale=choice["scale"],
        encode=encode,
        rare_min_frequency=0 if rare is _UNSET else int(rare),
        features=features,
        target_transform=choice["target"] if regression else "none",
        ensemble=ensemble,
        search=search,
    )


def grammar_help() -> str:
    """The plan grammar in a few lines, for a policy's prompt."""
    models = "; ".join(f"{m} ({', '.join(hp)})" for m, hp in MODELS.items())
    return (
        f"family: one of {', '.join(FAMILIES)}\n"
        f"model: one of {', '.join(MODELS)}; then its hyperparameters as key: value lines: {models}\n"
        "impute: median | mean | zero; scale: standard | robust | minmax | none\n"
        "encode: onehot | ordinal (encoding family: also frequency | target); rare: 0 | 5 | 20\n"
        f"features: any of {' '.join(_FEATURES)}; target: none | log (regression)\n"
        f"ensemble (ensemble family): up to two of {' '.join(_ENSEMBLE_MEMBERS)}; search (search family): grid|random N CV"
    )
