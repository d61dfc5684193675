"""Features of a (task, solution script) pair for learned code-outcome models.

The script is parsed with :mod:`ast` (never executed). Three kinds of features:

* **structure** — which scikit-learn estimators are constructed (by family), their
  hyperparameters (``n_estimators``, ``max_depth``, ``learning_rate``, ``C``, ...),
  preprocessing (scalers, encoders, imputers, pipelines), validation scheme
  (``cross_val_score``, ``train_test_split``, grid search), whether a submission is
  written, and signals of likely failure (imports the sandbox lacks, names used but never
  bound, CSV paths outside ``data/``, classifiers on regression tasks, ``while True``,
  ``sleep``, a written submission read back and rewritten);
* **tokens** — identifiers, attributes, keyword names and short string keyword values,
  hashed into a fixed number of columns (``FeatureHasher``), counts log-scaled;
* **task** — numeric meta-features of the context (``n_train``, ``n_cols``,
  ``missing_fraction``, ...; the key set is learned at fit time) and categorical ones
  (``task_type``, ``metric``, ...) hashed together with estimator x task-type pairs;
* **size vs limits** — what decides whether a script fits its run's memory and time
  budget on a big table: log rows, log one-hot cells (``n_train x onehot_width``), the
  share of the memory limit one dense float64 copy of the one-hot-encoded training matrix
  takes, whether a script that builds dense one-hot matrices
  (``OneHotEncoder(sparse_output=False)`` / ``sparse=False``, ``pd.get_dummies``) is
  expected to exceed the limit, training rows per second of the time limit; plus hashed
  estimator-family x row-decade tokens. NaN where the context lacks the numbers.

  The over-limit indicator is a prior from how the code allocates, not a fitted threshold:
  a ``ColumnTransformer`` holds the encoder's dense block while ``np.hstack`` copies it into
  its output, so fitting needs at least **two** dense float64 copies of the one-hot training
  matrix (:data:`DENSE_ONEHOT_COPIES`); the indicator is 1 when those exceed the memory
  limit. A tree cannot place a threshold between two training tables it has seen (one that
  fits, one that dies) where a third, unseen size would need it; the indicator can.

Classes: :class:`ScriptFeaturizer`, :class:`ScriptSummary`. Functions: :func:`summarize_script`, :func:`flat_context`,
:func:`size_features`.
"""

from __future__ import annotations

import ast
import builtins
import math
import posixpath
import sys
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from sklearn.feature_extraction import FeatureHasher

from wmrl_envs.world_models.code_reader import READING_FEATURES, read_script
from wmrl_envs.world_models.estimators import ESTIMATOR_FAMILIES

#: how many of :data:`READING_FEATURES` existed before featurizers saved their names (those
#: are the columns of a model saved without ``reading_features``)
_READING_FEATURES_FIRST_RELEASE = 22

__all__ = [
    "ScriptFeaturizer",
    "ScriptSummary",
    "summarize_script",
    "flat_context",
    "size_features",
    "ESTIMATOR_FAMILIES",
    "HYPERPARAMETERS",
    "SIZE_FEATURES",
    "DENSE_ONEHOT_COPIES",
    "TRANSFER_FEATURES",
    "transfer_features",
    "LANDMARK_FEATURES",
    "landmark_features",
]

