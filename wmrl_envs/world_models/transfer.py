"""Does a world model generalise to tables it has never seen? Evaluation by task, never by row.

* :func:`ranking_metrics` -- the numbers on one set of predictions: within-task Spearman (mean
  over tasks; all records, and truly valid ones only), **pairwise accuracy** (the ForeAgent
  measure: of two solutions of the same task with different true scores, how often the
  world model puts the better one first; ties in the prediction count one half), status
  accuracy overall and per true status, on runs killed by the memory / time limit, and
  calibration errors (top-label ECE of the status probabilities, ECE of the score);
* :func:`leave_tasks_out` -- out-of-fold predictions of a model fitted on the *other*
  datasets' tasks (grouped K-fold: every task of one dataset is in the same fold);
* :func:`learning_curve` -- the same metrics on fixed held-out tasks for models fitted on
  random subsets of ``n`` training tasks (does more data help, and how fast?).

``tier_of`` names a record's tier: ``small`` / ``full`` for catalog tasks, ``corpus`` for the
grown corpus (:mod:`wmrl_envs.world_models.corpus`).

>>> pairwise_accuracy([0.1, 0.2, 0.3], [0.0, 0.5, 1.0]), pairwise_accuracy([0.3, 0.2, 0.1], [0.0, 0.5, 1.0])
(1.0, 0.0)

* :func:`anchor_preference_simulation` -- are anchor groups chosen by low world-model
  confidence more useful calibration pairs than random ones?
* :func:`template_transfer` -- how well can *any* predictor rank a table's solutions from
  other tables? Out-of-fold scores of each pool template from the same template's scores on
  other datasets, knowing nothing of the new table (the template prior) or knowing the true
  scores of a few "landmark" templates executed on it (an oracle no world model has). It
  bounds what ranking by transfer can reach at a given number of training tasks.

Functions: :func:`pairwise_accuracy`, :func:`expected_calibration_error`, :func:`ranking_metrics`,
:func:`leave_tasks_out`, :func:`learning_curve`, :func:`tier_of`, :func:`anchor_preference_simulation`,
:func:`dataset_folds`, :func:`template_transfer`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any

import numpy as np
from scipy.stats import spearmanr
from tqdm.auto import tqdm

from wmrl_envs.outcome import Outcome
from wmrl_envs.world_models.base import WorldModel
from wmrl_envs.world_models.corpus import dataset_of
from wmrl_envs.world_models.fidelity import failure_kind
from wmrl_envs.world_models.logs import LogRecord

__all__ = [
    "pairwise_accuracy",
    "expected_calibration_error",
    "ranking_metrics",
    "leave_tasks_out",
    "learning_curve",
    "tier_of",
    "predict_records",
    "anchor_preference_simulation",
    "dataset_folds",
    "template_transfer",
]

FitFn = Callable[[Sequence[LogRecord]], WorldModel]


def tier_of(record: LogRecord) -> str:
    """``corpus`` for grown-corpus records, else the catalog tier (``small`` / ``full``) by table size.

    >>> tier_of(LogRecord("t", "", {"meta": {"n_train": 28000}}, None)), tier_of(LogRecord("t", "", {}, None, origin="corpus-pool"))
    ('full', 'corpus')
    """
    if record.origin == "corpus-pool":
        return "corpus"
    meta = record.context.get("meta", {})
    n = meta.get("n_train") if isinstance(meta, Mapping) else None
    return "full" if isinstance(n, (int, float)) and n >= 10000 else "small"


def pairwise_accuracy(pred: Sequence[float] | np.ndarray, truth: Sequence[float] | np.ndarray) -> float | None:
    """Share of pairs with different true scores that ``pred`` orders correctly (ties: 1/2)."""
    w, t = np.asarray(pred, dtype=float), np.asarray(truth, dtype=float)
    dt = t[:, None] - t[None, :]
    dw = w[:, None] - w[None, :]
    mask = dt > 0
    n = int(mask.sum())
    if n == 0:
        return None
    right = (dw[mask] > 0).sum() + 0.5 * (dw[mask] == 0).sum()
    return float(right / n)


def expected_calibration_error(
    confidence: Sequence[float] | np.ndarray, correct: Sequence[float] | np.ndarray, n_bins: int = 10
) -> float | None:
    """Weighted mean |mean confidence - mean outcome| over equal-width confidence bins.

    >>> expected_calibration_error([0.9, 0.9, 0.1, 0.1], [1, 1, 0, 0])
    0.1
    """
    p, y = np.asarray(confidence, dtype=float), np.asarray(correct, dtype=float)
    if len(p) == 0:
        return None
    bins = np.clip((p * n_bins).astype(int), 0, n_bins - 1)
    err = sum(abs(p[bins == b].mean() - y[bins == b].mean()) * (bins == b).sum() for b in np.unique(bins))
    return round(float(err / len(p)), 12)


def _within(
    fn: Callable[[np.ndarray, np.ndarray], float | None], w: np.ndarray, t: np.ndarray, groups: Sequence[Hashable]
) -> tuple[float | None, dict[str, float]]:
    per: dict[str, float] = {}
    g = np.asarray([str(x) for x in groups])
    for key in dict.fromkeys(g.tolist()):
        m = g == key
        v = fn(w[m], t[m])
        if v is not None and not math.isnan(v):
            per[key] = float(v)
    return (float(np.mean(list(per.values()))) if per else None), per


def _spearman(w: np.ndarray, t: np.ndarray) -> float | None:
    if len(w) < 3 or np.ptp(w) == 0 or np.ptp(t) == 0:
        return None
    return float(spearmanr(w, t).statistic)


def ranking_metrics(predictions: Sequence[Outcome | None], records: Sequence[LogRecord]) -> dict[str, Any]:
    """Every transfer number of ``predictions`` against the records' logged truth (module docstring).

    Records without a known true score are ignored; a ``None`` prediction counts against
    coverage and is left out of the rest.
    """
    pairs = [(p, r) for p, r in zip(predictions, records, strict=True) if r.known]
    covered = [(p, r) for p, r in pairs if p is not None and p.score is not None]
    out: dict[str, Any] = {
        "n_records": len(pairs),
        "n_tasks": len({r.task_id for _, r in pairs}),
        "coverage": len(covered) / len(pairs) if pairs else None,
    }
    if not covered:
        return out
    w = np.array([p.score for p, _ in covered], dtype=float)
    truth = [r.outcome for _, r in covered if r.outcome is not None]
    t = np.array([float(o.score or 0.0) for o in truth])
    g = [r.task_id for _, r in covered]
    true_status = np.array([o.status for o in truth])
    pred_status = np.array([p.status for p, _ in covered])
    valid = true_status == "valid"
    out["spearman_within_task"], per_task = _within(_spearman, w, t, g)
    out["spearman_within_task_valid"], _ = _within(_spearman, w[valid], t[valid], [x for x, v in zip(g, valid) if v])
    out["pairwise_accuracy"], per_pair = _within(pairwise_accuracy, w, t, g)
    out["pairwise_accuracy_valid"], _ = _within(
        pairwise_accuracy, w[valid], t[valid], [x for x, v in zip(g, valid) if v]
    )
    out["status_accuracy"] = float((pred_status == true_status).mean())
    out["status_accuracy_by_status"] = {
        s: {"n": int((true_status == s).sum()), "accuracy": float((pred_status[true_status == s] == s).mean())}
        for s in sorted(set(true_status.tolist()))
    }
    kinds = np.array([failure_kind(r.outcome) or "" for _, r in covered])
    for kind in ("memory", "time"):
        m = kinds == kind
        out[f"n_{kind}_failures"] = int(m.sum())
        out[f"{kind}_failure_status_accuracy"] = float((pred_status[m] == true_status[m]).mean()) if m.any() else None
    top = [max(p.metrics.get("p_status", {p.status: 1.0}).values()) for p, _ in covered]
    out["status_ece"] = expected_calibration_error(top, (pred_status == true_status).astype(float))
    out["score_ece"] = expected_calibration_error(np.clip(w, 0, 1), t)
    out["mae"] = float(np.mean(np.abs(w - t)))
    out["per_task_spearman"] = per_task
    out["per_task_pairwise_accuracy"] = per_pair
    has = np.array([isinstance(p.metrics.get("confidence"), (int, float)) for p, _ in covered])
    if has.sum() >= 3:  # the compile gate's exact outcomes carry no confidence
        c = np.array(
            [
                float(p.metrics["confidence"])
                for p, _ in covered
                if isinstance(p.metrics.get("confidence"), (int, float))
            ]
        )
        # > 0: the less confident a prediction, the larger its error (what anchor preference needs)
        out["confidence_vs_error_spearman"] = _spearman(-c, np.abs(w - t)[has])
        out["mean_confidence"] = float(c.mean())
    return out


def predict_records(model: WorldModel, records: Sequence[LogRecord], batch_size: int = 512) -> list[Outcome | None]:
    """``model.predict`` over ``records`` in batches."""
    out: list[Outcome | None] = []
    for s in range(0, len(records), batch_size):
        chunk = records[s : s + batch_size]
        out += model.predict([r.context for r in chunk], [r.code for r in chunk])
    return out


def dataset_folds(records: Sequence[LogRecord], n_folds: int = 5, seed: int = 0) -> list[int]:
    """Each record's fold: datasets are dealt into ``n_folds`` folds in a seeded random order
    (every task of one dataset in the same fold).

    >>> dataset_folds([LogRecord("diamonds_cut", "", {}, None), LogRecord("diamonds_price", "", {}, None)], 2)
    [0, 0]
    """
    datasets = sorted({dataset_of(r.task_id, r.context) for r in records})
    rng = np.random.default_rng(seed)
    fold_of = {d: i % n_folds for i, d in enumerate(rng.permutation(datasets).tolist())}
    return [fold_of[dataset_of(r.task_id, r.context)] for r in records]


def leave_tasks_out(
    records: Sequence[LogRecord],
    fit: FitFn,
    *,
    n_folds: int = 5,
    seed: int = 0,
    evaluate: Callable[[LogRecord], bool] | None = None,
    progress: bool = True,
) -> list[Outcome | None]:
    """Out-of-fold predictions for every record: datasets are dealt into ``n_folds`` folds
    (seeded), and each fold's records are predicted by a model fitted on every other fold.

    ``evaluate``: only folds holding at least one record it accepts are fitted (others get
    ``None``), e.g. to score only catalog tasks while training on everything else.
    """
    folds = dataset_folds(records, n_folds, seed)
    preds: list[Outcome | None] = [None] * len(records)
    for k in tqdm(range(n_folds), desc="leave-tasks-out", disable=not progress):
        test = [i for i, f in enumerate(folds) if f == k and (evaluate is None or evaluate(records[i]))]
        if not test:
            continue
        model = fit([r for r, f in zip(records, folds) if f != k])
        for i, p in zip(test, predict_records(model, [records[i] for i in test])):
            preds[i] = p
    return preds


def learning_curve(
    train: Sequence[LogRecord],
    test: Sequence[LogRecord],
    fit: FitFn,
    sizes: Sequence[int],
    *,
    repeats: int = 3,
    seed: int = 0,
    progress: bool = True,
) -> list[dict[str, Any]]:
    """Metrics on ``test`` of models fitted on ``repeats`` random subsets of ``n`` training
    *tasks* (whole datasets' worth of records, never rows), for each ``n`` in ``sizes``."""
    tasks = sorted({r.task_id for r in train})
    rng = np.random.default_rng(seed)
    rows = []
    plan = [(n, rep) for n in sizes for rep in range(repeats if n < len(tasks) else 1)]
    for n, rep in tqdm(plan, desc="learning curve", disable=not progress):
        pick = set(rng.permutation(tasks)[: min(n, len(tasks))].tolist())
        model = fit([r for r in train if r.task_id in pick])
        m = ranking_metrics(predict_records(model, test), test)
        rows.append({"n_tasks": len(pick), "repeat": rep, **{k: v for k, v in m.items() if not k.startswith("per_")}})
    return rows


def anchor_preference_simulation(
    predictions: Sequence[Outcome | None],
    records: Sequence[LogRecord],
    *,
    steps: int = 20,
    groups_per_step: int = 10,
    group_size: int = 4,
    anchors_per_step: int = 1,
    seeds: Sequence[int] = (0, 1, 2, 3, 4),
) -> dict[str, Any]:
    """Random vs low-confidence anchor choice, on logged truth and (out-of-fold) predictions.

    Each step draws ``groups_per_step`` GRPO-like groups (a random task, ``group_size`` of
    its logged solutions); ``anchors_per_step`` of them become anchors -- at random, or the
    ones with the lowest mean ``metrics["confidence"]`` -- and give (world-model score,
    true score) pairs. After ``steps`` steps an isotonic map (true on world-model score)
    is fitted on the pairs and applied to every record; the result is its mean absolute
    error and the within-task centred bias (see :func:`~wmrl_envs.world_models.fidelity.centred_bias`)
    -- lower means the pairs were more useful. Mean over ``seeds``.
    """
    from sklearn.isotonic import IsotonicRegression

    from wmrl_envs.world_models.fidelity import centred_bias

    keep = [
        (p, r)
        for p, r in zip(predictions, records, strict=True)
        if r.known and p is not None and p.score is not None and isinstance(p.metrics.get("confidence"), (int, float))
    ]
    if not keep:
        raise ValueError("anchor_preference_simulation needs predictions with metrics['confidence']")
    w = np.array([p.score for p, _ in keep], dtype=float)
    t = np.array([float(r.outcome.score or 0.0) for _, r in keep if r.outcome is not None])
    conf = np.array([float(p.metrics["confidence"]) for p, _ in keep])
    tasks = [r.task_id for _, r in keep]
    by_task: dict[str, list[int]] = {}
    for i, task in enumerate(tasks):
        by_task.setdefault(task, []).append(i)
    names = sorted(by_task)
    out: dict[str, Any] = {}
    for policy in ("random", "low_confidence"):
        maes, biases = [], []
        for seed in seeds:
            rng = np.random.default_rng(seed)  # same groups for both policies
            pairs: list[int] = []
            for _ in range(steps):
                groups = []
                for _ in range(groups_per_step):
                    members = by_task[names[int(rng.integers(len(names)))]]
                    groups.append(rng.choice(members, size=min(group_size, len(members)), replace=False))
                order = rng.permutation(len(groups))
                if policy == "low_confidence":
                    order = np.argsort([conf[g].mean() for g in groups], kind="stable")
                for k in order[:anchors_per_step]:
                    pairs += groups[int(k)].tolist()
            iso = IsotonicRegression(y_min=0.0, y_max=1.0, out_of_bounds="clip").fit(w[pairs], t[pairs])
            cal = iso.predict(w)
            maes.append(float(np.mean(np.abs(cal - t))))
            biases.append(centred_bias(cal, t, tasks)[0])
        out[policy] = {
            "mae_after": float(np.mean(maes)),
            "centred_bias_after": float(np.mean([b for b in biases if b is not None])),
        }
    out["raw"] = {"mae": float(np.mean(np.abs(w - t))), "centred_bias": centred_bias(w, t, tasks)[0]}
    out["setting"] = {
        "steps": steps,
        "groups_per_step": groups_per_step,
        "group_size": group_size,
        "anchors_per_step": anchors_per_step,
        "seeds": list(seeds),
    }
    return out


def template_transfer(
    records: Sequence[LogRecord],
    landmarks: Sequence[str] = (),
    *,
    n_folds: int = 5,
    seed: int = 0,
    alpha: float = 1.0,
) -> list[float | None]:
    """Out-of-fold score of each pool-template record, transferred from other datasets.

    A record's prediction uses only tasks in other folds (:func:`dataset_folds`) of the same
    ``task_type`` on which its template (``solution_id``) was run. With no ``landmarks`` it is
    the template's mean score there (the *template prior*: what a model that knows the
    solution but nothing about the new table can do). With landmarks it is a ridge
    regression (``alpha``), across those tasks, of the template's score on the landmark
    templates' true scores, applied to the landmarks' true scores on the record's own task:
    an **oracle** that has executed the landmarks on the new table. Landmark records
    themselves, and records with no such training task, get ``None``.

    >>> def rec(task, sid, score):
    ...     return LogRecord(task, "", {"meta": {"task_type": "binary"}}, Outcome("valid", score), solution_id=sid)
    >>> recs = [rec(f"t{i}", s, v) for i in range(4) for s, v in (("a", 0.2 * i), ("b", 0.9 - 0.2 * i))]
    >>> [round(p, 3) if p is not None else p for p in template_transfer(recs, n_folds=4)][:2]
    [0.4, 0.5]
    """
    from sklearn.linear_model import Ridge

    folds = dataset_folds(records, n_folds, seed)
    scores: dict[str, dict[str, float]] = {}
    fold_of: dict[str, int] = {}
    kind_of: dict[str, Any] = {}
    for r, f in zip(records, folds, strict=True):
        if r.known and r.outcome is not None and r.solution_id:
            scores.setdefault(r.task_id, {})[r.solution_id] = float(r.outcome.score or 0.0)
            fold_of[r.task_id] = f
            kind_of[r.task_id] = r.context.get("meta", {}).get("task_type")
    marks = list(landmarks)
    out: list[float | None] = []
    for r, f in zip(records, folds, strict=True):
        own = scores.get(r.task_id, {})
        donors = [
            u
            for u, s in scores.items()
            if fold_of[u] != f
            and kind_of[u] == kind_of.get(r.task_id)
            and r.solution_id in s
            and all(m in s for m in marks)
        ]
        if r.solution_id in marks or not donors or not all(m in own for m in marks):
            out.append(None)
            continue
        y = np.array([scores[u][r.solution_id] for u in donors])
        if not marks:
            out.append(float(y.mean()))
            continue
        x = np.array([[scores[u][m] for m in marks] for u in donors])
        model = Ridge(alpha=alpha).fit(x, y)
        out.append(float(model.predict(np.array([[own[m] for m in marks]]))[0]))
    return out
