"""Landmark meta-features for execution logs: the shipped table of every logged task.

Landmarks are computed by the task floor (:mod:`wmrl_envs.autoresearch.landmarks`: cheap
learners' CV on a task's public training table) and put into every live grading context.
Execution logs written before that carry none: :func:`with_landmarks` fills them from the
shipped table of every logged task (:func:`landmark_table`, ``landmark_table.json``), so a
model can be fitted on old logs (``wmrl-wm fit --landmarks``) and graded on live contexts alike.

Functions: :func:`landmark_table`, :func:`with_landmarks` (and, re-exported from the task
floor, :func:`landmarks`, :func:`task_landmarks`). Constants: :data:`LANDMARK_TABLE`,
:data:`LANDMARK_KEYS`, :data:`METRIC_LANDMARK_KEYS`, :data:`METRIC_LEARNERS`.
"""

from __future__ import annotations

import functools
import json
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path

from wmrl_envs.autoresearch.landmarks import (
    LANDMARK_KEYS,
    METRIC_LANDMARK_KEYS,
    METRIC_LEARNERS,
    landmarks,
    task_landmarks,
)
from wmrl_envs.world_models.logs import LogRecord

__all__ = [
    "LANDMARK_KEYS",
    "METRIC_LANDMARK_KEYS",
    "METRIC_LEARNERS",
    "LANDMARK_TABLE",
    "landmarks",
    "task_landmarks",
    "landmark_table",
    "with_landmarks",
]

#: The shipped landmarks of every task in the shipped execution logs.
LANDMARK_TABLE = Path(__file__).parent / "landmark_table.json"


@functools.lru_cache(maxsize=1)
def landmark_table(path: str | Path | None = None) -> Mapping[str, Mapping[str, float]]:
    """Task id -> landmarks of every task in the shipped execution logs (catalog and corpus)."""
    p = Path(path) if path is not None else LANDMARK_TABLE
    return json.loads(p.read_text()) if p.is_file() else {}


def with_landmarks(
    records: Sequence[LogRecord],
    table: Mapping[str, Mapping[str, float]] | None = None,
    *,
    task_root: str | Path | None = None,
    warn: bool = True,
) -> list[LogRecord]:
    """``records`` with landmarks in every context's ``meta`` where it has none: from ``table``
    (default :func:`landmark_table`), else computed from the task directory
    ``task_root/<task_id>`` when there is one (e.g. bring-your-own tasks). A task still
    without landmarks is left as it is (its landmark features are unknown, never zero), with
    a warning naming it: a model fitted with landmarks ranks worse without them."""
    table = landmark_table() if table is None else table
    computed: dict[str, Mapping[str, float] | None] = {}
    out, missing = [], set()
    for r in records:
        meta = r.context.get("meta")
        if isinstance(meta, Mapping) and "landmark_gain" in meta:
            out.append(r)
            continue
        lm = table.get(r.task_id)
        if lm is None and task_root is not None:
            if r.task_id not in computed:
                computed[r.task_id] = _from_task_dir(Path(task_root) / r.task_id)
            lm = computed[r.task_id]
        if lm is None:
            missing.add(r.task_id)
            out.append(r)
            continue
        out.append(replace(r, context={**r.context, "meta": {**(meta if isinstance(meta, Mapping) else {}), **lm}}))
    if missing and warn:
        names = ", ".join(sorted(missing)[:8]) + (" ..." if len(missing) > 8 else "")
        warnings.warn(
            f"{len(missing)} task(s) have no landmarks in their contexts and none are known for them ({names}): "
            "their landmark features are unknown, which costs ranking fidelity. Pass the directory holding the "
            "task directories (wmrl-wm --task-root DIR) to compute them.",
            stacklevel=2,
        )
    return out


def _from_task_dir(path: Path) -> Mapping[str, float] | None:
    from wmrl_envs.autoresearch.tasks import load_task

    if not (path / "task.json").is_file():
        return None
    return task_landmarks(load_task(path))