_PREPROCESSING: Mapping[str, frozenset[str]] = {
    "scaler": frozenset(
        "StandardScaler MinMaxScaler RobustScaler MaxAbsScaler Normalizer QuantileTransformer PowerTransformer".split()
    ),
    "encoder": frozenset("OneHotEncoder OrdinalEncoder LabelEncoder TargetEncoder get_dummies factorize".split()),
    "imputer": frozenset("SimpleImputer KNNImputer IterativeImputer fillna".split()),
    "decomposition": frozenset("PCA TruncatedSVD".split()),
    "selection": frozenset("SelectKBest VarianceThreshold RFE RFECV SelectFromModel".split()),
    "expansion": frozenset("PolynomialFeatures SplineTransformer KBinsDiscretizer".split()),
    "pipeline": frozenset("Pipeline make_pipeline ColumnTransformer make_column_transformer".split()),
    "target_transform": frozenset("TransformedTargetRegressor log1p expm1".split()),
}
_VALIDATION: Mapping[str, frozenset[str]] = {
    "cv_score": frozenset("cross_val_score cross_validate cross_val_predict".split()),
    "holdout": frozenset(["train_test_split"]),
    "kfold": frozenset("KFold StratifiedKFold GroupKFold RepeatedKFold RepeatedStratifiedKFold ShuffleSplit".split()),
    "search": frozenset("GridSearchCV RandomizedSearchCV HalvingGridSearchCV HalvingRandomSearchCV".split()),
}
#: Hyperparameters read from keyword arguments (max over all calls; NaN when never set).
HYPERPARAMETERS = (
    "n_estimators", "max_depth", "learning_rate", "C", "n_neighbors", "alpha", "max_iter",
    "min_samples_leaf", "min_samples_split", "max_features", "max_leaf_nodes", "subsample",
    "l2_regularization", "hidden_layer_sizes", "gamma", "num_leaves", "cv", "n_splits",
    "n_components", "k", "degree", "test_size", "n_iter", "l1_ratio", "frac", "n_jobs",
)  # fmt: skip
_COUNT_LIKE = {"n_estimators", "max_iter", "n_neighbors", "max_leaf_nodes", "min_samples_leaf", "min_samples_split",
               "num_leaves", "hidden_layer_sizes", "n_components", "k", "n_iter", "max_depth", "cv", "n_splits", "C", "alpha", "gamma"}  # fmt: skip
# What the solutions' runtime can import besides the standard library (docs/contracts.md); the
# code reader checks imports against the runtime's full inventory.
_SANDBOX_PACKAGES = frozenset(
    {"numpy", "pandas", "sklearn", "scipy", "joblib", "threadpoolctl", "dateutil", "pytz", "lightgbm", "xgboost"}
)
_CLASSIFIER_NAMES = frozenset(n for fam in ESTIMATOR_FAMILIES.values() for n in fam if n.endswith("Classifier") or n.endswith("NB")) | {
    "LogisticRegression", "LogisticRegressionCV", "SVC", "NuSVC", "LinearSVC", "Perceptron",
    "LinearDiscriminantAnalysis", "QuadraticDiscriminantAnalysis", "NearestCentroid",
}  # fmt: skip
_REGRESSOR_NAMES = frozenset(n for fam in ESTIMATOR_FAMILIES.values() for n in fam if n.endswith("Regressor")) | {
    "LinearRegression", "Ridge", "RidgeCV", "Lasso", "LassoCV", "ElasticNet", "ElasticNetCV", "SVR", "NuSVR",
    "LinearSVR", "BayesianRidge", "HuberRegressor", "PoissonRegressor", "TweedieRegressor", "QuantileRegressor",
}  # fmt: skip
_STRING_CONTEXT_KEYS = ("task_type", "metric", "submission_format", "origin")
_BUILTINS = frozenset(dir(builtins)) | {"__name__", "__file__", "__doc__"}
_COUNT_NAMES = (
    "n_lines", "n_calls", "n_functions", "n_classes_defined", "n_loops", "n_while_true", "n_try", "n_raise",
    "n_imports", "n_bad_imports", "n_undefined_names", "n_csv_outside_data", "n_sleep", "n_exit",
    "writes_submission", "reads_train", "reads_test", "reads_sample_submission", "calls_to_csv",
    "n_fit", "n_predict", "n_predict_proba", "n_estimators_constructed", "n_classifier_on_regression",
    "n_regressor_on_classification", "n_string_columns_indexed", "rereads_submission", "max_sleep_seconds",
)  # fmt: skip
#: Size-vs-limit features (see the module docstring), computed from the context and the script.
#: Featurizers saved before they existed (``size_features=False``) leave them out.
SIZE_FEATURES = (
    "n_dense_onehot", "size:log10_train_rows", "size:log10_onehot_cells", "size:dense_onehot_memory_share",
    "size:dense_onehot_over_limit", "size:train_rows_per_wall_second",
)  # fmt: skip
#: Dense float64 copies of the one-hot training matrix alive at once while a
#: ``ColumnTransformer`` fits (the encoder's output and ``np.hstack``'s copy of it).
DENSE_ONEHOT_COPIES = 2
#: Task meta-features that matter for ranking, normalised so they transfer across tables,
#: and solution features relative to the data (see :func:`transfer_features`).
TRANSFER_FEATURES = (
    "task:log10_rows", "task:log10_cols", "task:categorical_share", "task:log10_max_cardinality",
    "task:max_cardinality_per_row", "task:onehot_width_per_row", "task:missing_fraction", "task:n_classes",
    "task:minority_fraction", "task:is_binary", "task:is_multiclass", "task:is_regression",
    "task:metric_proba", "task:metric_label", "task:metric_log", "task:metric_r2",
    "fit:log10_rows_x_width", "fit:width_per_row", "fit:knn_k_per_row", "fit:log10_min_leaf_per_row",
    "fit:subsample", "fit:uses_proba", "fit:proba_metric_without_proba", "fit:log10_ensemble_work",
    "fit:log10_work_per_wall_second",
)  # fmt: skip
#: Where a script's own estimators land among the task's metric landmarks
#: (:func:`landmark_features`): the best and the worst of them.
LANDMARK_FEATURES = ("landmark:own_max", "landmark:own_min")
_PROBA_METRICS = frozenset({"roc_auc", "log_loss"})
_LABEL_METRICS = frozenset({"accuracy", "macro_f1"})


