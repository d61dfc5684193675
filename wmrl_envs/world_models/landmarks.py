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
    records: Sequence[LogRecord], table: Mapping[str, Mapping[str, float]] | None = None
) -> list[LogRecord]:
    """``records`` with landmarks in every context's ``meta`` where it has none, from ``table``
    (default :func:`landmark_table`); a task missing from the table is left as it is (its
    landmark features are unknown, never zero)."""
    table = landmark_table() if table is None else table
    out = []
    for r in records:
        meta = r.context.get("meta")
        lm = table.get(r.task_id)
        if lm is None or (isinstance(meta, Mapping) and "landmark_gain" in meta):
            out.append(r)
            continue
        out.append(replace(r, context={**r.context, "meta": {**(meta if isinstance(meta, Mapping) else {}), **lm}}))
    return out
