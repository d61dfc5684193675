"""Read what a solution script does: the code that runs, and the failures it has coming.

A world model that scores a script by the estimator names in it is easy to game (strong code
under ``if False:``) and blind to the failures agents' code runs into (an import the runtime
lacks, a one-hot of every column on a big table). :func:`read_script` parses the script
(never executes it) against its task's public context and returns a :class:`CodeReading`:

* ``live_code`` — the code that actually runs, re-printed from the syntax tree: dead
  branches (constant or impossible conditions such as ``if False:``, ``if len(df) < 0:``,
  ``if __name__ != "__main__":``), functions and classes nothing calls, and statements after
  an unconditional ``raise`` / ``sys.exit`` / ``return`` are removed; comments, blank lines
  and formatting are gone and the script's own variable names are replaced by positional
  ones, so a prediction made from it is invariant to formatting and naming;
* ``foreseen`` — ``(status, reason)`` when a failure is certain from the code alone:
  a module or name the pinned runtime (:mod:`wmrl_envs.sandbox.runtime`) does not have, a
  keyword its scikit-learn removed, a dropped column the table does not have, an
  unconditional exception or exit before the submission is written, no write of
  ``./submission.csv`` at all (or a write into a directory that does not exist), submission
  columns that cannot be right, labels where the submission must hold probabilities, an
  endless loop or a ``sleep`` longer than the time limit, an allocation larger than the
  memory limit;
* ``features`` — :data:`READING_FEATURES`, numbers for a learned model: the dense width and
  memory share of one-hot / polynomial expansions from the table's column cardinalities,
  the number of model fits of a search and their estimated CPU-seconds against the time
  limit (work units per estimator family over that family's measured speed),
  pure-Python loop iterations over the rows, whether predictions are probabilities, labels
  or left on a log scale, and the counts behind the foreseen failures.

Everything is best effort and conservative: an expression the reader cannot resolve never
produces a foreseen failure. :func:`read_script` never raises.

>>> ctx = {"meta": {"task_type": "regression", "submission_format": "value", "n_train": 100, "n_test": 50},
...        "limits": {"wall_seconds": 60, "memory_bytes": 2**31}}
>>> r = read_script("import pandas as pd\\nif False:\\n    pd.DataFrame().to_csv('submission.csv')\\n", ctx)
>>> r.foreseen
('no_submission', 'no reachable write of ./submission.csv')
>>> read_script("import catboost\\n", ctx).foreseen[0]
'runtime_error'

Classes: :class:`CodeReading`. Functions: :func:`read_script`, :func:`live_source`,
:func:`table_columns`. Constants: :data:`READING_FEATURES`.
"""

from __future__ import annotations

import ast
import math
import posixpath
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from wmrl_envs.world_models.estimators import ESTIMATOR_FAMILIES

__all__ = ["CodeReading", "read_script", "live_source", "table_columns", "READING_FEATURES"]

#: The numeric features of a reading (NaN where the context lacks what they need).
READING_FEATURES = (
    "read:dead_statements", "read:writes_submission", "read:foreseen_failure", "read:missing_imports",
    "read:removed_keywords", "read:unknown_columns", "read:labels_for_proba", "read:proba_for_labels",
    "read:log_target_not_inverted", "read:log10_dense_width", "read:dense_memory_share", "read:dense_over_memory",
    "read:log10_search_fits", "read:log10_estimated_seconds", "read:log10_time_share", "read:log10_loop_iterations",
    "read:loop_seconds_share", "read:sleep_share", "read:alloc_memory_share", "read:index_written",
    "read:n_models", "read:uses_lib_boosting", "read:svm_unscaled_kernel",
)  # fmt: skip

_EXIT_CALLS = frozenset({"exit", "quit", "_exit"})
_WRITE_METHODS = frozenset({"to_csv", "savetxt", "to_parquet", "write_csv"})
_ALLOC_CALLS = frozenset({"ones", "zeros", "empty", "full", "rand", "randn", "random", "normal", "uniform"})
_SCALERS = frozenset(
    {"StandardScaler", "MinMaxScaler", "RobustScaler", "MaxAbsScaler", "Normalizer", "QuantileTransformer",
     "PowerTransformer", "scale", "minmax_scale", "robust_scale", "maxabs_scale", "normalize"}
)  # fmt: skip
_PROBA_CALLS = frozenset({"predict_proba", "decision_function", "predict_log_proba"})
_DENSE_COPIES = 2.0  # a ColumnTransformer holds the encoder's block while np.hstack copies it
_PY_LOOP_RATE = 5e6  # simple pure-Python inner-loop iterations per CPU-second (order of magnitude)
# The estimated fit time is a feature, never a gate: a threshold that no finished run had
# crossed (10^11.5 work units per second of limit, 25x above the largest then logged) was
# crossed by a valid stacking run that used 29.7 of its 30 CPU-seconds -- the estimate is too rough.

# log10 work units (:meth:`_Reader._model_work`) per CPU-second, per estimator: the medians of
# log10(work / (CPU-seconds - startup)) over the 113 valid single-model runs of >= 3 CPU-s in
# the train-split logs (catalog templates + agent corpus, 2026-12-05): k-NN 10.1 over 14 runs
# (range 9.8-10.2, once its per-pair neighbour selection is counted), forests 7.6-7.9 over 44.
# Without them a work unit of a k-NN's BLAS distances counted like one of a tree's split
# search, and a k-NN that used 68% of its time limit read as 10^2.4 times too slow.
# SVMs: one valid run (9.9) and timeouts that bound the rate below ~8.5 -> 8.5.
_LOG10_UNITS_PER_SECOND: tuple[tuple[str, float], ...] = (
    ("KNeighbors", 10.1), ("MLPClassifier", 10.2), ("MLPRegressor", 9.1), ("SVC", 8.5), ("SVR", 8.5),
    ("HistGradientBoosting", 7.2), ("LGBM", 7.3), ("XGB", 8.3), ("GradientBoosting", 7.8),
    ("ExtraTrees", 7.9), ("RandomForest", 7.7), ("LogisticRegression", 7.9), ("Ridge", 8.5),
    ("GaussianNB", 8.0),
)  # fmt: skip
_LOG10_UNITS_PER_SECOND_DEFAULT = 8.0  # the median over all 113 runs
# CPU-seconds every script spends outside its fits (interpreter, pandas / scikit-learn imports,
# reading the tables): the cheapest logged valid runs take 1-2 s.
_STARTUP_SECONDS = 1.5


