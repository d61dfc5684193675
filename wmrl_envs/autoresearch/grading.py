"""Grading an AutoResearch solution: run it, validate its submission, score, rank, reward.

The reward ladder (DESIGN.md, from the paper's code):

==================================  ======================
outcome status                      score
==================================  ======================
``malformed`` / ``syntax_error``    0.0
``runtime_error`` / ``timeout``     0.1
``no_submission`` (none or invalid) 0.2
``valid``                           0.5 + 0.5 * percentile
==================================  ======================

``percentile`` is the MLE-Dojo position score: the fraction of leaderboard entries the
submission beats *or ties* (``(total - n_strictly_better) / total``), so ties count in the
submitter's favour. A valid submission on a task without a leaderboard has an unknown
score (``None``), never 0.

Classes: :class:`SubmissionError`. Functions: :func:`read_submission`,
:func:`validate_submission`, :func:`score_submission`, :func:`position_score`,
:func:`ladder_score`, :func:`check_syntax`, :func:`compile_gate`, :func:`harness_failed`, :func:`outcome_from_execution`,
:func:`grade_script`, :func:`grading_context`. Constant: :data:`LADDER`.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from wmrl_envs.autoresearch.bounded import (
    SubmissionLimitError,
    SubmissionLimits,
    cap_text,
    check_submission_shape,
    parse_bounded,
)
from wmrl_envs.autoresearch.metrics import get_metric
from wmrl_envs.autoresearch.tasks import Task
from wmrl_envs.outcome import Outcome

__all__ = [
    "LADDER",
    "SubmissionError",
    "read_submission",
    "validate_submission",
    "score_submission",
    "position_score",
    "ladder_score",
    "check_syntax",
    "compile_gate",
    "outcome_from_execution",
    "grade_script",
    "grading_context",
    "harness_failed",
    "SUBMISSION_FILE",
    "SubmissionLimits",
    "FEEDBACK_MAX_CHARS",
]

log = logging.getLogger(__name__)

SUBMISSION_FILE = "submission.csv"
#: Fixed scores of the non-valid statuses.
LADDER = {"malformed": 0.0, "syntax_error": 0.0, "runtime_error": 0.1, "timeout": 0.1, "no_submission": 0.2}
_FEEDBACK_TAIL = 1500
#: Longest feedback text of one outcome (the solution controls its stdout/stderr and the
#: submission that error messages quote).
FEEDBACK_MAX_CHARS = 4000
_EXAMPLES = 5


class SubmissionError(ValueError):
    """A submission that cannot be scored; the message says exactly what is wrong."""


def _keys(values: pd.Series) -> pd.Series:
    """Ids / class labels as comparable strings (1, 1.0 and "1" are the same key)."""
    # object dtype on purpose: pandas >= 3 would store the strings as Arrow strings when pyarrow
    # is installed, and every later set / lookup would copy each cell out again (bounded grading)
    if pd.api.types.is_numeric_dtype(values) and not pd.api.types.is_bool_dtype(values):
        finite = values.dropna()
        if len(finite) and np.all(np.isfinite(finite)) and np.all(finite == np.round(finite)):
            return pd.Series([str(int(v)) if pd.notna(v) else v for v in values], index=values.index, dtype=object)
    return pd.Series([str(v) if pd.notna(v) else v for v in values], index=values.index, dtype=object)


def _examples(items: Sequence[Any]) -> str:
    items = list(items)
    more = f" (+{len(items) - _EXAMPLES} more)" if len(items) > _EXAMPLES else ""
    return f"{items[:_EXAMPLES]}{more}"


def read_submission(
    raw: bytes | str,
    *,
    expected_columns: Sequence[str] | None = None,
    expected_rows: int | None = None,
    limits: SubmissionLimits | None = None,
) -> pd.DataFrame:
    """Parse submission CSV bytes; :class:`SubmissionError` if it is not a readable CSV.

    Size, line count, line length and header width are checked on the raw bytes first
    (see :mod:`wmrl_envs.autoresearch.bounded`), so the host's cost is bounded by the task
    (``expected_rows`` x ``expected_columns``) and not by what the solution wrote.
    """
    lim = limits or SubmissionLimits()
    data = raw.encode("utf-8", errors="replace") if isinstance(raw, str) else bytes(raw)
    try:
        check_submission_shape(
            data,
            name=SUBMISSION_FILE,
            expected_columns=expected_columns,
            expected_rows=expected_rows,
            limits=lim,
        )
    except SubmissionLimitError as err:
        raise SubmissionError(cap_text(str(err), lim.max_message_chars)) from None
    if not data.strip():
        raise SubmissionError(f"{SUBMISSION_FILE} is empty")
    max_rows = None if expected_rows is None else expected_rows + lim.slack_lines
    try:
        return parse_bounded(data, max_rows=max_rows)
    except Exception as err:  # pandas raises several parser error types
        msg = f"{SUBMISSION_FILE} could not be parsed as CSV: {err}"
        raise SubmissionError(cap_text(msg, lim.max_message_chars)) from None


def validate_submission(task: Task, sub: pd.DataFrame, test_ids: Sequence[Any]) -> np.ndarray:  # noqa: C901 -- complexity over 15 before the limit (issue 26)
    """Check ``sub`` against the task's submission contract; return predictions in ``test_ids`` order.

    Raises :class:`SubmissionError` naming the first problem found: wrong columns,
    duplicate / missing / unknown ids, wrong length, non-numeric values where numbers are
    due, NaN or infinite values, unknown class labels, probabilities outside [0, 1] or
    negative values for rmsle.
    """
    expected = task.submission_columns
    cols = [str(c) for c in sub.columns]
    if cols != expected:
        missing = [c for c in expected if c not in cols]
        extra = [c for c in cols if c not in expected]
        detail = []
        if missing:
            detail.append(f"missing {missing}")
        if extra:
            detail.append(f"unexpected {extra}")
        if not missing and not extra:
            detail.append("wrong order")
        raise SubmissionError(
            f"{SUBMISSION_FILE} has columns {cols}; expected exactly {expected} ({'; '.join(detail)})"
        )
    sub = sub.copy()
    sub.columns = cols
    ids = _keys(sub[task.id_column])
    want = _keys(pd.Series(list(test_ids)))
    if ids.isna().any():
        raise SubmissionError(f"id column {task.id_column!r} has {int(ids.isna().sum())} missing values")
    dup = ids[ids.duplicated()].unique()
    if len(dup):
        raise SubmissionError(
            f"{SUBMISSION_FILE} has {len(dup)} duplicate ids in {task.id_column!r}, e.g. {_examples(dup)}"
        )
    missing_ids = sorted(set(want) - set(ids), key=str)
    extra_ids = sorted(set(ids) - set(want), key=str)
    if missing_ids or extra_ids or len(ids) != len(want):
        parts = [f"{SUBMISSION_FILE} has {len(ids)} rows; expected {len(want)} (one per id of test.csv)"]
        if missing_ids:
            parts.append(f"{len(missing_ids)} test ids are missing, e.g. {_examples(missing_ids)}")
        if extra_ids:
            parts.append(f"{len(extra_ids)} ids are not test ids, e.g. {_examples(extra_ids)}")
        raise SubmissionError("; ".join(parts))

    sub.index = ids
    pred = sub.loc[list(want), expected[1:]]
    metric = get_metric(task.metric)
    if metric.prediction == "label":
        col = expected[1]
        if pred[col].isna().any():
            raise SubmissionError(f"column {col!r} has {int(pred[col].isna().sum())} missing (NaN) values")
        labels = _keys(pred[col])
        assert task.classes is not None  # label metrics are classification metrics
        unknown = sorted(set(labels) - set(task.classes), key=str)
        if unknown:
            raise SubmissionError(
                f"column {col!r} has values that are not classes: {_examples(unknown)}; classes are {list(task.classes)}"
            )
        return labels.to_numpy()
    for col in pred.columns:
        values = pd.to_numeric(pred[col], errors="coerce")
        bad = pred[col][values.isna() & pred[col].notna()]
        if len(bad):
            raise SubmissionError(
                f"column {col!r} must be numeric; found non-numeric values such as {_examples(bad.unique())}"
            )
        if values.isna().any():
            raise SubmissionError(f"column {col!r} has {int(values.isna().sum())} missing (NaN) values")
        if not np.isfinite(values).all():
            raise SubmissionError(f"column {col!r} has infinite values")
        if metric.prediction == "proba" and ((values < 0) | (values > 1)).any():
            raise SubmissionError(
                f"column {col!r} holds probabilities and must lie in [0, 1]; found values such as {_examples(values[(values < 0) | (values > 1)].unique())}"
            )
        if task.metric == "rmsle" and (values < 0).any():
            raise SubmissionError(f"column {col!r} has negative values; rmsle needs predictions >= 0")
        pred[col] = values
    return (
        pred.to_numpy(dtype=float)
        if task.submission_format == "proba_classes"
        else pred.iloc[:, 0].to_numpy(dtype=float)
    )


def score_submission(task: Task, sub: pd.DataFrame, answers: pd.DataFrame | None = None) -> float:
    """Validate ``sub`` and return its raw metric value on the hidden answers."""
    answers = task.read_answers() if answers is None else answers
    pred = validate_submission(task, sub, answers[task.id_column].tolist())
    y = answers[task.target]
    y = _keys(y).to_numpy() if task.classes is not None else y.to_numpy(dtype=float)
    return get_metric(task.metric)(y, pred, classes=task.classes)


def position_score(score: float, leaderboard: Sequence[float], higher_is_better: bool) -> float:
    """MLE-Dojo position score: fraction of ``leaderboard`` that ``score`` beats or ties.

    >>> position_score(0.8, [0.9, 0.8, 0.7, 0.6], higher_is_better=True)
    0.75
    >>> position_score(1.0, [0.5, 1.0, 2.0], higher_is_better=False)
    0.6666666666666666
    """
    board = np.asarray(leaderboard, dtype=float)
    if board.size == 0:
        raise ValueError("position_score needs a non-empty leaderboard")
    strictly_better = np.sum(board > score) if higher_is_better else np.sum(board < score)
    return float((board.size - strictly_better) / board.size)


def ladder_score(status: str, percentile: float | None = None) -> float | None:
    """Reward-ladder score of ``status`` (``None`` for a valid submission of unknown rank)."""
    if status == "valid":
        return None if percentile is None else 0.5 + 0.5 * float(percentile)
    if status not in LADDER:
        raise ValueError(f"unknown AutoResearch status {status!r}; expected one of {sorted(LADDER) + ['valid']}")
    return LADDER[status]


def check_syntax(script: str) -> Outcome | None:
    """A ``syntax_error`` outcome if ``script`` does not compile, else ``None``.

    Compiling is exact and free, so syntax errors never reach the sandbox (or a world model).
    Never raises: whatever ``compile`` raises is the script's fault and becomes a
    ``syntax_error`` with its message -- ``SyntaxError`` / ``ValueError`` (NUL bytes), and the
    ``RecursionError`` / ``MemoryError`` of a few thousand nested operators (``x = ----...1``),
    which the real interpreter would fail on in the same way before running a line.

    >>> check_syntax("x = " + "-" * 3000 + "1").status
    'syntax_error'
    """
    try:
        compile(script, "main.py", "exec")
    except (SyntaxError, ValueError) as err:  # ValueError: NUL bytes in the source
        line = getattr(err, "lineno", None)
        where = f" (line {line})" if line else ""
        return Outcome(
            "syntax_error", LADDER["syntax_error"], feedback=f"SyntaxError{where}: {getattr(err, 'msg', err)}"
        )
    except (RecursionError, MemoryError) as err:
        return Outcome(
            "syntax_error",
            LADDER["syntax_error"],
            feedback=f"{type(err).__name__} while compiling: the script nests too deeply for the compiler ({err})",
        )
    except Exception as err:  # noqa: BLE001 -- a reply must never crash the env; anything compile raises is the script's
        return Outcome("syntax_error", LADDER["syntax_error"], feedback=f"{type(err).__name__} while compiling: {err}")
    return None


def compile_gate(code: str) -> Outcome | None:
    """:func:`check_syntax` for world models: the exact outcome of a script that does not
    compile (marked ``source="wm"``, ``metrics["compile_gate"] = True``), else ``None``.

    Compilation is deterministic, so no world model needs to guess here: a script that
    ``compile`` rejects fails in the sandbox with a ``SyntaxError`` before running.

    >>> compile_gate("print(1").status, compile_gate("print(1)") is None
    ('syntax_error', True)
    """
    exact = check_syntax(code)
    if exact is None:
        return None
    return dataclasses.replace(exact, metrics={**exact.metrics, "compile_gate": True}, source="wm")


def _tail(text: str, n: int = _FEEDBACK_TAIL) -> str:
    text = text.strip()
    return text if len(text) <= n else "..." + text[-n:]


def harness_failed(result: Any) -> bool:
    """True when the sandbox itself failed, so nothing is known about the script.

    The executor reports this as ``status="error"`` with an unknown (``None``) return code,
    e.g. when its launcher process was killed from outside.
    """
    return result.status == "error" and result.returncode is None


def outcome_from_execution(
    task: Task,
    result: Any,
    leaderboard: Sequence[float] | None,
    *,
    answers: pd.DataFrame | None = None,
    submission_limits: SubmissionLimits | None = None,
) -> Outcome:
    """Turn a sandbox ``ExecutionResult`` into an :class:`Outcome` on the reward ladder.

    A non-zero exit is a ``runtime_error`` even if a submission was written (the run did
    not complete); wall/CPU budget exhaustion is ``timeout``; memory, process or output
    caps are ``runtime_error``. The submission is checked against ``submission_limits``
    before it is parsed (an oversized or misshapen one is ``no_submission`` with the limit
    named in ``metrics["invalid_reason"]``); feedback is at most :data:`FEEDBACK_MAX_CHARS`.
    """
    out = _outcome(task, result, leaderboard, answers=answers, submission_limits=submission_limits)
    if len(out.feedback) > FEEDBACK_MAX_CHARS:
        out = dataclasses.replace(out, feedback=cap_text(out.feedback, FEEDBACK_MAX_CHARS))
    return out


def _outcome(
    task: Task,
    result: Any,
    leaderboard: Sequence[float] | None,
    *,
    answers: pd.DataFrame | None = None,
    submission_limits: SubmissionLimits | None = None,
) -> Outcome:
    """Body of :func:`outcome_from_execution` (feedback not yet capped)."""
    metrics: dict[str, Any] = {
        "exec_status": result.status,
        "wall_seconds": round(float(result.wall_seconds), 3),
        "cpu_seconds": None if result.cpu_seconds is None else round(float(result.cpu_seconds), 3),
        "metric": task.metric,
    }
    cost = float(result.wall_seconds)
    if result.status == "timeout":
        msg = "Your script ran out of its time budget and was killed" + (
            f" ({result.reason})." if result.reason else "."
        )
        return Outcome("timeout", LADDER["timeout"], feedback=msg, metrics=metrics, cost=cost)
    if result.status != "ok":
        why = result.reason or f"exit code {result.returncode}"
        msg = f"Your script failed ({why}).\nstderr (tail):\n{_tail(result.stderr_tail)}"
        return Outcome("runtime_error", LADDER["runtime_error"], feedback=msg, metrics=metrics, cost=cost)
    stdout = _tail(result.stdout_tail, 500)
    printed = f"\nstdout (tail):\n{stdout}" if stdout else ""
    raw = result.files.get(SUBMISSION_FILE)
    oversized = (getattr(result, "oversized_files", None) or {}).get(SUBMISSION_FILE)
    lim = submission_limits or SubmissionLimits()
    if raw is None and oversized is None:
        msg = f"Your script ran but wrote no ./{SUBMISSION_FILE}.{printed}"
        return Outcome("no_submission", LADDER["no_submission"], feedback=msg, metrics=metrics, cost=cost)
    try:
        if oversized is not None:  # the sandbox did not even read it back
            raise SubmissionError(f"{SUBMISSION_FILE} is {oversized} bytes; the limit is {lim.max_bytes} bytes")
        answers = task.read_answers() if answers is None else answers
        sub = read_submission(
            raw if raw is not None else b"",
            expected_columns=task.submission_columns,
            expected_rows=len(answers),
            limits=lim,
        )
        value = score_submission(task, sub, answers)
    except SubmissionError as err:
        reason = cap_text(str(err), lim.max_message_chars)
        metrics["invalid_reason"] = reason
        msg = f"Your script ran but ./{SUBMISSION_FILE} is invalid: {reason}{printed}"
        return Outcome("no_submission", LADDER["no_submission"], feedback=msg, metrics=metrics, cost=cost)
    metric = get_metric(task.metric)
    direction = "higher is better" if metric.higher_is_better else "lower is better"
    metrics["value"] = value
    if leaderboard is None or len(leaderboard) == 0:
        metrics["percentile"] = None
        msg = f"Valid submission. {task.metric} = {value:.5g} on the held-out test set ({direction}); no leaderboard to rank it.{printed}"
        return Outcome("valid", None, feedback=msg, metrics=metrics, cost=cost)
    pct = position_score(value, leaderboard, metric.higher_is_better)
    metrics["percentile"] = pct
    msg = (
        f"Valid submission. {task.metric} = {value:.5g} on the held-out test set ({direction}); "
        f"it ranks at or above {pct:.0%} of the {len(leaderboard)} leaderboard entries.{printed}"
    )
    return Outcome("valid", ladder_score("valid", pct), feedback=msg, metrics=metrics, cost=cost)


def _with_read_cap(limits: Any) -> Any:
    """``limits`` with the sandbox's read-back capped at the submission size limit, so an
    oversized submission is never loaded into the grading process (``None``: defaults)."""
    from wmrl_envs.sandbox.base import Limits

    base = Limits() if limits is None else limits
    if not isinstance(base, Limits):  # a foreign executor's own limits type: pass through
        return limits
    cap = SubmissionLimits().max_bytes
    if base.max_read_bytes is not None and base.max_read_bytes <= cap:
        return base
    return dataclasses.replace(base, max_read_bytes=cap)


def grade_script(
    task: Task, script: str, executor: Any, leaderboard: Sequence[float] | None, *, limits: Any = None
) -> Outcome | None:
    """Grade ``script`` for real: syntax check, sandbox run, validation, ranking.

    Returns ``None`` (unknown) when the harness itself fails (executor crash), never 0.
    """
    syntax = check_syntax(script)
    if syntax is not None:
        return syntax
    try:
        result = executor.run(script, inputs=task.inputs(), outputs=(SUBMISSION_FILE,), limits=_with_read_cap(limits))
        if harness_failed(result):
            log.warning("sandbox failed on a solution for task %s: %s", task.task_id, result.reason)
            return None
        return outcome_from_execution(task, result, leaderboard)
    except Exception:  # the harness (sandbox, answers, leaderboard), not the solution, failed
        log.exception("grader failed on a solution for task %s", task.task_id)
        return None


def grading_context(
    task: Task,
    turn: int = 0,
    history: Sequence[str] = (),
    *,
    max_overview_chars: int = 2500,
    limits: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The public context of a grading request (what a world model may condition on): the
    task's overview, meta-features and landmarks (:mod:`wmrl_envs.world_models.landmarks`),
    the run's limits, the turn and the history.

    ``limits``: the run's ``{"wall_seconds", "memory_bytes"}`` (default: the task's own,
    :meth:`~wmrl_envs.autoresearch.tasks.Task.run_limits`).
    """
    from wmrl_envs.autoresearch.landmarks import task_landmarks

    lim = task.run_limits()
    lim.update(limits or {})
    return {
        "task_id": task.task_id,
        "overview": task.overview(max_overview_chars),
        # Landmarks read the public training table only, once per task (cached).
        "meta": {**task.meta_features(), **task_landmarks(task)},
        "limits": {"wall_seconds": float(lim["wall_seconds"]), "memory_bytes": int(lim["memory_bytes"])},
        "turn": int(turn),
        "history": list(history),
    }