@dataclass
class ScriptSummary:
    """What :func:`summarize_script` found in one script."""

    compiles: bool
    counts: dict[str, float] = field(default_factory=dict)
    families: Counter = field(default_factory=Counter)
    groups: Counter = field(default_factory=Counter)
    hyperparameters: dict[str, float] = field(default_factory=dict)
    estimators: list[str] = field(default_factory=list)
    tokens: list[str] = field(default_factory=list)
    bad_imports: list[str] = field(default_factory=list)
    undefined_names: list[str] = field(default_factory=list)
    #: the :class:`~wmrl_envs.world_models.code_reader.CodeReading` the summary was made from
    #: (``None`` for featurizers without ``read_code``)
    reading: Any = None


def _call_name(node: ast.Call) -> str | None:
    f = node.func
    if isinstance(f, ast.Name):
        return f.id
    if isinstance(f, ast.Attribute):
        return f.attr
    return None


def _number(node: ast.AST) -> float | None:
    """The numeric value of a literal (tuples/lists of numbers: their sum), else None."""
    try:
        v = ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None
    if isinstance(v, bool):
        return float(v)
    if isinstance(v, (int, float)):
        return float(v) if math.isfinite(v) else None
    if isinstance(v, (tuple, list)) and v and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v):
        return float(sum(v))
    return None


def _bound_names(tree: ast.AST) -> set[str]:
    bound: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            bound.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for a in node.names:
                bound.add((a.asname or a.name).split(".")[0])
        elif isinstance(node, ast.ExceptHandler) and node.name:
            bound.add(node.name)
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            bound.update(node.names)
    for node in ast.walk(tree):  # match statements and walrus targets are Name(Store) already
        if isinstance(node, ast.MatchAs) and node.name:
            bound.add(node.name)
    return bound