@dataclass
class CodeReading:
    """What :func:`read_script` found (see the module docstring)."""

    compiles: bool
    live_code: str
    foreseen: tuple[str, str] | None = None
    features: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def feature_vector(self, names: Sequence[str] = READING_FEATURES) -> list[float]:
        return [float(self.features.get(k, math.nan)) for k in names]


# ---------------------------------------------------------------------------------------
# context


def table_columns(context: Mapping[str, Any]) -> dict[str, Any]:
    """Columns of the task's data inventory in ``context["overview"]``:
    ``{"columns": {name: {"dtype", "unique", "role"}}, "complete": bool, "submission": [names]}``."""
    overview = str(context.get("overview") or "")
    cols: dict[str, dict[str, Any]] = {}
    for line in overview.splitlines():
        parts = [p.strip() for p in line.split(" | ")]
        if len(parts) != 5 or parts[0] == "column":
            continue
        name, role = parts[0], "feature"
        m = re.match(r"^(.*) \((id|target)\)$", name)
        if m:
            name, role = m.group(1), m.group(2)
        try:
            unique = int(parts[3])
        except ValueError:
            continue
        cols[name] = {"dtype": parts[1], "unique": unique, "role": role, "examples": parts[4]}
    meta = context.get("meta") or {}
    n_cols = meta.get("n_cols")
    complete = isinstance(n_cols, (int, float)) and len([c for c in cols.values() if c["role"] == "feature"]) == n_cols
    sub_line = next((line for line in overview.splitlines() if line.startswith("- Submission:")), "")
    # "... with columns `id`, `y`: the predicted ...; ..." or "... columns `id` and one ... (`a`, `b`); ..."
    segment = sub_line.partition("columns")[2].partition(";")[0]
    segment = segment.partition(":")[0] if "(" not in segment.partition(":")[0] or ")" in segment else segment
    names = [n for n in re.findall(r"`([^`]+)`", segment) if n != "./submission.csv"]
    return {"columns": cols, "complete": bool(complete and cols), "submission": names}


def _required_columns(context: Mapping[str, Any], table: Mapping[str, Any]) -> list[str] | None:
    return list(table["submission"]) or None


# ---------------------------------------------------------------------------------------
# constant folding and dead code


def _constants(tree: ast.Module) -> dict[str, Any]:
    """Module-level names assigned exactly once to a literal (``TARGET = "y"``)."""
    seen: dict[str, list[Any]] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign):
            targets: list[ast.expr] = list(node.targets)
            values: list[ast.expr] = [node.value]
            if len(targets) == 1 and isinstance(targets[0], ast.Tuple) and isinstance(node.value, ast.Tuple):
                targets, values = list(targets[0].elts), list(node.value.elts)
            for t, v in zip(targets, values * len(targets) if len(values) == 1 else values, strict=False):
                if isinstance(t, ast.Name):
                    try:
                        seen.setdefault(t.id, []).append(ast.literal_eval(v))
                    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                        seen.setdefault(t.id, []).append(_UNKNOWN)
    stores: dict[str, int] = {}
    for n in ast.walk(tree):
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
            stores[n.id] = stores.get(n.id, 0) + 1
    return {k: v[0] for k, v in seen.items() if len(v) == 1 and v[0] is not _UNKNOWN and stores.get(k) == 1}


class _Unknown:
    pass


_UNKNOWN = _Unknown()


def _value(node: ast.AST | None, consts: Mapping[str, Any]) -> Any:
    """The literal value of ``node`` (resolving single-assignment constants), or ``_UNKNOWN``
    (also for an absent node)."""
    if node is None:
        return _UNKNOWN
    if isinstance(node, ast.Name):
        return consts.get(node.id, _UNKNOWN)
    if isinstance(node, (ast.List, ast.Tuple)):
        vals = [_value(e, consts) for e in node.elts]
        return _UNKNOWN if any(v is _UNKNOWN for v in vals) else vals
    if isinstance(node, ast.JoinedStr):
        return _UNKNOWN
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return _UNKNOWN


def _truth(test: ast.expr, consts: Mapping[str, Any]) -> bool | None:
    """Whether ``test`` is always true / always false, when the reader can tell."""
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        t = _truth(test.operand, consts)
        return None if t is None else not t
    if isinstance(test, ast.BoolOp):
        parts = [_truth(v, consts) for v in test.values]
        if isinstance(test.op, ast.And):
            return False if False in parts else (True if all(p is True for p in parts) else None)
        return True if True in parts else (False if all(p is False for p in parts) else None)
    if isinstance(test, ast.Compare) and len(test.ops) == 1:
        left, op, right = test.left, test.ops[0], test.comparators[0]
        if _is_main_name(left) and isinstance(right, ast.Constant):
            equal = right.value == "__main__"
            return equal if isinstance(op, ast.Eq) else (not equal if isinstance(op, ast.NotEq) else None)
        if _non_negative(left, consts):
            rv = _value(right, consts)
            if isinstance(rv, (int, float)) and not isinstance(rv, bool) and rv <= 0:
                if isinstance(op, ast.Lt) and rv <= 0:
                    return False
                if isinstance(op, ast.GtE) and rv <= 0:
                    return True
                if isinstance(op, ast.Eq) and rv < 0:
                    return False
        lv, rv = _value(left, consts), _value(right, consts)
        if lv is not _UNKNOWN and rv is not _UNKNOWN:
            try:
                return bool(
                    {
                        ast.Eq: lambda a, b: a == b,
                        ast.NotEq: lambda a, b: a != b,
                        ast.Lt: lambda a, b: a < b,
                        ast.LtE: lambda a, b: a <= b,
                        ast.Gt: lambda a, b: a > b,
                        ast.GtE: lambda a, b: a >= b,
                    }[type(op)](lv, rv)  # fmt: skip
                )
            except (KeyError, TypeError):
                return None
        return None
    v = _value(test, consts)
    if v is _UNKNOWN:
        return None
    try:
        return bool(v)
    except Exception:  # noqa: BLE001 -- a literal whose truth raises: not foldable
        return None


def _is_main_name(node: ast.AST) -> bool:
    return isinstance(node, ast.Name) and node.id == "__name__"


