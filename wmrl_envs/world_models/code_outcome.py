"""A learned, CPU-fast world model of code outcomes, trained on execution logs.

:class:`CodeOutcomeModel` predicts what running an AutoResearch solution would give:

1. a deterministic **compile gate** — a script ``compile`` rejects is ``syntax_error``
   with score exactly 0.0 (no learning involved) — and, with ``read_code`` (default), a
   **foreseen-failure gate**: a failure :func:`~wmrl_envs.world_models.code_reader.read_script`
   is certain of from the code and the task (a missing import, no reachable write of the
   submission, an unconditional exception, ...) gets that status's ladder score, with the
   reason in ``metrics["foreseen"]``;
2. a **status classifier** (gradient-boosted trees) over :class:`ScriptFeaturizer`
   features of (task context, script): ``runtime_error`` / ``timeout`` /
   ``no_submission`` / ``valid`` (whatever statuses the logs contain);
3. a **percentile regressor** trained on the ``valid`` outcomes;

and turns them into a reward-scale score with the reward ladder (``valid`` scores
``0.5 + 0.5 * percentile``). With ``score_mode="expected"`` (default) the score is the
expectation of the ladder under the predicted status probabilities — smooth, which is what
isotonic calibration and group-relative advantages want; ``"argmax"`` scores the most
likely status only. The status of the returned :class:`Outcome` is always the most likely
one; the probabilities are in ``metrics["p_status"]``.

Persistence: :meth:`CodeOutcomeModel.save` writes ``model.joblib`` (the fitted
scikit-learn estimators and, optionally, the training matrix for :meth:`~CodeOutcomeModel.update`)
plus a human-readable ``meta.json``. ``joblib`` files are pickles: load only files you trust
(the shipped default model, or ones you fitted).

Classes: :class:`CodeOutcomeConfig`, :class:`CodeOutcomeModel`.
"""

from __future__ import annotations

import json
import math
import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal, cast

import joblib
import numpy as np
import sklearn
from sklearn.ensemble import HistGradientBoostingClassifier, HistGradientBoostingRegressor
from sklearn.isotonic import IsotonicRegression
from threadpoolctl import threadpool_limits

from wmrl_envs.autoresearch.grading import LADDER, compile_gate, ladder_score
from wmrl_envs.outcome import Outcome
from wmrl_envs.world_models.base import check_batch
from wmrl_envs.world_models.features import ScriptFeaturizer, ScriptSummary
from wmrl_envs.world_models.logs import LogRecord
from wmrl_envs.world_models.ranker import PairwiseBoostedRanker

__all__ = [
    "CodeOutcomeConfig",
    "CodeOutcomeModel",
    "DEFAULT_MODEL_DIR",
    "TRANSFER_MODEL_DIR",
    "percentile_of",
    "confidence",
]

#: Where the fitted default model ships (package data).
DEFAULT_MODEL_DIR = Path(__file__).parent / "default_model"
#: An optional shipped model with transfer features and a 5-member task-bootstrap ensemble
#: (fitted on the same data as the default; its spread feeds ``metrics["confidence"]``). Not
#: the default: its ranking is level with the default's within noise at 1.5x the fit cost
#: (see its README). Load with ``CodeOutcomeModel.load(TRANSFER_MODEL_DIR)``.
TRANSFER_MODEL_DIR = Path(__file__).parent / "transfer_model"
_FORMAT_VERSION = 1