def summarize_script(code: str, task_type: str | None = None) -> ScriptSummary:  # noqa: C901 -- complexity over 15 before the limit (issue 26)
    """Parse ``code`` and summarise it (see the module docstring). Never executes it."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return ScriptSummary(compiles=False, counts={"n_lines": float(code.count("\n") + 1)})
    s = ScriptSummary(compiles=True)
    c: dict[str, Any] = Counter()  # counts, flags and maxima (int or float); Counter for the 0 default
    c["n_lines"] = code.count("\n") + 1
    tokens: list[str] = []
    hp: dict[str, float] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            c["n_calls"] += 1
            name = _call_name(node)
            if name is None:
                continue
            tokens.append(f"call:{name}")
            for fam, names in ESTIMATOR_FAMILIES.items():
                if name in names:
                    s.families[fam] += 1
                    s.estimators.append(name)
                    c["n_estimators_constructed"] += 1
            for grp, names in {**_PREPROCESSING, **_VALIDATION}.items():
                if name in names:
                    s.groups[grp] += 1
            c["n_fit"] += name in ("fit", "fit_transform", "fit_predict")
            c["n_predict"] += name == "predict"
            c["n_predict_proba"] += name in ("predict_proba", "decision_function")
            c["calls_to_csv"] += name == "to_csv"
            c["n_sleep"] += name == "sleep"
            if name == "sleep" and node.args and (v := _number(node.args[0])) is not None:
                c["max_sleep_seconds"] = max(c["max_sleep_seconds"], v)
            if (
                name == "read_csv"
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str)
            ):
                path = node.args[0].value
                c["rereads_submission"] += "submission" in path and "sample" not in path
                # The sandbox mounts inputs at data/ only (the written submission aside).
                c["n_csv_outside_data"] += "submission" not in path and not posixpath.normpath(path).startswith("data/")
            c["n_exit"] += name in ("exit", "quit", "_exit")
            if name == "get_dummies" or (
                name == "OneHotEncoder"
                and any(
                    kw.arg in ("sparse_output", "sparse")
                    and isinstance(kw.value, ast.Constant)
                    and kw.value.value is False
                    for kw in node.keywords
                )
            ):
                c["n_dense_onehot"] += 1
            for kw in node.keywords:
                if kw.arg is None:
                    continue
                tokens.append(f"kw:{kw.arg}")
                v = _number(kw.value)
                if kw.arg in HYPERPARAMETERS and v is not None:
                    hp[kw.arg] = max(hp.get(kw.arg, -math.inf), v)
                if isinstance(kw.value, ast.Constant) and isinstance(kw.value.value, str) and len(kw.value.value) <= 30:
                    tokens.append(f"kwv:{kw.arg}={kw.value.value}")
        elif isinstance(node, ast.Name):
            tokens.append(f"id:{node.id}")
        elif isinstance(node, ast.Attribute):
            tokens.append(f"attr:{node.attr}")
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            c["n_functions"] += 1
        elif isinstance(node, ast.ClassDef):
            c["n_classes_defined"] += 1
        elif isinstance(node, (ast.For, ast.AsyncFor, ast.comprehension)):
            c["n_loops"] += 1
        elif isinstance(node, ast.While):
            c["n_loops"] += 1
            if isinstance(node.test, ast.Constant) and node.test.value:
                c["n_while_true"] += 1
        elif isinstance(node, (ast.Try, getattr(ast, "TryStar", ast.Try))):
            c["n_try"] += 1
        elif isinstance(node, ast.Raise):
            c["n_raise"] += 1
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            c["n_imports"] += 1
            modules = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            if isinstance(node, ast.ImportFrom) and node.level:
                modules = []  # relative import: no package to run it from in the sandbox
                s.bad_imports.append("." * node.level + (node.module or ""))
            for m in modules:
                top = m.split(".")[0]
                tokens.append(f"import:{m}")
                if top not in sys.stdlib_module_names and top not in _SANDBOX_PACKAGES:
                    s.bad_imports.append(top)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            text = node.value
            if "submission" in text and text.endswith(".csv") and "sample" not in text:
                c["writes_submission"] = 1
            c["reads_train"] |= text.endswith("train.csv")
            c["reads_test"] |= text.endswith("test.csv")
            c["reads_sample_submission"] |= text.endswith("sample_submission.csv")
        elif (
            isinstance(node, ast.Subscript)
            and isinstance(node.slice, ast.Constant)
            and isinstance(node.slice.value, str)
        ):
            c["n_string_columns_indexed"] += 1
    c["writes_submission"] = float(c["writes_submission"] and c["calls_to_csv"] > 0)
    c["n_bad_imports"] = len(s.bad_imports)
    bound = _bound_names(tree)
    if "*" not in bound:
        s.undefined_names = sorted(
            {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
            - bound
            - _BUILTINS
        )
    c["n_undefined_names"] = len(s.undefined_names)
    if task_type == "regression":
        c["n_classifier_on_regression"] = sum(e in _CLASSIFIER_NAMES for e in s.estimators)
    elif task_type in ("binary", "multiclass"):
        c["n_regressor_on_classification"] = sum(e in _REGRESSOR_NAMES for e in s.estimators)
    s.counts = {k: float(c[k]) for k in (*_COUNT_NAMES, "n_dense_onehot")}
    s.hyperparameters = hp
    tokens += [f"family:{f}" for f in s.families] + [f"group:{g}" for g in s.groups]
    tokens += [f"est:{e}|{task_type}" for e in s.estimators]
    s.tokens = tokens
    return s


def flat_context(context: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Scalars of ``context`` and of its nested mappings (one level), keyed ``a.b``."""
    out: dict[str, Any] = {}
    for k, v in context.items():
        if isinstance(v, Mapping) and not prefix:
            out.update(flat_context(v, prefix=f"{k}."))
        elif isinstance(v, (bool, int, float, str)) or v is None:
            out[f"{prefix}{k}"] = v
    return out