def _non_negative(node: ast.AST, consts: Mapping[str, Any]) -> bool:
    """``len(...)``, ``x.shape[i]``, ``x.size``, ``abs(...)``: never negative."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("len", "abs"):
        return True
    if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute) and node.value.attr == "shape":
        return True
    return isinstance(node, ast.Attribute) and node.attr in ("size", "ndim")


def _terminates(stmt: ast.stmt) -> str | None:
    """``"raise"`` / ``"exit"`` / ``"return"`` when ``stmt`` always leaves the block."""
    if isinstance(stmt, ast.Raise):
        return "raise"
    if isinstance(stmt, (ast.Return, ast.Break, ast.Continue)):
        return "return"
    if isinstance(stmt, ast.Assert) and isinstance(stmt.test, ast.Constant) and not stmt.test.value:
        return "raise"
    if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
        f = stmt.value.func
        name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None
        if name in _EXIT_CALLS or (name == "exit" and isinstance(f, ast.Attribute)):
            return "exit"
    return None


class _Pruner(ast.NodeTransformer):
    """Drop statements that never run; count them."""

    def __init__(self, consts: Mapping[str, Any]) -> None:
        self.consts = consts
        self.dropped = 0

    def _block(self, body: list[ast.stmt]) -> list[ast.stmt]:
        out: list[ast.stmt] = []
        for i, stmt in enumerate(body):
            new = self.visit(stmt)
            items = new if isinstance(new, list) else ([new] if new is not None else [])
            out.extend(items)
            if any(_terminates(s) for s in items):
                self.dropped += len(body) - i - 1
                break
        return out or [ast.Pass()]

    def generic_visit(self, node: ast.AST) -> ast.AST:
        for name in ("body", "orelse", "finalbody"):
            block = getattr(node, name, None)
            if isinstance(block, list) and block and isinstance(block[0], ast.stmt):
                setattr(node, name, self._block(block))
        if isinstance(node, ast.Try):
            for h in node.handlers:
                h.body = self._block(h.body)
        return node

    def visit_If(self, node: ast.If) -> Any:
        t = _truth(node.test, self.consts)
        if t is True:
            self.dropped += len(node.orelse)
            return self._block(node.body)
        if t is False:
            self.dropped += len(node.body)
            return self._block(node.orelse) if node.orelse else None
        return self.generic_visit(node)

    def visit_While(self, node: ast.While) -> Any:
        if _truth(node.test, self.consts) is False:
            self.dropped += len(node.body)
            return self._block(node.orelse) if node.orelse else None
        return self.generic_visit(node)


def _prune_uncalled(tree: ast.Module) -> int:
    """Remove module-level functions / classes no live code refers to (to a fixed point)."""
    dropped = 0
    while True:
        defs = {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
        used: set[str] = set()
        for node in tree.body:
            if node in defs.values():
                continue
            used |= {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
            used |= {n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)}
        # a definition used by another *used* definition is used too
        changed = True
        while changed:
            changed = False
            for name, d in defs.items():
                if name in used:
                    refs = {n.id for n in ast.walk(d) if isinstance(n, ast.Name)}
                    if not refs <= used:
                        used |= refs
                        changed = True
        dead = [d for name, d in defs.items() if name not in used]
        if not dead:
            return dropped
        dropped += len(dead)
        tree.body = [n for n in tree.body if n not in dead] or [ast.Pass()]


class _Renamer(ast.NodeTransformer):
    """Replace the script's own names by positional ones (``v0``, ``v1``, ...)."""

    def __init__(self, own: set[str]) -> None:
        self.own = own
        self.map: dict[str, str] = {}

    def _new(self, name: str) -> str:
        if name not in self.own:
            return name
        return self.map.setdefault(name, f"v{len(self.map)}")

    def visit_Name(self, node: ast.Name) -> ast.Name:
        node.id = self._new(node.id)
        return node

    def visit_arg(self, node: ast.arg) -> ast.arg:
        node.arg = self._new(node.arg)
        return node

    def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.FunctionDef:
        node.name = self._new(node.name)
        self.generic_visit(node)
        return node


def _own_names(tree: ast.Module) -> set[str]:
    own: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            own.add(node.id)
        elif isinstance(node, ast.arg):
            own.add(node.arg)
        elif isinstance(node, ast.FunctionDef):
            own.add(node.name)
    return own


def _drop_unused_imports(tree: ast.Module) -> ast.Module:
    """Leave out imported names nothing uses (they still run: the reader checks them on the
    pruned tree; the live text is what the code *does*)."""
    used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    body = []
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            node.names = [a for a in node.names if (a.asname or a.name).split(".")[0] in used or a.name == "*"]
            if not node.names:
                continue
        body.append(node)
    tree.body = body or [ast.Pass()]
    return tree


# Calls that change state beyond the name they are assigned to, or can fail (reading a file
# the sandbox does not have raises): an assignment whose value makes one is never a dead store.
_EFFECT_CALLS = frozenset(
    "fit fit_transform fit_predict fit_resample partial_fit to_csv to_parquet savetxt save write "
    "append extend insert update pop remove sort clear add setdefault seed system run makedirs mkdir "
    "open exec eval __import__ sleep read_csv read_table read_parquet read_json read_excel read_pickle "
    "read_feather load loadtxt genfromtxt fromfile".split()
)


def _drop_dead_stores(tree: ast.Module) -> ast.Module:
    """Leave out assignments to names nothing reads whose value has no effect (to a fixed
    point): columns listed and never used, a frame copied and never read. Like unused imports,
    they still run and the reader checks them on the pruned tree; the live text omits them."""
    own_functions = {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}

    def effectful(value: ast.AST) -> bool:
        for n in ast.walk(value):
            if isinstance(n, ast.Call) and (
                _call_name(n) in _EFFECT_CALLS
                or _call_name(n) in own_functions
                or any(k.arg == "inplace" for k in n.keywords)
            ):
                return True
            if isinstance(n, (ast.Await, ast.Yield, ast.YieldFrom, ast.NamedExpr)):
                return True
        return False

    def stored(target: ast.AST) -> list[str] | None:
        if isinstance(target, ast.Name):
            return [target.id]
        if isinstance(target, (ast.Tuple, ast.List)):
            names = [stored(e) for e in target.elts]
            return None if any(n is None for n in names) else [x for n in names for x in n]  # type: ignore[union-attr]
        return None  # an attribute or subscript store changes an object that may be read

    class _Sweep(ast.NodeTransformer):
        def __init__(self, read: set[str]) -> None:
            self.read, self.dropped = read, 0

        def visit_Assign(self, node: ast.Assign) -> ast.AST | None:
            names = [stored(t) for t in node.targets]
            if (
                all(n is not None for n in names)
                and not any(
                    x in self.read
                    for n in names
                    for x in n  # type: ignore[union-attr]
                )
                and not effectful(node.value)
            ):
                self.dropped += 1
                return None
            return node

    while True:
        read = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Store)}
        read |= {name for n in ast.walk(tree) if isinstance(n, (ast.Global, ast.Nonlocal)) for name in n.names}
        sweep = _Sweep(read)
        tree = sweep.visit(tree)
        for node in ast.walk(tree):  # a body left empty by the sweep stays valid Python
            if not isinstance(node, ast.Module) and getattr(node, "body", None) == []:
                setattr(node, "body", [ast.Pass()])  # noqa: B010 -- any node kind with a body
        if not sweep.dropped:
            return tree