@dataclass
class CodeOutcomeConfig:
    """Settings of :class:`CodeOutcomeModel`.

    Attributes:
        n_hash: hashed token columns of the featurizer (default 256).
        max_iter: boosting rounds of each tree ensemble (default 200).
        learning_rate: boosting learning rate (default 0.05).
        max_leaf_nodes: leaves per tree (default 15).
        min_samples_leaf: minimum samples per leaf (default 10).
        l2_regularization: L2 penalty on leaf values (default 1.0).
        score_mode: ``"expected"`` (ladder expectation under status probabilities, default)
            or ``"argmax"`` (ladder score of the most likely status).
        anchor_weight: sample weight of records whose ``origin`` is ``"anchor"`` relative
            to other records (default 1.0): raise it to let a few fresh real outcomes count more.
        keep_training_data: store the feature matrix so :meth:`CodeOutcomeModel.update` can
            refit with extra logs (default True).
        seed: random seed of the tree ensembles (default 0).
        size_features: give the featurizer the size-vs-limit block
            (:data:`~wmrl_envs.world_models.features.SIZE_FEATURES`: dense one-hot share of
            the memory limit, rows, rows per second of the time limit), what lets the model
            see memory and time failures coming on big tables (default True; models saved
            before it existed load with False).
        transfer_features: give the featurizer the task-relative block
            (:data:`~wmrl_envs.world_models.features.TRANSFER_FEATURES`) and drop the
            ``origin`` token (default False; models saved before it existed load with False).
        landmark_features: give the featurizer
            :data:`~wmrl_envs.world_models.features.LANDMARK_FEATURES`: where the script's own
            estimators land among the task's metric landmarks (default True; NaN without
            landmarks in the context; models saved before it existed load with False).
        percentile_head: what predicts a valid run's leaderboard percentile: ``"regressor"``
            (boosted trees on the percentile, default), ``"ranker"`` (a
            :class:`~wmrl_envs.world_models.ranker.PairwiseBoostedRanker` fitted for the
            order within each task, mapped to percentiles by an isotonic fit on the
            training rows) or ``"both"`` (the mean of the two).
        rank_rounds: boosting rounds of the ranker (default 150).
        n_ensemble: members of the percentile head, each fitted on a bootstrap sample of
            the training *tasks* (default 1: one member on everything). With more than one,
            their spread is the prediction's uncertainty: ``metrics["percentile_std"]``
            and a lower ``metrics["confidence"]``.
        read_code: read each script before featurising it
            (:mod:`~wmrl_envs.world_models.code_reader`): features of the code that runs only,
            invariant to formatting and naming, plus the reading features, and the
            foreseen-failure gate at prediction (default True; models saved before it existed
            load with False).
        origin_weights: sample weight of records by ``origin`` (e.g. ``{"agent-style": 0.5}``);
            origins not named weigh 1.0 (``anchor`` records: ``anchor_weight``).
        n_threads: OpenMP threads for fitting and prediction (default 1; ``None`` = all
            cores). One thread is the default because the model is small and OpenMP
            spin-waiting on a busy or shared machine is catastrophically slow (measured
            here: 83 s instead of 6 s for a 270-record fit at load 10 on 2 cores).
    """

    n_hash: int = 256
    max_iter: int = 200
    learning_rate: float = 0.05
    max_leaf_nodes: int = 15
    min_samples_leaf: int = 10
    l2_regularization: float = 1.0
    score_mode: Literal["expected", "argmax"] = "expected"
    anchor_weight: float = 1.0
    keep_training_data: bool = True
    seed: int = 0
    n_threads: int | None = 1
    size_features: bool = True
    transfer_features: bool = False
    landmark_features: bool = True
    percentile_head: Literal["regressor", "ranker", "both"] = "regressor"
    rank_rounds: int = 150
    n_ensemble: int = 1
    read_code: bool = True
    origin_weights: dict[str, float] | None = None

    def __post_init__(self) -> None:
        if self.score_mode not in ("expected", "argmax"):
            raise ValueError(f"score_mode must be 'expected' or 'argmax', got {self.score_mode!r}")
        if self.percentile_head not in ("regressor", "ranker", "both"):
            raise ValueError(f"percentile_head must be 'regressor', 'ranker' or 'both', got {self.percentile_head!r}")
        if self.n_ensemble < 1:
            raise ValueError(f"n_ensemble must be >= 1, got {self.n_ensemble}")
        if self.anchor_weight <= 0:
            raise ValueError(f"anchor_weight must be > 0, got {self.anchor_weight}")