def _leaf(key: str) -> str:
    return key.rsplit(".", 1)[-1]


def _ctx_number(flat: Mapping[str, Any], leaf: str) -> float:
    """A positive finite number stored under key ``leaf`` (at any nesting level), else NaN."""
    for k, v in flat.items():
        if _leaf(k) == leaf and isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0:
            return float(v)
    return math.nan


def size_features(flat: Mapping[str, Any], summary: ScriptSummary) -> tuple[list[float], list[str]]:
    """(:data:`SIZE_FEATURES` values, size tokens) of a flattened context and a script summary."""
    rows, width = _ctx_number(flat, "n_train"), _ctx_number(flat, "onehot_width")
    memory, wall = _ctx_number(flat, "memory_bytes"), _ctx_number(flat, "wall_seconds")
    dense = summary.counts.get("n_dense_onehot", 0.0) > 0
    share = 8.0 * rows * width / memory  # one dense float64 copy; NaN when any is unknown
    over = math.nan if math.isnan(share) else float(dense and DENSE_ONEHOT_COPIES * share >= 1.0)
    values = [
        summary.counts.get("n_dense_onehot", math.nan),
        math.log10(rows),
        math.log10(rows * width),
        share,
        over,
        rows / wall,
    ]
    tokens = []
    if not math.isnan(rows):
        decade = int(math.log10(rows))
        tokens += [f"size:{fam}|rows=1e{decade}" for fam in summary.families]
        if dense and not math.isnan(width):
            tokens.append(f"size:dense_onehot|cells=1e{int(math.log10(rows * width))}")
    return values, tokens


def _meta(flat: Mapping[str, Any], leaf: str) -> float:
    """A finite number (>= 0) or boolean stored under ``leaf``, else NaN."""
    for k, v in flat.items():
        if _leaf(k) == leaf and isinstance(v, (int, float)) and math.isfinite(v) and v >= 0:
            return float(v)
    return math.nan