def live_source(code: str) -> tuple[ast.Module, str, int] | None:
    """``(pruned tree, its source without unused imports and with positional names,
    statements dropped)`` or ``None`` when ``code`` does not parse."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    try:
        consts = _constants(tree)
        pruner = _Pruner(consts)
        tree.body = pruner._block(tree.body)
        dropped = pruner.dropped + _prune_uncalled(tree)
        ast.fix_missing_locations(tree)
        named = _drop_unused_imports(_drop_dead_stores(ast.parse(ast.unparse(tree))))
        named = _Renamer(_own_names(named)).visit(named)
        return tree, ast.unparse(named), dropped
    except (RecursionError, MemoryError, ValueError, TypeError, AttributeError):
        return None


# ---------------------------------------------------------------------------------------
# the reading


def read_script(code: str, context: Mapping[str, Any] | None = None) -> CodeReading:
    """Read ``code`` against its task ``context`` (see the module docstring). Never raises."""
    context = context or {}
    live = live_source(code)
    if live is None:
        return CodeReading(compiles=False, live_code=code, features={k: math.nan for k in READING_FEATURES})
    tree, text, dropped = live
    try:
        return _Reader(tree, text, dropped, context).read()
    except (RecursionError, MemoryError, ValueError, TypeError, AttributeError, KeyError, IndexError) as e:
        reading = CodeReading(compiles=True, live_code=text, features={k: math.nan for k in READING_FEATURES})
        reading.notes.append(f"reader failed: {type(e).__name__}")
        return reading


def _unknown_sklearn_module(module: str, names: Mapping[str, Any]) -> bool:
    """``sklearn.<x>`` where ``<x>`` is no public subpackage of the runtime's scikit-learn (the
    inventory lists them all, from ``sklearn.__all__``): a misspelt or removed module.
    Private (``_x``) modules and deeper paths under a listed subpackage are not judged."""
    parts = module.split(".")
    return (
        parts[0] == "sklearn" and len(parts) > 1 and not parts[1].startswith("_") and ".".join(parts[:2]) not in names
    )


def _log10_speed(estimator: str) -> float:
    """log10 work units per CPU-second of ``estimator`` (see :data:`_LOG10_UNITS_PER_SECOND`)."""
    return next((v for k, v in _LOG10_UNITS_PER_SECOND if estimator.startswith(k)), _LOG10_UNITS_PER_SECOND_DEFAULT)


def _call_name(node: ast.Call) -> str | None:
    f = node.func
    return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None


def _kw(node: ast.Call, name: str) -> ast.expr | None:
    return next((k.value for k in node.keywords if k.arg == name), None)


def _num(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) else None


def _in_try(node: ast.AST, parents: Mapping[ast.AST, ast.AST]) -> bool:
    p = parents.get(node)
    while p is not None:
        if isinstance(p, ast.Try):
            return True
        p = parents.get(p)
    return False


def _top_level(node: ast.AST, parents: Mapping[ast.AST, ast.AST]) -> bool:
    """Runs unconditionally at module level (not inside a def, loop body, if, with, try)."""
    p = parents.get(node)
    while p is not None and not isinstance(p, ast.Module):
        if isinstance(p, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.If, ast.For, ast.While, ast.Try, ast.With, ast.Lambda)):  # fmt: skip
            return False
        p = parents.get(p)
    return True


class _Reader:
    def __init__(self, tree: ast.Module, text: str, dropped: int, context: Mapping[str, Any]) -> None:
        from wmrl_envs.sandbox.runtime import runtime_inventory

        self.tree, self.text, self.dropped, self.context = tree, text, dropped, context
        self.inventory = runtime_inventory()
        self.consts = _constants(tree)
        self.parents: dict[ast.AST, ast.AST] = {}
        for node in ast.walk(tree):
            for child in ast.iter_child_nodes(node):
                self.parents[child] = node
        self.meta = dict(context.get("meta") or {})
        self.limits = dict(context.get("limits") or {})
        self.table = table_columns(context)
        self.calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)]
        self.names = {_call_name(c) for c in self.calls}
        self.f: dict[str, float] = {k: math.nan for k in READING_FEATURES}
        self.foreseen: list[tuple[int, str, str]] = []  # (line, status, reason): the first one wins
        self.notes: list[str] = []

    def _fail(self, node: ast.AST, status: str, reason: str) -> None:
        self.foreseen.append((getattr(node, "lineno", 10**9), status, reason))

    def read(self) -> CodeReading:
        self.f["read:dead_statements"] = float(self.dropped)
        self._imports()
        self._keywords()
        self._columns()
        self._terminators()
        self._write()
        self._predictions()
        self._expansions()
        self._work()
        self._loops_and_sleeps()
        self._allocations()
        first = min(self.foreseen, default=None)
        foreseen = None if first is None else (first[1], first[2])
        self.f["read:foreseen_failure"] = float(foreseen is not None)
        return CodeReading(compiles=True, live_code=self.text, foreseen=foreseen, features=self.f, notes=self.notes)

    # -- imports and API ----------------------------------------------------------------

    def _imports(self) -> None:
        modules = set(self.inventory["modules"])
        names = self.inventory["names"]
        missing = 0
        for node in ast.walk(self.tree):
            if not isinstance(node, (ast.Import, ast.ImportFrom)) or not _top_level(node, self.parents):
                continue
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.split(".")[0] not in modules or _unknown_sklearn_module(a.name, names):
                        missing += 1
                        self._fail(node, "runtime_error", f"module {a.name!r} is not installed in the runtime")
            elif node.module and not node.level:
                top = node.module.split(".")[0]
                if top not in modules or _unknown_sklearn_module(node.module, names):
                    missing += 1
                    self._fail(node, "runtime_error", f"module {node.module!r} is not installed in the runtime")
                elif node.module in names:
                    for a in node.names:
                        if a.name != "*" and a.name not in names[node.module]:
                            missing += 1
                            self._fail(node, "runtime_error", f"{node.module} has no {a.name!r} in the runtime")
        self.f["read:missing_imports"] = float(missing)

    def _imported_from_sklearn(self) -> set[str]:
        out = set()
        for node in ast.walk(self.tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("sklearn"):
                out |= {a.asname or a.name for a in node.names if (a.asname or a.name) == a.name}
        return out

    def _keywords(self) -> None:
        params = self.inventory.get("params", {})
        sk = self._imported_from_sklearn()
        removed = 0
        for c in self.calls:
            name = _call_name(c)
            if name in sk and name in params and isinstance(c.func, ast.Name) and not _in_try(c, self.parents):
                bad = [k.arg for k in c.keywords if k.arg is not None and k.arg not in params[name]]
                if bad:
                    removed += 1
                    self._fail(c, "runtime_error", f"{name}() has no keyword {bad[0]!r} in the runtime's scikit-learn")
        self.f["read:removed_keywords"] = float(removed)

    # -- columns ------------------------------------------------------------------------

    def _assignments(self) -> list[tuple[str, ast.expr, ast.stmt]]:
        """``(name, value, statement)`` of every assignment to a plain name (tuples unpacked)."""
        out: list[tuple[str, ast.expr, ast.stmt]] = []
        for n in ast.walk(self.tree):
            if not (isinstance(n, ast.Assign) and len(n.targets) == 1):
                continue
            target = n.targets[0]
            if isinstance(target, ast.Name):
                out.append((target.id, n.value, n))
            elif (
                isinstance(target, ast.Tuple)
                and isinstance(n.value, ast.Tuple)
                and len(target.elts) == len(n.value.elts)
            ):
                out += [(t.id, v, n) for t, v in zip(target.elts, n.value.elts) if isinstance(t, ast.Name)]
        return out

    def _frame_at(
        self, name: str, line: int, assigns: list[tuple[str, ast.expr, ast.stmt]], depth: int = 0
    ) -> str | None:
        """What frame ``name`` holds just before ``line``: "train" / "test" when its last
        binding before it runs unconditionally at module level and is ``pd.read_csv`` of that
        file or a ``.drop(...)`` / ``.copy()`` of such a frame; else ``None`` (columns unknown)."""
        before = [(v, st) for n, v, st in assigns if n == name and st.lineno < line]
        if not before or depth > 8:
            return None
        value, stmt = max(before, key=lambda x: x[1].lineno)
        if not _top_level(stmt, self.parents):
            return None
        if isinstance(value, ast.Call) and _call_name(value) == "read_csv" and value.args:
            path = _value(value.args[0], self.consts)
            return ("test" if path.endswith("test.csv") else "train") if isinstance(path, str) else None
        if (
            isinstance(value, ast.Call)
            and _call_name(value) in ("drop", "copy")
            and isinstance(value.func, ast.Attribute)
        ):
            source = value.func.value
            if isinstance(source, ast.Name):
                return self._frame_at(source.id, stmt.lineno, assigns, depth + 1)
        return None

    def _columns(self) -> None:
        if not self.table["complete"]:
            return
        cols = self.table["columns"]
        target = next((n for n, c in cols.items() if c["role"] == "target"), None)
        created = {
            v
            for node in ast.walk(self.tree)
            if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Store)
            for v in [_value(node.slice, self.consts)]
            if isinstance(v, str)
        }
        created |= {k.arg for c in self.calls if _call_name(c) == "assign" for k in c.keywords if k.arg}
        assigns = self._assignments()
        unknown = 0
        for c in self.calls:
            if _call_name(c) != "drop" or not isinstance(c.func, ast.Attribute):
                continue
            errors = _value(_kw(c, "errors"), self.consts) if _kw(c, "errors") is not None else "raise"
            arg = _kw(c, "columns")
            if arg is None and c.args and _value(_kw(c, "axis"), self.consts) in (1, "columns"):
                arg = c.args[0]
            if arg is None or errors != "raise":
                continue
            wanted = _value(arg, self.consts)
            wanted = [wanted] if isinstance(wanted, str) else wanted
            if not isinstance(wanted, list) or not all(isinstance(w, str) for w in wanted):
                continue
            receiver = c.func.value.id if isinstance(c.func.value, ast.Name) else None
            frame = self._frame_at(receiver, c.lineno, assigns) if receiver is not None else None
            if frame is None:
                continue  # a frame the reader does not know the columns of
            allowed = set(cols) | created
            if frame == "test" and target is not None:
                allowed.discard(target)
            bad = [w for w in wanted if w not in allowed]
            if bad:
                unknown += 1
                if _top_level(c, self.parents) and not _in_try(c, self.parents):
                    self._fail(
                        c, "runtime_error", f"drops column {bad[0]!r}, which that frame does not have (KeyError)"
                    )
        self.f["read:unknown_columns"] = float(unknown)

    # -- control flow -------------------------------------------------------------------

    def _write_calls(self) -> list[tuple[ast.Call, Any]]:
        out = []
        for c in self.calls:
            name = _call_name(c)
            if name in _WRITE_METHODS:
                path = (
                    _value(c.args[0], self.consts)
                    if c.args
                    else _value(_kw(c, "path_or_buf") or ast.Constant(None), self.consts)
                )
                out.append((c, path))
            elif name == "open" and len(c.args) >= 2 and isinstance(_value(c.args[1], self.consts), str) and "w" in _value(c.args[1], self.consts):  # fmt: skip
                out.append((c, _value(c.args[0], self.consts)))
        return out

    def _terminators(self) -> None:
        """An unconditional raise / exit at module level (the pruner kept it: it is live)."""
        for stmt in self.tree.body:
            kind = _terminates(stmt)
            if kind == "raise":
                self._fail(stmt, "runtime_error", "raises unconditionally at module level")
            elif kind == "exit":
                code = stmt.value.args[0] if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call) and stmt.value.args else None  # type: ignore[attr-defined]  # fmt: skip
                v = 0 if code is None else _value(code, self.consts)
                if v in (0, None):
                    self._fail(stmt, "no_submission", "exits before writing ./submission.csv")
                elif v is not _UNKNOWN:
                    self._fail(stmt, "runtime_error", f"exits with status {v!r} at module level")
            if isinstance(stmt, (ast.Expr, ast.Assign, ast.AugAssign)):
                for node in ast.walk(stmt):
                    if (
                        isinstance(node, ast.BinOp)
                        and isinstance(node.op, (ast.Div, ast.FloorDiv, ast.Mod))
                        and _value(node.right, self.consts) == 0
                        and _num(_value(node.left, self.consts)) is not None
                    ):
                        self._fail(node, "runtime_error", "divides a number by zero at module level")

    def _write(self) -> None:
        writes = self._write_calls()
        paths = [p for _, p in writes]
        to_submission = [(c, p) for c, p in writes if isinstance(p, str) and posixpath.normpath(p) == "submission.csv"]
        unresolved = any(not isinstance(p, str) for p in paths)
        self.f["read:writes_submission"] = float(bool(to_submission))
        if not to_submission and not unresolved:
            elsewhere = [p for p in paths if isinstance(p, str) and posixpath.basename(p) == "submission.csv"]
            makes_dirs = bool(self.names & {"makedirs", "mkdir"})
            if elsewhere and not makes_dirs and posixpath.dirname(posixpath.normpath(elsewhere[0])) not in ("", "."):
                self._fail(
                    writes[0][0], "runtime_error", f"writes {elsewhere[0]!r} into a directory that does not exist"
                )
            else:
                self._fail(ast.Pass(lineno=10**8), "no_submission", "no reachable write of ./submission.csv")
            return
        for c, _ in to_submission:
            index = _kw(c, "index")
            written = index is None or _value(index, self.consts) is not False
            self.f["read:index_written"] = float(written)
            if written and "set_index" not in self.names and _call_name(c) == "to_csv":
                self._fail(c, "no_submission", "writes the row index as an extra column (to_csv without index=False)")
            self._submission_columns(c)

    def _submission_columns(self, call: ast.Call) -> None:
        """``pd.DataFrame({...literal keys...}).to_csv("submission.csv")`` with the wrong columns."""
        required = _required_columns(self.context, self.table)
        if required is None or not isinstance(call.func, ast.Attribute):
            return
        frame = call.func.value
        if isinstance(frame, ast.Name):  # sub = pd.DataFrame({...}); sub.to_csv(...)
            frame = next(
                (
                    n.value
                    for n in ast.walk(self.tree)
                    if isinstance(n, ast.Assign)
                    and any(isinstance(t, ast.Name) and t.id == frame.id for t in n.targets)
                ),  # type: ignore[attr-defined]  # fmt: skip
                frame,
            )
        if not (isinstance(frame, ast.Call) and _call_name(frame) == "DataFrame" and frame.args and isinstance(frame.args[0], ast.Dict)):  # fmt: skip
            return
        keys = [_value(k, self.consts) if k is not None else _UNKNOWN for k in frame.args[0].keys]
        if any(not isinstance(k, str) for k in keys):
            return
        if set(keys) != set(required):
            self._fail(call, "no_submission", f"submission columns {keys} are not {required}")

    # -- what is predicted --------------------------------------------------------------

    def _predictions(self) -> None:
        fmt = self.meta.get("submission_format")
        uses_proba = bool(self.names & _PROBA_CALLS)
        predicts = "predict" in self.names
        proba_needed = fmt in ("proba_positive", "proba_classes")
        self.f["read:labels_for_proba"] = float(proba_needed and predicts and not uses_proba)
        self.f["read:proba_for_labels"] = float(fmt == "label" and uses_proba and not predicts)
        if proba_needed and predicts and not uses_proba and "argmax" not in self.names:
            target = next((c for c in self.table["columns"].values() if c["role"] == "target"), None)
            non_numeric = target is not None and target["dtype"] in ("str", "object", "category")
            if fmt == "proba_classes" or non_numeric:
                self._fail(
                    ast.Pass(lineno=10**7),
                    "no_submission",
                    "writes predicted labels where the submission needs probabilities",
                )
        self._svc_without_probability(uses_proba)
        logs = {"log", "log1p"} & self.names
        exps = {"exp", "expm1"} & self.names
        regression = self.meta.get("task_type") == "regression"
        self.f["read:log_target_not_inverted"] = float(regression and bool(logs) and not exps and "TransformedTargetRegressor" not in self.names)  # fmt: skip

    def _svc_without_probability(self, uses_proba: bool) -> None:
        """``SVC()`` has no ``predict_proba`` unless built with ``probability=True``: soft
        voting over one, or ``predict_proba`` when it is the script's only model, fails."""
        if "CalibratedClassifierCV" in self.names:
            return
        svcs = [c for c in self.calls if _call_name(c) in ("SVC", "NuSVC")]
        lacking = [c for c in svcs if _value(_kw(c, "probability"), self.consts) is not True]
        if not lacking:
            return
        for c in self.calls:
            if _call_name(c) == "VotingClassifier" and _value(_kw(c, "voting"), self.consts) == "soft":
                if any(s in lacking for s in ast.walk(c)):
                    self._fail(c, "runtime_error", "soft voting over an SVC built without probability=True")
                    return
        models = [c for c in self.calls if any(_call_name(c) in names for names in ESTIMATOR_FAMILIES.values())]
        if uses_proba and "predict_proba" in self.names and len(models) == 1 and models[0] in lacking:
            self._fail(models[0], "runtime_error", "predict_proba on an SVC built without probability=True")

    # -- size and work ------------------------------------------------------------------

    def _rows(self) -> tuple[float, float]:
        return float(self.meta.get("n_train") or math.nan), float(self.meta.get("n_test") or 0)

    def _expansions(self) -> None:
        cols = self.table["columns"]
        feats = [c for c in cols.values() if c["role"] == "feature"]
        all_width = float(sum(c["unique"] for c in feats)) if self.table["complete"] else math.nan
        onehot = float(self.meta.get("onehot_width") or math.nan)
        n_numeric = float(self.meta.get("n_numeric") or math.nan)
        width = float(self.meta.get("n_cols") or math.nan)
        n_train = self._rows()[0]
        dense = False
        blocks: list[tuple[ast.Call, float]] = []  # dense float64 blocks that certainly materialise: (call, cells)
        for c in self.calls:
            name = _call_name(c)
            over_all = any(
                (isinstance(a, ast.Attribute) and a.attr == "columns")
                or (
                    isinstance(a, ast.Call)
                    and _call_name(a) == "list"
                    and a.args
                    and isinstance(a.args[0], ast.Attribute)
                    and a.args[0].attr == "columns"
                )  # fmt: skip
                for a in ast.walk(c)
            )
            if name == "OneHotEncoder":
                sparse = _kw(c, "sparse_output") or _kw(c, "sparse")
                dense = dense or (sparse is not None and _value(sparse, self.consts) is False)
                parent = self.parents.get(c)
                in_all = isinstance(parent, ast.Tuple) and any(
                    isinstance(e, ast.Call) and _call_name(e) == "list" for e in parent.elts
                )
                width = max(width, all_width if in_all else onehot) if not math.isnan(width) else onehot
                capped = _kw(c, "min_frequency") is not None or _kw(c, "max_categories") is not None
                is_dense = sparse is not None and _value(sparse, self.consts) is False
                if in_all and is_dense and not capped:
                    blocks.append((c, n_train * all_width))  # fitted on the training rows only
                elif is_dense and not capped and self._inside_call(c, "ColumnTransformer") and self._keeps_levels():
                    blocks.append((c, n_train * onehot))  # every level of the table's categorical columns
            elif name == "get_dummies":
                dense = True
                cols_kw = _kw(c, "columns")
                width = max(width, all_width if cols_kw is not None and over_all else onehot)
                dtype = _kw(c, "dtype")  # pandas >= 2 makes bool (1-byte) dummies unless told a float dtype
                if cols_kw is not None and over_all and dtype is not None and "float" in ast.unparse(dtype):
                    blocks.append((c, n_train * all_width))  # dtype=float: float64 cells, train rows at least
        for c in self.calls:
            if _call_name(c) == "PolynomialFeatures":
                degree = (
                    _num(_value(_kw(c, "degree") or (c.args[0] if c.args else ast.Constant(2)), self.consts)) or 2.0
                )
                base = width if "get_dummies" in self.names else n_numeric
                # the gate needs a width the block certainly has: the dummies' count is only known
                # when nothing merges or drops levels (a rare-level merge can leave a few columns)
                certain = base if "get_dummies" not in self.names or self._keeps_levels() else n_numeric
                if not math.isnan(base):
                    width = max(width, float(math.comb(int(base) + int(degree), int(degree))))
                if not math.isnan(certain) and _kw(c, "interaction_only") is None:
                    # at least `certain` inputs: C(certain + d, d) outputs
                    blocks.append((c, n_train * float(math.comb(int(certain) + int(degree), int(degree)))))
                dense = True
        self.width = width
        memory_limit = float(self.limits.get("memory_bytes") or math.nan)
        for call, cells in blocks:
            # written inside a ColumnTransformer(...), the block is certainly hstacked: two copies at once
            copies = _DENSE_COPIES if self._inside_call(call, "ColumnTransformer") else 1.0
            if memory_limit > 0 and copies * cells * 8.0 > memory_limit and not _in_try(call, self.parents):
                what = "one dense copy" if copies == 1.0 else "its dense block and the ColumnTransformer's copy"
                self._fail(
                    call,
                    "runtime_error",
                    f"{what} of its {_call_name(call)} output take {copies * cells * 8.0 / 2**30:.1f} GiB, over the "
                    f"{memory_limit / 2**30:.1f} GiB memory limit",
                )
        n_train, n_test = self._rows()
        # the peak: the training block's copies while fitting, or the training block a model
        # keeps (k-NN, SVMs) plus the test block's copies while predicting
        rows = max(_DENSE_COPIES * n_train, n_train + _DENSE_COPIES * n_test)
        memory = float(self.limits.get("memory_bytes") or math.nan)
        self.f["read:log10_dense_width"] = math.log10(width) if width > 0 else math.nan
        if dense and rows > 0 and memory > 0:
            share = rows * width * 8.0 / memory
            self.f["read:dense_memory_share"] = share
            self.f["read:dense_over_memory"] = float(share > 1.0)
        else:
            self.f["read:dense_memory_share"] = 0.0 if memory > 0 else math.nan
            self.f["read:dense_over_memory"] = 0.0

    def _keeps_levels(self) -> bool:
        """Nothing in the script can drop categorical columns or merge their levels before
        encoding: no cardinality or frequency test, no replacement, no column drop by a
        computed list (dropping the target and id by name is fine)."""
        if self.names & {"nunique", "value_counts", "where", "mask", "replace", "map", "cut", "qcut", "select_dtypes"}:
            return False
        for c in self.calls:
            if _call_name(c) == "drop":
                cols = _kw(c, "columns")
                if cols is None or not isinstance(_value(cols, self.consts), list):
                    return False
        return True

    def _inside_call(self, node: ast.AST, name: str) -> bool:
        """``node`` is (in) an argument of a call to ``name``."""
        p = self.parents.get(node)
        while p is not None:
            if isinstance(p, ast.Call) and _call_name(p) == name:
                return True
            p = self.parents.get(p)
        return False

    def _work(self) -> None:
        """Model fits (searches, CV, stacking) and their estimated work against the time limit."""
        models = [c for c in self.calls if any(_call_name(c) in names for names in ESTIMATOR_FAMILIES.values())]
        self.f["read:n_models"] = float(len(models))
        self.f["read:uses_lib_boosting"] = float(
            bool(self.names & {"LGBMClassifier", "LGBMRegressor", "XGBClassifier", "XGBRegressor"})
        )
        self._svm_scaling(models)
        fits = 1.0
        for c in self.calls:
            name = _call_name(c)
            cv = _num(_value(_kw(c, "cv"), self.consts)) if _kw(c, "cv") is not None else 5.0
            cv = cv or 5.0
            if name == "GridSearchCV" and len(c.args) >= 2:
                grid = _value(c.args[1], self.consts)
                size = math.prod(len(v) for v in grid.values() if isinstance(v, list)) if isinstance(grid, dict) else 10
                fits = max(fits, size * cv + 1)
            elif name == "RandomizedSearchCV":
                n_iter = _num(_value(_kw(c, "n_iter"), self.consts)) if _kw(c, "n_iter") is not None else 10.0
                fits = max(fits, (n_iter or 10.0) * cv + 1)
            elif name in ("cross_val_score", "cross_validate", "cross_val_predict"):
                fits += cv
            elif name in ("StackingClassifier", "StackingRegressor"):
                fits = max(fits, cv + 1)
        self.f["read:log10_search_fits"] = math.log10(fits)
        rows, _ = self._rows()
        width = (
            self.width
            if hasattr(self, "width") and not math.isnan(self.width)
            else float(self.meta.get("n_cols") or 10)
        )
        seconds = 0.0
        for m in models:
            seconds += self._model_work(m, rows, width) / 10 ** _log10_speed(_call_name(m) or "")
        if not seconds or math.isnan(rows):
            return
        total = _STARTUP_SECONDS + seconds * fits
        self.f["read:log10_estimated_seconds"] = math.log10(total)
        wall = float(self.limits.get("wall_seconds") or math.nan)
        self.f["read:log10_time_share"] = math.log10(total / wall) if wall > 0 else math.nan

    def _svm_scaling(self, models: Sequence[ast.Call]) -> None:
        """An SVM with a linear or polynomial kernel on features nothing rescales: libsvm's
        solver needs orders of magnitude more iterations on raw feature scales (an RBF
        kernel saturates instead, and converges), so such fits run into the time limit."""
        svms = [m for m in models if _call_name(m) in ("SVC", "SVR")]
        if not svms:
            return  # NaN: no SVM to read
        raw_kernel = any(_value(_kw(m, "kernel"), self.consts) in ("linear", "poly") for m in svms)  # default: RBF
        self.f["read:svm_unscaled_kernel"] = float(raw_kernel and not self.names & _SCALERS)

    def _model_work(self, call: ast.Call, rows: float, width: float) -> float:
        name = _call_name(call) or ""

        def hp(key: str, default: float) -> float:
            node = _kw(call, key)
            v = _num(_value(node, self.consts)) if node is not None else None
            grid = self._grid_mean(key)
            return v if v is not None else (grid if grid is not None else default)

        base = rows * max(width, 1.0)
        if "Forest" in name or "ExtraTrees" in name or "Bagging" in name:
            return base * hp("n_estimators", 100) * math.log2(max(rows, 2))
        if name.startswith("HistGradientBoosting"):
            return rows * max(width, 1.0) * hp("max_iter", 100) * 2
        if name.startswith("GradientBoosting"):
            return base * hp("n_estimators", 100) * hp("max_depth", 3) * 4
        if name.startswith("LGBM"):
            return rows * max(width, 1.0) * hp("n_estimators", 100) * 1.5
        if name.startswith("XGB"):
            return rows * max(width, 1.0) * hp("n_estimators", 100) * hp("max_depth", 6)
        if name in ("SVC", "SVR"):
            return rows * rows * max(width, 1.0) * 2
        if name.startswith("KNeighbors"):
            # distances (one multiply-add per column per train x test pair) plus the
            # neighbour selection per pair, worth ~30 columns (fitted on the logged k-NN runs)
            return rows * float(self.meta.get("n_test") or rows) * (max(width, 1.0) + 30.0)
        if name.startswith("MLP"):
            layers = (
                _value(_kw(call, "hidden_layer_sizes"), self.consts)
                if _kw(call, "hidden_layer_sizes") is not None
                else [100]
            )
            units = sum(layers) if isinstance(layers, (list, tuple)) else 100.0
            return base * units * hp("max_iter", 200) * 0.5
        return base * 10

    def _grid_mean(self, key: str) -> float | None:
        """The mean numeric value a search grid gives ``key`` (``model__key`` in a dict literal)."""
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Dict):
                for k, v in zip(node.keys, node.values, strict=False):
                    kv = _value(k, self.consts) if k is not None else None
                    if isinstance(kv, str) and kv.split("__")[-1] == key:
                        vals = [_num(x) for x in (_value(v, self.consts) or []) if _num(x) is not None] if isinstance(_value(v, self.consts), list) else []  # fmt: skip
                        if vals:
                            return sum(vals) / len(vals)  # type: ignore[arg-type]
        return None

    # -- loops, sleeps, allocations -----------------------------------------------------

    def _loops_and_sleeps(self) -> None:
        rows, n_test = self._rows()
        wall = float(self.limits.get("wall_seconds") or math.nan)

        def iterations(loop: ast.For) -> float:
            it = loop.iter
            if isinstance(it, ast.Call) and _call_name(it) == "range" and it.args:
                arg = it.args[-1] if len(it.args) == 1 else it.args[1]
                if isinstance(arg, ast.Call) and _call_name(arg) == "len":
                    return rows
                v = _num(_value(arg, self.consts))
                return v if v is not None else math.nan
            if isinstance(it, ast.Call) and _call_name(it) in ("iterrows", "itertuples"):
                return rows
            return math.nan

        worst = 0.0
        for node in ast.walk(self.tree):
            if isinstance(node, ast.For):
                n = iterations(node)
                inner = max(
                    (iterations(c) for c in ast.walk(node) if isinstance(c, ast.For) and c is not node), default=1.0
                )
                total = (n if not math.isnan(n) else 1.0) * (inner if not math.isnan(inner) else 1.0)
                worst = max(worst, total)
        self.f["read:log10_loop_iterations"] = math.log10(worst) if worst > 0 else 0.0
        self.f["read:loop_seconds_share"] = worst / _PY_LOOP_RATE / wall if wall > 0 else math.nan
        sleep = 0.0
        for c in self.calls:
            if _call_name(c) == "sleep" and c.args:
                v = _num(_value(c.args[0], self.consts))
                if v is not None:
                    sleep = max(sleep, v)
                    if wall > 0 and v >= wall and _top_level(c, self.parents):
                        self._fail(c, "timeout", f"sleeps {v:g} s, longer than the {wall:g} s time limit")
        self.f["read:sleep_share"] = sleep / wall if wall > 0 else math.nan
        for node in self.tree.body:
            if isinstance(node, ast.While) and _truth(node.test, self.consts) is True:
                exits = any(isinstance(n, (ast.Break, ast.Return, ast.Raise)) for n in ast.walk(node))
                exits = exits or any(
                    isinstance(n, ast.Call) and _call_name(n) in _EXIT_CALLS | {"exit"} for n in ast.walk(node)
                )
                if not exits:
                    self._fail(node, "timeout", "loops forever (while True without a way out)")

    def _allocations(self) -> None:
        memory = float(self.limits.get("memory_bytes") or math.nan)
        worst = 0.0
        for c in self.calls:
            if _call_name(c) not in _ALLOC_CALLS:
                continue
            shape_node = c.args[0] if c.args else _kw(c, "shape") or _kw(c, "size")
            if shape_node is None:
                continue
            shape = _value(shape_node, self.consts)
            dims = shape if isinstance(shape, list) else [shape]
            if not dims or not all(_num(d) is not None for d in dims):
                continue
            size = math.prod(float(d) for d in dims) * 8.0
            worst = max(worst, size)
            if memory > 0 and size > memory and _top_level(c, self.parents):
                self._fail(
                    c,
                    "runtime_error",
                    f"allocates {size / 2**30:.1f} GiB, over the {memory / 2**30:.1f} GiB memory limit",
                )
        self.f["read:alloc_memory_share"] = worst / memory if memory > 0 else math.nan
