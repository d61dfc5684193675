"""How faithful is a world model? A report on held-out execution logs.

For each held-out record the world model predicts an outcome; the report compares it with
the logged true outcome:

* ``status_accuracy`` — predicted status equals the true one (records the model scored);
  the same on the records whose run died of a resource limit, memory
  (``memory_failure_status_accuracy``: true outcome ``runtime_error`` with
  ``metrics["exec_status"] == "killed_memory"``) and time (``time_failure_status_accuracy``:
  true status ``timeout``), with their counts -- does the model see a crash coming that only
  the table's size explains?
* ``spearman`` — rank correlation of predicted vs true score, pooled, and
  ``spearman_within_group`` — the mean over groups (same task) of the within-group rank
  correlation, which is what group-relative advantages (GRPO) see (also among records
  whose true status is ``valid`` only: ranking working solutions is the hard part);
* ``bias`` and ``residual_var`` of the **within-group centred** residual
  ``e = (w - mean_g w) - (t - mean_g t)`` (w: world-model score, t: true score, g: the
  record's group). Centring removes any per-group offset, which GRPO cancels anyway. The
  systematic part is estimated by binning records on their true score (quantile bins):
  ``bias = sqrt(sum_b n_b * mean_b(e)^2 / N)`` is the RMS of the conditional mean of
  ``e`` given the truth (the paper's bias B), ``residual_var = mean((e - mean_b(e))^2)``
  what remains (its noise sigma^2); ``bias^2 + residual_var`` is the mean squared centred
  residual;
* the same after **calibration**: an isotonic map (true score on world-model score) is
  fitted on a calibration part of the records and applied to the rest, the evaluation
  part, where every number above is computed (``*_after``), as Online Debiasing would.

Classes: :class:`FidelityReport`. Functions: :func:`evaluate_fidelity`,
:func:`evaluate_fidelity_halves`, :func:`fidelity_from_scores`, :func:`centred_bias`, :func:`markdown_table`, :func:`failure_kind`.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any

import numpy as np
from scipy.stats import spearmanr
from sklearn.isotonic import IsotonicRegression
from tqdm.auto import tqdm

from wmrl_envs.world_models.base import WorldModel
from wmrl_envs.world_models.logs import LogRecord

__all__ = [
    "FidelityReport",
    "evaluate_fidelity",
    "fidelity_from_scores",
    "centred_bias",
    "markdown_table",
    "evaluate_fidelity_halves",
    "failure_kind",
    "outcome_kind",
    "pairwise_accuracy",
]


@dataclass(frozen=True)
class FidelityReport:
    """Fidelity numbers of one world model on one set of records (see the module docstring).

    Every metric is ``None`` when it cannot be computed (too few records / groups, constant
    scores), never 0.
    """

    name: str
    n_records: int
    n_groups: int
    n_calibration: int
    n_eval: int
    coverage: float | None
    status_accuracy: float | None
    n_memory_failures: int
    memory_failure_status_accuracy: float | None
    n_time_failures: int
    time_failure_status_accuracy: float | None
    spearman: float | None
    spearman_within_group: float | None
    spearman_within_group_valid: float | None
    bias_before: float | None
    bias_after: float | None
    residual_var_before: float | None
    residual_var_after: float | None
    mae_before: float | None
    mae_after: float | None
    pairwise_accuracy: float | None = None
    status_accuracy_by_kind: dict[str, dict[str, Any]] | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_markdown(self) -> str:
        return markdown_table([self])


_LABELS = {
    "n_records": "records", "n_groups": "groups (tasks)", "n_calibration": "calibration part",
    "n_eval": "evaluation part", "coverage": "coverage (score known)", "status_accuracy": "status accuracy",
    "n_memory_failures": "runs out of memory (true)", "memory_failure_status_accuracy": "status accuracy, runs out of memory",
    "n_time_failures": "runs out of time (true)", "time_failure_status_accuracy": "status accuracy, runs out of time",
    "spearman": "Spearman (pooled)", "spearman_within_group": "Spearman (within group, mean)",
    "spearman_within_group_valid": "Spearman (within group, truly valid only)",
    "bias_before": "centred bias B, raw", "bias_after": "centred bias B, calibrated",
    "residual_var_before": "residual variance, raw", "residual_var_after": "residual variance, calibrated",
    "mae_before": "mean abs. error, raw", "mae_after": "mean abs. error, calibrated",
    "pairwise_accuracy": "pairwise accuracy (within group)",
}  # fmt: skip


def markdown_table(reports: Sequence[FidelityReport]) -> str:
    """One Markdown table, one column per report."""
    head = "| metric | " + " | ".join(r.name for r in reports) + " |"
    lines = [head, "|---|" + "---:|" * len(reports)]
    for f in fields(FidelityReport):
        if f.name in ("name", "status_accuracy_by_kind"):
            continue
        cells = []
        for r in reports:
            v = getattr(r, f.name)
            cells.append("n/a" if v is None else str(v) if isinstance(v, int) else f"{v:.4f}")
        lines.append(f"| {_LABELS[f.name]} | " + " | ".join(cells) + " |")
    kinds = sorted({k for r in reports for k in (r.status_accuracy_by_kind or {})})
    for kind in kinds:  # what truly happened: memory, time, import, invalid submission, ...
        cells = []
        for r in reports:
            d = (r.status_accuracy_by_kind or {}).get(kind)
            acc = None if d is None else d["status_accuracy"]
            cells.append("n/a" if d is None or acc is None else f"{acc:.4f} (n={d['n']})")
        lines.append(f"| status accuracy, true outcome {kind} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _spearman(a: np.ndarray, b: np.ndarray) -> float | None:
    if len(a) < 3 or np.ptp(a) == 0 or np.ptp(b) == 0:
        return None
    return float(spearmanr(a, b).statistic)


def _within_spearman(w: np.ndarray, t: np.ndarray, groups: Sequence[Hashable]) -> float | None:
    """Mean over groups of the within-group Spearman (groups where it is defined)."""
    rhos = []
    for key in dict.fromkeys(groups):
        m = np.array([x == key for x in groups], dtype=bool)
        rho = _spearman(w[m], t[m])
        if rho is not None and not math.isnan(rho):
            rhos.append(rho)
    return float(np.mean(rhos)) if rhos else None


def centred_bias(
    wm: Sequence[float] | np.ndarray, truth: Sequence[float] | np.ndarray, groups: Sequence[Hashable], n_bins: int = 10
) -> tuple[float | None, float | None]:
    """(bias, residual variance) of the within-group centred residual (module docstring).

    Groups with fewer than two members carry no within-group information and are skipped.

    >>> b, v = centred_bias([0.1, 0.3, 0.2, 0.6], [0.0, 0.2, 0.1, 0.5], ["a", "a", "b", "b"])
    >>> round(b, 6), round(v, 6)  # a constant offset per group is not bias
    (0.0, 0.0)
    """
    w, t = np.asarray(wm, dtype=float), np.asarray(truth, dtype=float)
    ids = {key: i for i, key in enumerate(dict.fromkeys(groups))}
    g = np.asarray([ids[x] for x in groups], dtype=int)
    if not (len(w) == len(t) == len(g)):
        raise ValueError(f"wm, truth and groups differ in length: {len(w)}, {len(t)}, {len(g)}")
    keep = np.zeros(len(w), dtype=bool)
    e = np.zeros(len(w))
    for key in np.unique(g):
        idx = np.flatnonzero(g == key)
        if len(idx) < 2:
            continue
        keep[idx] = True
        e[idx] = (w[idx] - w[idx].mean()) - (t[idx] - t[idx].mean())
    if keep.sum() < 2:
        return None, None
    e, t = e[keep], t[keep]
    edges = np.unique(np.quantile(t, np.linspace(0, 1, n_bins + 1)))
    bins = np.clip(np.searchsorted(edges, t, side="right") - 1, 0, max(0, len(edges) - 2))
    means = np.zeros(len(e))
    for b in np.unique(bins):
        means[bins == b] = e[bins == b].mean()
    return float(math.sqrt(np.mean(means**2))), float(np.mean((e - means) ** 2))


def fidelity_from_scores(
    wm_scores: Sequence[float | None],
    true_scores: Sequence[float],
    groups: Sequence[Hashable],
    wm_status: Sequence[str | None] | None = None,
    true_status: Sequence[str] | None = None,
    failure_kinds: Sequence[str | None] | None = None,
    detail_kinds: Sequence[str] | None = None,
    *,
    calibration_fraction: float = 0.5,
    seed: int = 0,
    n_bins: int = 10,
    name: str = "world model",
) -> FidelityReport:
    """The report from scores directly (``None`` world-model scores = not covered).

    The calibration part is a seeded random ``calibration_fraction`` of the covered
    records; with ``calibration_fraction=0`` no calibration is done (``*_after`` is None).
    ``failure_kinds``: per record ``"memory"`` / ``"time"`` when the true run died of that
    limit, else ``None`` (for the per-failure status accuracies). ``detail_kinds``: per
    record :func:`outcome_kind` of the truth, for ``status_accuracy_by_kind``.
    """
    n = len(true_scores)
    if not (len(wm_scores) == n == len(groups)):
        raise ValueError(f"wm_scores, true_scores and groups differ in length: {len(wm_scores)}, {n}, {len(groups)}")
    if not 0.0 <= calibration_fraction < 1.0:
        raise ValueError(f"calibration_fraction must be in [0, 1), got {calibration_fraction}")
    covered = np.array([s is not None for s in wm_scores])
    accuracy = None
    kind_accuracy: dict[str, float | None] = {"memory": None, "time": None}
    kinds = list(failure_kinds) if failure_kinds is not None else [None] * n
    if len(kinds) != n:
        raise ValueError(f"failure_kinds has {len(kinds)} entries for {n} records")
    if wm_status is not None and true_status is not None:
        hits = [a == b for a, b, c in zip(wm_status, true_status, covered) if c]
        accuracy = float(np.mean(hits)) if hits else None
        for kind in kind_accuracy:
            hits = [a == b for a, b, c, k in zip(wm_status, true_status, covered, kinds) if c and k == kind]
            kind_accuracy[kind] = float(np.mean(hits)) if hits else None
    by_kind = None
    if detail_kinds is not None and wm_status is not None and true_status is not None:
        by_kind = {}
        for kind in sorted(set(detail_kinds)):
            hits = [a == b for a, b, c, k in zip(wm_status, true_status, covered, detail_kinds) if c and k == kind]
            by_kind[kind] = {"n": len(hits), "status_accuracy": float(np.mean(hits)) if hits else None}
    idx = np.flatnonzero(covered)
    w = np.array([wm_scores[int(i)] for i in idx], dtype=np.float64)
    t = np.array([true_scores[int(i)] for i in idx], dtype=np.float64)
    g = [groups[int(i)] for i in idx]
    rng = np.random.default_rng(seed)
    perm = rng.permutation(len(idx))
    n_cal = int(round(calibration_fraction * len(idx)))
    cal, ev = np.sort(perm[:n_cal]), np.sort(perm[n_cal:])
    w_ev, t_ev, g_ev = w[ev], t[ev], [g[i] for i in ev]
    w_cal_ev = None
    if n_cal >= 2 and len(ev):
        iso = IsotonicRegression(y_min=0.0, y_max=1.0, out_of_bounds="clip").fit(w[cal], t[cal])
        w_cal_ev = iso.predict(w_ev)
    valid_ev = None
    if true_status is not None:
        st = [true_status[int(i)] for i in idx]
        valid_ev = np.array([st[i] == "valid" for i in ev], dtype=bool)
    bias_b, var_b = centred_bias(w_ev, t_ev, g_ev, n_bins) if len(ev) else (None, None)
    bias_a, var_a = centred_bias(w_cal_ev, t_ev, g_ev, n_bins) if w_cal_ev is not None else (None, None)
    return FidelityReport(
        name=name,
        n_records=n,
        n_groups=len(set(groups)),
        n_calibration=n_cal,
        n_eval=len(ev),
        coverage=float(covered.mean()) if n else None,
        status_accuracy=accuracy,
        n_memory_failures=sum(k == "memory" for k in kinds),
        memory_failure_status_accuracy=kind_accuracy["memory"],
        n_time_failures=sum(k == "time" for k in kinds),
        time_failure_status_accuracy=kind_accuracy["time"],
        spearman=_spearman(w_ev, t_ev),
        spearman_within_group=_within_spearman(w_ev, t_ev, g_ev),
        spearman_within_group_valid=_within_spearman(
            w_ev[valid_ev], t_ev[valid_ev], [x for x, v in zip(g_ev, valid_ev) if v]
        )
        if valid_ev is not None
        else None,
        bias_before=bias_b,
        bias_after=bias_a,
        residual_var_before=var_b,
        residual_var_after=var_a,
        mae_before=float(np.mean(np.abs(w_ev - t_ev))) if len(ev) else None,
        mae_after=float(np.mean(np.abs(w_cal_ev - t_ev))) if w_cal_ev is not None else None,
        pairwise_accuracy=pairwise_accuracy(w_ev, t_ev, g_ev),
        status_accuracy_by_kind=by_kind,
    )


def pairwise_accuracy(w: np.ndarray, t: np.ndarray, groups: Sequence[Hashable]) -> float | None:
    """Share of within-group pairs with different true scores that ``w`` orders the same way
    (a tie in ``w`` counts one half); ``None`` without such pairs.

    >>> pairwise_accuracy(np.array([0.1, 0.2, 0.3]), np.array([1.0, 2.0, 3.0]), ["a", "a", "a"])
    1.0
    """
    hits, n = 0.0, 0
    for key in dict.fromkeys(groups):
        m = np.array([x == key for x in groups], dtype=bool)
        wg, tg = w[m], t[m]
        dt = np.sign(tg[:, None] - tg[None, :])
        dw = np.sign(wg[:, None] - wg[None, :])
        upper = np.triu(np.ones_like(dt, dtype=bool), k=1) & (dt != 0)
        n += int(upper.sum())
        hits += float((dw[upper] == dt[upper]).sum()) + 0.5 * float((dw[upper] == 0).sum())
    return hits / n if n else None


def outcome_kind(outcome: Any) -> str:
    """What happened in a true run, finer than its status: ``valid``, ``memory``, ``time``,
    ``import``, ``invalid_submission``, ``no_submission``, ``syntax_error``, ``runtime_error``.

    >>> from wmrl_envs.outcome import Outcome
    >>> outcome_kind(Outcome("runtime_error", 0.1, feedback="ModuleNotFoundError: No module named 'catboost'"))
    'import'
    """
    status = outcome.status
    feedback = str(outcome.feedback or "")
    metrics = outcome.metrics if isinstance(outcome.metrics, dict) else {}
    if status == "timeout":
        return "time"
    if status == "runtime_error":
        if (
            metrics.get("exec_status") == "killed_memory"
            or "MemoryError" in feedback
            or "Unable to allocate" in feedback
        ):
            return "memory"
        if "ModuleNotFoundError" in feedback or "ImportError" in feedback:
            return "import"
        return "runtime_error"
    if status == "no_submission":
        return "invalid_submission" if metrics.get("invalid_reason") else "no_submission"
    return str(status)


def failure_kind(outcome: Any) -> str | None:
    """``"memory"`` / ``"time"`` if a true outcome is a run killed by that limit, else ``None``.

    >>> from wmrl_envs.outcome import Outcome
    >>> failure_kind(Outcome("runtime_error", 0.1, metrics={"exec_status": "killed_memory"})), failure_kind(Outcome("timeout", 0.1))
    ('memory', 'time')
    """
    if outcome is None:
        return None
    if outcome.status == "timeout":
        return "time"
    metrics = outcome.metrics if isinstance(outcome.metrics, dict) else {}
    if outcome.status == "runtime_error" and metrics.get("exec_status") == "killed_memory":
        return "memory"
    return None


def _true_score(r: LogRecord) -> float:
    """The logged score of a record known to have one (``r.known``)."""
    assert r.outcome is not None and r.outcome.score is not None
    return r.outcome.score


def _true_status(r: LogRecord) -> str:
    assert r.outcome is not None
    return r.outcome.status


def evaluate_fidelity(
    model: WorldModel,
    records: Sequence[LogRecord],
    *,
    calibration_fraction: float = 0.5,
    seed: int = 0,
    n_bins: int = 10,
    batch_size: int = 256,
    name: str | None = None,
    progress: bool = False,
) -> FidelityReport:
    """Predict every record's outcome with ``model`` and report against the logged truth.

    Records with an unknown true score are skipped; groups are tasks (``task_id``).
    """
    return evaluate_fidelity_halves(
        model, records, [seed], calibration_fraction=calibration_fraction, n_bins=n_bins,
        batch_size=batch_size, name=name, progress=progress,
    )[0]  # fmt: skip


def evaluate_fidelity_halves(
    model: WorldModel,
    records: Sequence[LogRecord],
    seeds: Sequence[int],
    *,
    calibration_fraction: float = 0.5,
    n_bins: int = 10,
    batch_size: int = 256,
    name: str | None = None,
    progress: bool = False,
) -> list[FidelityReport]:
    """:func:`evaluate_fidelity` with one report per seed of the calibration / evaluation
    split, from one prediction of every record (on a few tasks one half is noisy)."""
    records = [r for r in records if r.known]
    if not records:
        raise ValueError("evaluate_fidelity needs records with known true scores, got none")
    preds = []
    starts = range(0, len(records), batch_size)
    for s in tqdm(starts, desc="fidelity", disable=not progress):
        chunk = records[s : s + batch_size]
        preds += model.predict([r.context for r in chunk], [r.code for r in chunk])
    columns = (
        [None if p is None else p.score for p in preds],
        [_true_score(r) for r in records],
        [r.task_id for r in records],
        [None if p is None else p.status for p in preds],
        [_true_status(r) for r in records],
        [failure_kind(r.outcome) for r in records],
        [outcome_kind(r.outcome) for r in records],
    )
    return [
        fidelity_from_scores(
            *columns,
            calibration_fraction=calibration_fraction,
            seed=seed,
            n_bins=n_bins,
            name=name or type(model).__name__,
        )  # fmt: skip
        for seed in seeds
    ]