def percentile_of(outcome: Outcome) -> float | None:
    """Leaderboard percentile of a ``valid`` outcome (``metrics["percentile"]``, else from the score)."""
    if outcome.status != "valid":
        return None
    p = outcome.metrics.get("percentile") if isinstance(outcome.metrics, Mapping) else None
    if isinstance(p, (int, float)) and not isinstance(p, bool) and math.isfinite(p):
        return min(1.0, max(0.0, float(p)))
    if outcome.score is None:
        return None
    return min(1.0, max(0.0, (outcome.score - 0.5) / 0.5))


class CodeOutcomeModel:
    """World model: (task context, script) -> predicted :class:`Outcome` (``source="wm"``).

    >>> from wmrl_envs.world_models.logs import LogRecord
    >>> from wmrl_envs.outcome import Outcome
    >>> ok = "import pandas as pd\\npd.read_csv('data/test.csv').to_csv('submission.csv', index=False)"
    >>> recs = [LogRecord("t", ok if i % 2 else "import xgboost", {"task_type": "binary"},
    ...         Outcome("valid", 0.5 + i / 80) if i % 2 else Outcome("runtime_error", 0.1)) for i in range(40)]
    >>> wm = CodeOutcomeModel(CodeOutcomeConfig(max_iter=20, min_samples_leaf=2)).fit(recs)
    >>> [o.status for o in wm.predict([{"task_type": "binary"}] * 2, [ok, "print(("])]
    ['valid', 'syntax_error']
    """

    def __init__(self, config: CodeOutcomeConfig | None = None) -> None:
        self.config = config or CodeOutcomeConfig()
        self.featurizer = self._new_featurizer()
        self.classes_: list[str] = []
        self._classifier: HistGradientBoostingClassifier | None = None
        self._regressor: HistGradientBoostingRegressor | None = None
        self._cls_cols: np.ndarray | None = None  # boolean column masks of the two models
        self._reg_cols: np.ndarray | None = None
        self._constant_percentile: float | None = None
        self._members: list[tuple[Any, Any]] = []  # percentile-head members: (estimator, isotonic map or None)
        self._train: dict[str, np.ndarray] | None = None
        self.info: dict[str, Any] = {}

    def _new_featurizer(self) -> ScriptFeaturizer:
        c = self.config
        return ScriptFeaturizer(
            n_hash=c.n_hash,
            size_features=c.size_features,
            transfer_features=c.transfer_features,
            landmark_features=c.landmark_features,
            read_code=c.read_code,
        )

    # ------------------------------------------------------------------ fitting
    @property
    def fitted(self) -> bool:
        return bool(self.classes_)

    def fit(self, records: Sequence[LogRecord]) -> CodeOutcomeModel:
        """Fit on execution-log records (compile failures and unknown outcomes are left out:
        the compile gate handles the former exactly and the latter carry no label)."""
        usable = _usable(records)
        if not usable:
            raise ValueError(
                f"no usable records among {len(records)}: every one failed to compile or had an unknown outcome"
            )
        self.featurizer = self._new_featurizer().fit([r.context for r in usable], [r.code for r in usable])
        arrays = self._arrays(usable)
        self._fit_arrays(*arrays)
        self.info = {
            "n_records": len(records),
            "n_used": len(usable),
            "n_tasks": len({r.task_id for r in usable}),
            "tasks": sorted({r.task_id for r in usable}),
            "status_counts": {s: int((arrays[1] == s).sum()) for s in self.classes_},
        }
        return self

    def update(self, records: Sequence[LogRecord]) -> CodeOutcomeModel:
        """Refit on the stored training data plus ``records`` (e.g. fresh anchor outcomes).

        The featurizer's context keys stay fixed so old and new rows share columns.
        Needs a model fitted with ``keep_training_data=True``.
        """
        if self._train is None:
            raise RuntimeError(
                "update needs the training data: fit (or load) a model with keep_training_data=True first"
            )
        usable = _usable(records)
        if not usable:
            return self
        old = self._train
        new = self._arrays(usable)
        old_group = old.get("group", np.array([""] * len(old["status"])))
        self._fit_arrays(
            np.vstack([old["X"], new[0]]),
            np.concatenate([old["status"], new[1]]),
            np.concatenate([old["pct"], new[2]]),
            np.concatenate([old["weight"], new[3]]),
            np.concatenate([old_group, new[4]]),
        )
        self.info["n_used"] = len(self._train["status"])
        self.info["n_updates"] = self.info.get("n_updates", 0) + 1
        return self

    def _arrays(self, usable: Sequence[LogRecord]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(features, status labels, valid percentiles (NaN otherwise), sample weights, task ids)."""
        X = self.featurizer.transform([r.context for r in usable], [r.code for r in usable])
        outcomes = [_logged_outcome(r) for r in usable]
        status = np.array([o.status for o in outcomes])
        pct = np.array([np.nan if (p := percentile_of(o)) is None else p for o in outcomes], dtype=np.float64)
        by_origin = dict(self.config.origin_weights or {})
        weight = np.array(
            [self.config.anchor_weight if r.origin == "anchor" else by_origin.get(r.origin, 1.0) for r in usable]
        )
        return X, status, pct, weight, np.array([r.task_id for r in usable])

    def _tree_kwargs(self) -> dict[str, Any]:
        c = self.config
        return dict(
            max_iter=c.max_iter, learning_rate=c.learning_rate, max_leaf_nodes=c.max_leaf_nodes,
            min_samples_leaf=c.min_samples_leaf, l2_regularization=c.l2_regularization,
            early_stopping=False, random_state=c.seed,
        )  # fmt: skip

    def _fit_arrays(
        self, X: np.ndarray, status: np.ndarray, pct: np.ndarray, weight: np.ndarray, group: np.ndarray
    ) -> None:
        with threadpool_limits(limits=self.config.n_threads):
            self._fit_arrays_unlimited(X, status, pct, weight, group)

    def _fit_arrays_unlimited(
        self, X: np.ndarray, status: np.ndarray, pct: np.ndarray, weight: np.ndarray, group: np.ndarray
    ) -> None:
        self.classes_ = sorted(set(status.tolist()))
        self._classifier, self._cls_cols = None, None
        if len(self.classes_) > 1:
            # Columns never observed (all NaN) are dropped: they carry nothing and
            # scikit-learn's binning rejects them.
            self._cls_cols = ~np.isnan(X).all(axis=0)
            self._classifier = HistGradientBoostingClassifier(**self._tree_kwargs()).fit(
                X[:, self._cls_cols], status, sample_weight=weight
            )
        valid = ~np.isnan(pct)
        self._regressor, self._reg_cols, self._constant_percentile = None, None, None
        self._members = []
        if valid.sum() >= 2 * self.config.min_samples_leaf:
            Xv = X[valid]
            self._reg_cols = ~np.isnan(Xv).all(axis=0)
            self._members = self._fit_members(Xv[:, self._reg_cols], pct[valid], weight[valid], group[valid])
            self._regressor = self._members[0][0] if self.config.percentile_head == "regressor" else None
        elif valid.any():
            self._constant_percentile = float(np.average(pct[valid], weights=weight[valid]))
        self._train = (
            {"X": X, "status": status, "pct": pct, "weight": weight, "group": group}
            if self.config.keep_training_data
            else None
        )

    def _fit_members(self, X: np.ndarray, y: np.ndarray, w: np.ndarray, group: np.ndarray) -> list[tuple[Any, Any]]:
        """The percentile head: ``n_ensemble`` members, each on a bootstrap of the tasks (one member: all)."""
        c = self.config
        tasks = np.unique(group)
        rng = np.random.default_rng(c.seed)
        members: list[tuple[Any, Any]] = []
        for m in range(c.n_ensemble):
            if c.n_ensemble == 1:
                idx = np.arange(len(y))
            else:
                pick = rng.choice(tasks, size=len(tasks), replace=True)
                idx = np.concatenate([np.flatnonzero(group == t) for t in pick])
            kw = {**self._tree_kwargs(), "random_state": c.seed + m}
            Xb = X[idx]
            empty = np.isnan(Xb).all(axis=0)
            if empty.any():  # a column the drawn tasks never fill: constant here, so never split on
                Xb = Xb.copy()
                Xb[:, empty] = 0.0
            if c.percentile_head in ("regressor", "both"):
                members.append((HistGradientBoostingRegressor(**kw).fit(Xb, y[idx], sample_weight=w[idx]), None))
            if c.percentile_head in ("ranker", "both"):
                ranker = PairwiseBoostedRanker(
                    n_rounds=c.rank_rounds, max_leaf_nodes=c.max_leaf_nodes,
                    min_samples_leaf=c.min_samples_leaf, seed=c.seed + m,
                ).fit(Xb, y[idx], [f"{g}#{i}" for g, i in zip(group[idx], _copy_index(idx))])  # fmt: skip
                iso = IsotonicRegression(y_min=0.0, y_max=1.0, out_of_bounds="clip")
                members.append((ranker, iso.fit(ranker.decision_function(Xb), y[idx], sample_weight=w[idx])))
        return members

    # --------------------------------------------------------------- prediction
    def predict_proba(
        self, contexts: Sequence[Mapping[str, Any]], actions: Sequence[str]
    ) -> tuple[np.ndarray, np.ndarray]:
        """(status probabilities ``[n, len(classes_)]``, valid-percentile predictions ``[n]``)
        of scripts assumed to compile (no gate applied here)."""
        if not self.fitted:
            raise RuntimeError("CodeOutcomeModel is not fitted: call fit(records) or load(path)")
        check_batch(contexts, actions)
        X = self.featurizer.transform(contexts, actions)
        with threadpool_limits(limits=self.config.n_threads):
            return self._proba(X), self._percentile(X)

    def _proba(self, X: np.ndarray) -> np.ndarray:
        if self._classifier is None:
            return np.ones((len(X), 1))
        return self._classifier.predict_proba(X[:, self._cls_cols])

    def _percentile(self, X: np.ndarray) -> np.ndarray:
        return self._percentile_spread(X)[0]

    def _percentile_spread(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(mean, spread) of the percentile head's members; spread 0 with one member."""
        members = self._members or ([(self._regressor, None)] if self._regressor is not None else [])
        if not members:
            const = np.nan if self._constant_percentile is None else self._constant_percentile
            return np.full(len(X), const), np.zeros(len(X))
        Xr = X[:, self._reg_cols]
        preds = []
        for est, iso in members:
            p = est.predict(Xr) if iso is None else iso.predict(est.decision_function(Xr))
            preds.append(np.clip(p, 0.0, 1.0))
        # "both": a regressor and a ranker per ensemble member, averaged together
        per = np.asarray(preds).reshape(self.config.n_ensemble, -1, len(X)).mean(axis=1)
        return per.mean(axis=0), per.std(axis=0)

    def predict(self, contexts: Sequence[Mapping[str, Any]], actions: Sequence[Any]) -> list[Outcome | None]:
        """Predicted outcomes, one per (context, script); ``None`` where the model cannot
        score (a ``valid`` prediction while the logs held no valid outcome to learn from)."""
        if not self.fitted:
            raise RuntimeError("CodeOutcomeModel is not fitted: call fit(records) or load(path)")
        check_batch(contexts, actions)
        start = time.perf_counter()
        out: list[Outcome | None] = [None] * len(actions)
        gated = [compile_gate(a) for a in actions]
        todo = [i for i, g in enumerate(gated) if g is None]
        if todo:
            ctx = [contexts[i] for i in todo]
            codes = [actions[i] for i in todo]
            summaries = self.featurizer.summaries(ctx, codes)
            X = self.featurizer.transform(ctx, codes, summaries)
            with threadpool_limits(limits=self.config.n_threads):
                proba, (pct, spread) = self._proba(X), self._percentile_spread(X)
            for row, i in enumerate(todo):
                reading = summaries[row].reading
                if reading is not None and reading.foreseen is not None:
                    out[i] = _foreseen_outcome(*reading.foreseen)
                else:
                    out[i] = self._outcome(proba[row], pct[row], summaries[row], float(spread[row]))
        cost = (time.perf_counter() - start) / max(1, len(actions))
        for i, g in enumerate(gated):
            if g is not None:
                out[i] = g
        return [None if o is None else _with_cost(o, cost) for o in out]

    def _outcome(self, proba: np.ndarray, pct: float, summary: ScriptSummary, spread: float = 0.0) -> Outcome | None:
        p = {s: float(q) for s, q in zip(self.classes_, proba)}
        status = max(p, key=p.__getitem__)
        pct_known = not math.isnan(pct)
        if self.config.score_mode == "argmax":
            score = ladder_score(status, pct if pct_known else None)
        elif "valid" in p and not pct_known:
            score = None
        else:
            # a valid status here has a known percentile, so its ladder score is a number
            score = sum(q * (cast(float, ladder_score(s, pct)) if s == "valid" else LADDER[s]) for s, q in p.items())
        if score is None:
            return None
        metrics: dict[str, Any] = {"p_status": p}
        if pct_known:
            metrics["percentile"] = float(pct)
            metrics["percentile_std"] = spread
        metrics["confidence"] = confidence(p[status], spread if pct_known and status == "valid" else 0.0)
        return Outcome(
            status,
            min(1.0, max(0.0, score)),
            feedback=_feedback(status, p, pct if pct_known else None, summary, min(1.0, max(0.0, score))),
            metrics=metrics,
            source="wm",
        )

    # ------------------------------------------------------------- persistence
    def state_dict(self) -> dict[str, Any]:
        return {
            "format_version": _FORMAT_VERSION,
            "sklearn_version": sklearn.__version__,
            "config": asdict(self.config),
            "featurizer": self.featurizer.state_dict(),
            "classes": list(self.classes_),
            "classifier": self._classifier,
            "regressor": self._regressor,
            "columns": (self._cls_cols, self._reg_cols),
            "constant_percentile": self._constant_percentile,
            "members": self._members,
            "train": self._train,
            "info": self.info,
        }

    def save(self, path: str | Path) -> Path:
        """Write ``model.joblib`` + ``meta.json`` into directory ``path`` (created)."""
        if not self.fitted:
            raise RuntimeError("cannot save an unfitted CodeOutcomeModel")
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        joblib.dump(self.state_dict(), path / "model.joblib", compress=3)
        meta = {
            k: v
            for k, v in self.state_dict().items()
            if k not in ("classifier", "regressor", "columns", "train", "members")
        }
        (path / "meta.json").write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
        return path

    @classmethod
    def load(cls, path: str | Path) -> CodeOutcomeModel:
        """Load a model saved by :meth:`save` (a pickle: only from trusted sources)."""
        file = Path(path) / "model.joblib"
        if not file.is_file():
            raise FileNotFoundError(f"{path} holds no CodeOutcomeModel ({file.name} missing)")
        d = joblib.load(file)
        if d.get("format_version") != _FORMAT_VERSION:
            raise ValueError(f"{file}: format version {d.get('format_version')!r}, this code reads {_FORMAT_VERSION}")
        if d["sklearn_version"] != sklearn.__version__:
            warnings.warn(
                f"{file} was fitted with scikit-learn {d['sklearn_version']}, running {sklearn.__version__}; refit if predictions look off",
                stacklevel=2,
            )
        # saved before size / transfer / landmark features: without them
        old = {"size_features": False, "transfer_features": False, "landmark_features": False, "read_code": False}
        model = cls(CodeOutcomeConfig(**{**old, **d["config"]}))
        model.featurizer = ScriptFeaturizer.from_state_dict(d["featurizer"])
        model.classes_ = list(d["classes"])
        model._classifier, model._regressor = d["classifier"], d["regressor"]
        model._cls_cols, model._reg_cols = d["columns"]
        model._constant_percentile = d["constant_percentile"]
        model._members = list(d.get("members") or [])  # saved before ensembles: the regressor alone
        model._train = d["train"]
        model.info = dict(d["info"])
        return model

    @classmethod
    def load_default(cls) -> CodeOutcomeModel:
        """The model fitted on the shipped leaderboard-pool logs (train-split tasks)."""
        if not (DEFAULT_MODEL_DIR / "model.joblib").is_file():
            raise FileNotFoundError(
                f"no default CodeOutcomeModel shipped at {DEFAULT_MODEL_DIR}; fit one with `wmrl-wm fit`"
            )
        return cls.load(DEFAULT_MODEL_DIR)


def confidence(p_status: float, percentile_std: float, scale: float = 0.1) -> float:
    """Confidence of one prediction in [0, 1]: the probability of the predicted status, shrunk
    by the ensemble's spread of the valid percentile (``exp(-std / scale)``).

    >>> confidence(0.9, 0.0), round(confidence(0.9, 0.1), 3)
    (0.9, 0.331)
    """
    return float(p_status * math.exp(-percentile_std / scale))


def _copy_index(idx: np.ndarray) -> list[int]:
    """For a bootstrap index, which copy of its task each row belongs to (tasks drawn twice
    are two groups, so the ranker never pairs a row with its own duplicate)."""
    seen: dict[int, int] = {}
    out = []
    for i in idx.tolist():
        out.append(seen.get(i, 0))
        seen[i] = seen.get(i, 0) + 1
    return out


def _usable(records: Sequence[LogRecord]) -> list[LogRecord]:
    return [r for r in records if r.known and compile_gate(r.code) is None]


def _logged_outcome(r: LogRecord) -> Outcome:
    """The true outcome of a usable (known) record."""
    assert r.outcome is not None
    return r.outcome


def _foreseen_outcome(status: str, reason: str) -> Outcome:
    """A failure the code reader is certain of: that status's ladder score, no learning involved."""
    return Outcome(
        status,
        LADDER[status],
        feedback=(
            f"Predicted outcome (world model, not executed): most likely {status}, foreseen from the code: "
            f"{reason}; predicted reward {LADDER[status]:.2f}."
        ),
        metrics={"p_status": {status: 1.0}, "foreseen": reason, "confidence": 1.0},
        source="wm",
    )


def _with_cost(o: Outcome, cost: float) -> Outcome:
    return Outcome(o.status, o.score, o.feedback, o.metrics, cost, "wm")


def _feedback(status: str, p: Mapping[str, float], pct: float | None, s: ScriptSummary, score: float) -> str:
    """The prediction in words, consistent with its status and score: the most likely status,
    the reward the prediction stands for, and the static findings worded as what they imply
    for that status (a "valid" guess for a script with no visible write of submission.csv
    says that without the file it scores as no_submission, rather than contradicting itself).

    >>> from types import SimpleNamespace
    >>> s = SimpleNamespace(bad_imports=[], undefined_names=[], counts={})
    >>> print(_feedback("valid", {"valid": 0.57, "no_submission": 0.43}, 0.3, s, 0.45))  # doctest: +NORMALIZE_WHITESPACE
    Predicted outcome (world model, not executed): most likely valid (probability 0.57; no_submission 0.43); predicted reward 0.45.
    If valid: expected leaderboard percentile about 0.30.
    No write of submission.csv was found in the script: if it writes none, the run is no_submission (reward 0.2).
    """
    others = sorted(((q, k) for k, q in p.items() if k != status and q >= 0.05), reverse=True)[:3]
    alternatives = "".join(f"; {k} {q:.2f}" for q, k in others)
    lines = [
        f"Predicted outcome (world model, not executed): most likely {status} "
        f"(probability {p[status]:.2f}{alternatives}); predicted reward {score:.2f}."
    ]
    if status == "valid" and pct is not None:
        lines.append(f"If valid: expected leaderboard percentile about {pct:.2f}.")
    if s.bad_imports:
        lines.append(f"Imports the sandbox cannot satisfy: {', '.join(sorted(set(s.bad_imports)))}.")
    if s.undefined_names:
        lines.append(f"Names used but never defined: {', '.join(s.undefined_names[:8])}.")
    if not s.counts.get("writes_submission"):
        if status == "valid":
            lines.append(
                "No write of submission.csv was found in the script: if it writes none, the run is "
                f"no_submission (reward {LADDER['no_submission']:g})."
            )
        else:
            lines.append("The script does not appear to write submission.csv.")
    return " ".join(lines)