def transfer_features(flat: Mapping[str, Any], summary: ScriptSummary) -> list[float]:
    """:data:`TRANSFER_FEATURES` of a flattened context and a script summary (NaN = unknown).

    Task side: sizes on log scales and as ratios (a 40k-row table and a 600-row one differ
    in scale, not in kind), categorical share and cardinality per row, missingness, class
    count and imbalance, task type, and which kind of prediction the metric scores
    (probabilities, labels, log-scale values, R^2). Solution side, relative to the data:
    the cells the model fits (one-hot width when the script one-hot encodes, else the raw
    column count), ``n_neighbors`` and ``min_samples_leaf`` per training row, a training
    subsample share, whether probabilities are written where the metric needs them, and the
    work of a tree ensemble (trees x rows), and the fit's work (cells x trees) per second
    of the run's time limit.

    >>> s = summarize_script("from sklearn.neighbors import KNeighborsClassifier\\nKNeighborsClassifier(n_neighbors=5)")
    >>> f = dict(zip(TRANSFER_FEATURES, transfer_features({"meta.n_train": 500, "meta.metric": "roc_auc"}, s)))
    >>> f["fit:knn_k_per_row"], f["task:metric_proba"], f["fit:proba_metric_without_proba"]
    (0.01, 1.0, 1.0)
    """
    rows, cols = _meta(flat, "n_train"), _meta(flat, "n_cols")
    n_cat, width = _meta(flat, "n_categorical"), _meta(flat, "onehot_width")
    card = _meta(flat, "max_cardinality")
    wall = _meta(flat, "wall_seconds")
    metric = next((v for k, v in flat.items() if _leaf(k) == "metric" and isinstance(v, str)), None)
    task_type = next((v for k, v in flat.items() if _leaf(k) == "task_type" and isinstance(v, str)), None)
    hp = summary.hyperparameters
    onehot = summary.groups.get("encoder", 0) > 0 and any(
        t in ("call:OneHotEncoder", "call:get_dummies") for t in summary.tokens
    )
    used = width if onehot else cols
    proba = summary.counts.get("n_predict_proba", 0.0) > 0
    trees = (
        hp.get("n_estimators", math.nan)
        if summary.families.get("forest") or summary.families.get("boosting")
        else math.nan
    )
    if summary.families.get("boosting") and math.isnan(trees):
        trees = hp.get("max_iter", 100.0)
    subsample = next(
        (v for k, v in (("test_size", hp.get("test_size")), ("subsample", hp.get("subsample"))) if v is not None),
        math.nan,
    )
    train_size = next((t for t in summary.tokens if t == "kw:train_size"), None)

    def log10(x: float) -> float:
        return math.log10(x) if x > 0 else math.nan

    return [
        log10(rows), log10(cols), n_cat / cols if cols > 0 else math.nan, log10(card),
        card / rows if rows > 0 else math.nan, width / rows if rows > 0 else math.nan,
        _meta(flat, "missing_fraction"), _meta(flat, "n_classes"), _meta(flat, "minority_fraction"),
        float(task_type == "binary"), float(task_type == "multiclass"), float(task_type == "regression"),
        float(metric in _PROBA_METRICS), float(metric in _LABEL_METRICS), float(metric == "rmsle"), float(metric == "r2"),
        log10(rows * used), used / rows if rows > 0 else math.nan,
        hp.get("n_neighbors", math.nan) / rows if rows > 0 else math.nan,
        log10(hp.get("min_samples_leaf", math.nan) / rows) if rows > 0 and "min_samples_leaf" in hp else math.nan,
        subsample if train_size is None else 1.0, float(proba), float(metric in _PROBA_METRICS and not proba),
        log10(trees * rows) if not math.isnan(trees) else math.nan,
        log10(rows * used * (1.0 if math.isnan(trees) else trees) / wall) if wall > 0 else math.nan,
    ]  # fmt: skip


def _own_learner(family: str, hp: Mapping[str, float]) -> str | None:
    """The landmark learner (:data:`~wmrl_envs.world_models.landmarks.METRIC_LEARNERS`)
    that stands for an estimator family, by the hyperparameter that changes its kind."""
    if family == "tree":  # sklearn's default depth is unlimited
        return "tree4" if hp.get("max_depth", math.inf) <= 6 else "deeptree"
    if family == "knn":  # sklearn's default is 5 neighbours
        return "knn3" if hp.get("n_neighbors", 5) < 8 else "knn15"
    return {
        "linear": "linear", "discriminant": "linear", "forest": "forest", "meta": "forest",
        "boosting": "boosting", "neural": "mlp", "naive_bayes": "naive_bayes",
    }.get(family)  # fmt: skip


def landmark_features(flat: Mapping[str, Any], summary: ScriptSummary) -> list[float]:
    """:data:`LANDMARK_FEATURES`: the metric landmarks (``landmark_metric_<learner>`` in the
    context, 0 = a constant predictor, 1 = the best learner) of the learners that stand for
    the script's estimators -- a depth-4 or an unlimited tree, 3 or 15 neighbours by the
    script's own hyperparameters; a dummy estimator is the constant, 0. NaN where the script
    builds none of them or the context has no landmarks: this is how the table tells the
    model which *kind* of solution it rewards.

    >>> s = summarize_script("from sklearn.tree import DecisionTreeRegressor\\nDecisionTreeRegressor(max_depth=3)")
    >>> ctx = {"meta.landmark_metric_tree4": 0.4, "meta.landmark_metric_deeptree": -0.2, "meta.landmark_metric_skill": 0.3}
    >>> landmark_features(ctx, s)
    [0.4, 0.4]
    """
    if not any(_leaf(k) == "landmark_metric_skill" for k in flat):
        return [math.nan, math.nan]  # no metric landmarks: even a dummy's place is unknown
    values = []
    for family in summary.families:
        if family == "dummy":
            values.append(0.0)
        elif (learner := _own_learner(family, summary.hyperparameters)) is not None:
            v = next((x for k, x in flat.items() if _leaf(k) == f"landmark_metric_{learner}"), None)
            if isinstance(v, (int, float)) and math.isfinite(v):
                values.append(float(v))
    return [max(values), min(values)] if values else [math.nan, math.nan]


