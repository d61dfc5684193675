"""AutoResearch: Kaggle-style ML tasks as Gymnasium environments.

Modules: ``tasks`` (task format on disk), ``catalog`` (curated real tasks), ``procedural``
(seeded generator), ``byo`` (bring-your-own CSV), ``metrics``, ``grading`` (validation,
position score, reward ladder), ``leaderboard`` (reference pool, leaderboards, pool logs),
``env`` (:class:`AutoResearchEnv`), ``registration`` (gym ids), ``cli`` (``wmrl-tasks``).

Catalog tiers: ``"small"`` (default; 27 tables capped at 2,500 rows) and ``"full"``
(full-size tables of >= 20,000 rows with their own split and per-task limits), e.g.
``list_catalog("train", tier="full")``, ``gym.make("wmrl/AutoResearch-v0", tier="full")``.

Names below are imported lazily so ``import wmrl_envs`` (which registers the gym ids)
does not pull in pandas and scikit-learn.

>>> from wmrl_envs.autoresearch import AutoResearchEnv, get_task
>>> get_task("wine").metric
'log_loss'
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "AutoResearchEnv": "env",
    "AutoResearchConfig": "env",
    "parse_action": "env",
    "INFO_TOPICS": "env",
    "Task": "tasks",
    "get_task": "tasks",
    "load_task": "tasks",
    "list_catalog": "tasks",
    "write_task": "tasks",
    "CATALOG": "catalog",
    "FULL_CATALOG": "catalog",
    "build_catalog": "catalog",
    "catalog_split": "catalog",
    "catalog_specs": "catalog",
    "TIERS": "tasks",
    "generate_task": "procedural",
    "ProceduralConfig": "procedural",
    "task_from_csv": "byo",
    "task_from_frame": "byo",
    "build_leaderboards": "leaderboard",
    "load_leaderboard": "leaderboard",
    "reference_pool": "leaderboard",
    "LeaderboardConfig": "leaderboard",
    "grade_script": "grading",
    "position_score": "grading",
    "ladder_score": "grading",
    "compile_gate": "grading",
    "LADDER": "grading",
    "validate_submission": "grading",
    "SubmissionError": "grading",
    "METRICS": "metrics",
    "get_metric": "metrics",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
