"""Execution logs: the training and evaluation data of learned world models.

One JSON object per line (docs/contracts.md)::

    {"task_id": "...", "solution_id": "...", "code": "...", "context": {...},
     "outcome": {...Outcome.to_dict()...}, "origin": "leaderboard-pool" | "anchor" | ...}

Classes: :class:`LogRecord`. Functions: :func:`read_logs`, :func:`write_logs`,
:func:`split_by_task`.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from wmrl_envs.outcome import Outcome

__all__ = ["LogRecord", "read_logs", "write_logs", "split_by_task"]

_REQUIRED = ("task_id", "code", "context", "outcome")


@dataclass(frozen=True)
class LogRecord:
    """One executed solution and its true outcome (``None``: the grader itself failed).

    >>> r = LogRecord.from_dict({"task_id": "t", "code": "x = 1", "context": {}, "outcome": None})
    >>> r.known, r.to_dict()["outcome"]
    (False, None)
    """

    task_id: str
    code: str
    context: Mapping[str, Any]
    outcome: Outcome | None
    solution_id: str = ""
    origin: str = ""
    extra: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str = "record") -> LogRecord:
        missing = [k for k in _REQUIRED if k not in d]
        if missing:
            raise ValueError(f"{where}: execution-log record lacks {missing} (has {sorted(d)})")
        if not isinstance(d["code"], str):
            raise ValueError(f"{where}: 'code' must be a string, got {type(d['code']).__name__}")
        if not isinstance(d["context"], Mapping):
            raise ValueError(f"{where}: 'context' must be an object, got {type(d['context']).__name__}")
        try:
            outcome = None if d["outcome"] is None else Outcome.from_dict(d["outcome"])
        except (TypeError, KeyError, ValueError) as e:
            raise ValueError(f"{where}: bad 'outcome' {d['outcome']!r}: {e}") from e
        known = {"task_id", "solution_id", "code", "context", "outcome", "origin"}
        return cls(
            task_id=str(d["task_id"]),
            code=d["code"],
            context=dict(d["context"]),
            outcome=outcome,
            solution_id=str(d.get("solution_id", "")),
            origin=str(d.get("origin", "")),
            extra={k: v for k, v in d.items() if k not in known},
        )

    @property
    def known(self) -> bool:
        """True when the true score is known (usable as a label)."""
        return self.outcome is not None and self.outcome.score is not None

    def to_dict(self) -> dict[str, Any]:
        return {
            "task_id": self.task_id,
            "solution_id": self.solution_id,
            "code": self.code,
            "context": dict(self.context),
            "outcome": None if self.outcome is None else self.outcome.to_dict(),
            "origin": self.origin,
            **self.extra,
        }


def read_logs(paths: str | Path | Iterable[str | Path]) -> list[LogRecord]:
    """All records of one or more JSONL files, plain or gzipped (``.gz``); blank lines
    skipped, bad lines raise with file:line."""
    if isinstance(paths, (str, Path)):
        paths = [paths]
    records: list[LogRecord] = []
    for path in paths:
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"execution log {path} does not exist")
        with gzip.open(path, "rt") if path.suffix == ".gz" else path.open() as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    d = json.loads(line)
                except json.JSONDecodeError as e:
                    raise ValueError(f"{path}:{lineno}: not JSON: {e}") from e
                records.append(LogRecord.from_dict(d, where=f"{path}:{lineno}"))
    return records


def write_logs(path: str | Path, records: Iterable[LogRecord]) -> None:
    """Write records as JSONL (overwrites ``path``)."""
    with Path(path).open("w") as f:
        for r in records:
            f.write(json.dumps(r.to_dict()) + "\n")


def split_by_task(
    records: Sequence[LogRecord], test_fraction: float = 0.25, seed: int = 0
) -> tuple[list[LogRecord], list[LogRecord]]:
    """Split records into (train, test) with no task in both; deterministic per ``seed``."""
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    tasks = sorted({r.task_id for r in records})
    if len(tasks) < 2:
        raise ValueError(f"need records of at least 2 tasks to split by task, got {len(tasks)}")
    rng = np.random.default_rng(seed)
    n_test = min(len(tasks) - 1, max(1, round(test_fraction * len(tasks))))
    test = set(rng.permutation(tasks)[:n_test].tolist())
    return [r for r in records if r.task_id not in test], [r for r in records if r.task_id in test]