class ScriptFeaturizer:
    """Turns (context, script) pairs into a dense float matrix; NaN marks "not present".

    Args:
        n_hash: columns for hashed tokens.
        max_meta_keys: cap on numeric context keys learned by :meth:`fit`.
        size_features: add the size-vs-limit block (:data:`SIZE_FEATURES` and size tokens;
            default True). Featurizers saved before the block existed load with False, so
            their models keep working unchanged.
        transfer_features: add :data:`TRANSFER_FEATURES` and leave out the ``origin``
            token (default False; featurizers saved before it existed load with False).
        landmark_features: add :data:`LANDMARK_FEATURES` (default True; featurizers saved
            before they existed load with False).
        read_code: read the script first (:func:`~wmrl_envs.world_models.code_reader.read_script`):
            summarise only the code that runs, with the script's own names made positional
            (so dead code, formatting and naming do not move a prediction), and add
            :data:`~wmrl_envs.world_models.code_reader.READING_FEATURES` (default False, what
            featurizers saved before it existed load with; :class:`CodeOutcomeConfig` turns it on).

    >>> f = ScriptFeaturizer(n_hash=32).fit([{"n_train": 100}], ["print(1)"])
    >>> f.transform([{"n_train": 50}], ["import pandas as pd"]).shape == (1, f.n_features)
    True
    """

    def __init__(
        self,
        n_hash: int = 256,
        max_meta_keys: int = 64,
        size_features: bool = True,
        transfer_features: bool = False,
        landmark_features: bool = True,
        read_code: bool = False,
    ) -> None:
        if n_hash < 1:
            raise ValueError(f"n_hash must be >= 1, got {n_hash}")
        self.n_hash = n_hash
        self.max_meta_keys = max_meta_keys
        self.size_features = bool(size_features)
        self.transfer_features = bool(transfer_features)
        self.landmark_features = bool(landmark_features)
        self.read_code = bool(read_code)
        # the reading features this featurizer emits, by name: a model saved before a reading
        # feature was added keeps the columns it was fitted on
        self.reading_features: tuple[str, ...] = READING_FEATURES
        self.meta_keys: list[str] = []

    def fit(self, contexts: Sequence[Mapping[str, Any]], codes: Sequence[str]) -> ScriptFeaturizer:
        """Learn which numeric (or boolean) context keys exist (those in at least 5% of contexts)."""
        counts: Counter = Counter()
        for ctx in contexts:
            for k, v in flat_context(ctx).items():
                if isinstance(v, (int, float)):  # bools count as 0/1
                    counts[k] += 1
        need = max(1, int(0.05 * len(contexts)))
        self.meta_keys = sorted(k for k, n in counts.most_common(self.max_meta_keys) if n >= need)
        return self

    @property
    def n_features(self) -> int:
        return (
            len(_COUNT_NAMES)
            + len(ESTIMATOR_FAMILIES)
            + len(_PREPROCESSING)
            + len(_VALIDATION)
            + len(HYPERPARAMETERS)
            + len(SIZE_FEATURES) * self.size_features
            + len(TRANSFER_FEATURES) * self.transfer_features
            + len(LANDMARK_FEATURES) * self.landmark_features
            + len(self.reading_features) * self.read_code
            + len(self.meta_keys)
            + self.n_hash
        )

    def feature_names(self) -> list[str]:
        return (
            list(_COUNT_NAMES)
            + [f"family:{f}" for f in ESTIMATOR_FAMILIES]
            + [f"group:{g}" for g in {**_PREPROCESSING, **_VALIDATION}]
            + [f"hp:{h}" for h in HYPERPARAMETERS]
            + (list(SIZE_FEATURES) if self.size_features else [])
            + (list(TRANSFER_FEATURES) if self.transfer_features else [])
            + (list(LANDMARK_FEATURES) if self.landmark_features else [])
            + (list(self.reading_features) if self.read_code else [])
            + [f"ctx:{k}" for k in self.meta_keys]
            + [f"hash:{i}" for i in range(self.n_hash)]
        )

    def summaries(self, contexts: Sequence[Mapping[str, Any]], codes: Sequence[str]) -> list[ScriptSummary]:
        if not self.read_code:
            return [summarize_script(code, _task_type(ctx)) for ctx, code in zip(contexts, codes)]
        out = []
        for ctx, code in zip(contexts, codes):
            reading = read_script(code, ctx)
            s = summarize_script(reading.live_code if reading.compiles else code, _task_type(ctx))
            s.reading = reading
            out.append(s)
        return out

    def transform(
        self,
        contexts: Sequence[Mapping[str, Any]],
        codes: Sequence[str],
        summaries: Sequence[ScriptSummary] | None = None,
    ) -> np.ndarray:
        if len(contexts) != len(codes):
            raise ValueError(f"got {len(contexts)} contexts but {len(codes)} codes")
        summaries = summaries if summaries is not None else self.summaries(contexts, codes)
        groups = list({**_PREPROCESSING, **_VALIDATION})
        rows, token_lists = [], []
        for ctx, s in zip(contexts, summaries):
            flat = flat_context(ctx)
            row = [s.counts.get(k, math.nan) for k in _COUNT_NAMES]
            row += [float(s.families.get(f, 0)) for f in ESTIMATOR_FAMILIES]
            row += [float(s.groups.get(g, 0)) for g in groups]
            for h in HYPERPARAMETERS:
                v = s.hyperparameters.get(h, math.nan)
                row.append(math.copysign(math.log1p(abs(v)), v) if h in _COUNT_LIKE and not math.isnan(v) else v)
            size, size_tokens = size_features(flat, s) if self.size_features else ([], [])
            row += size
            if self.transfer_features:
                row += transfer_features(flat, s)
            if self.landmark_features:
                row += landmark_features(flat, s)
            if self.read_code:
                row += (s.reading or read_script("", ctx)).feature_vector(self.reading_features)
            for k in self.meta_keys:
                meta = flat.get(k)
                row.append(float(meta) if isinstance(meta, (int, float)) else math.nan)
            rows.append(row)
            ctx_tokens = [
                f"ctx:{_leaf(k)}={v}"
                for k, v in flat.items()
                if _leaf(k) in _STRING_CONTEXT_KEYS
                and isinstance(v, str)
                and not (self.transfer_features and _leaf(k) == "origin")  # how a task was made never transfers
            ]
            token_lists.append(s.tokens + ctx_tokens + size_tokens)
        dense = np.asarray(rows, dtype=np.float64).reshape(len(rows), -1)
        hashed = FeatureHasher(n_features=self.n_hash, input_type="string", alternate_sign=False).transform(token_lists)
        hashed = np.log1p(hashed.toarray())
        return np.hstack([dense, hashed]).astype(np.float32)

    def state_dict(self) -> dict[str, Any]:
        return {
            "n_hash": self.n_hash,
            "max_meta_keys": self.max_meta_keys,
            "meta_keys": list(self.meta_keys),
            "size_features": self.size_features,
            "transfer_features": self.transfer_features,
            "landmark_features": self.landmark_features,
            "read_code": self.read_code,
            "reading_features": list(self.reading_features),
        }

    @classmethod
    def from_state_dict(cls, d: Mapping[str, Any]) -> ScriptFeaturizer:
        f = cls(
            n_hash=int(d["n_hash"]),
            max_meta_keys=int(d["max_meta_keys"]),
            size_features=bool(d.get("size_features", False)),
            transfer_features=bool(d.get("transfer_features", False)),
            landmark_features=bool(d.get("landmark_features", False)),
            read_code=bool(d.get("read_code", False)),
        )
        f.meta_keys = list(d["meta_keys"])
        f.reading_features = tuple(d.get("reading_features", READING_FEATURES[:_READING_FEATURES_FIRST_RELEASE]))
        return f


def _task_type(context: Mapping[str, Any]) -> str | None:
    for k, v in flat_context(context).items():
        if _leaf(k) == "task_type" and isinstance(v, str):
            return v
    return None
