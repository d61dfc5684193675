"""Gymnasium ids of the AutoResearch suite (called by ``wmrl_envs`` on import).

* ``wmrl/AutoResearch-v0`` -- samples a catalog task per episode; ``split="train"`` (default)
  or ``"test"``, ``tier="small"`` (default, the 2,500-row catalog) or ``"full"`` (full-size
  tables); any :class:`~wmrl_envs.autoresearch.env.AutoResearchEnv` keyword works.
* ``wmrl/AutoResearch-<task>-v0`` -- one id per shipped catalog task, of either tier
  (e.g. ``wmrl/AutoResearch-flights_late-v0``).

Registration only lists the shipped task directories (no pandas import), so
``import wmrl_envs`` stays cheap.

Functions: :func:`register_envs`, :func:`catalog_ids`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gymnasium as gym

__all__ = ["register_envs", "catalog_ids", "ENTRY_POINT"]

ENTRY_POINT = "wmrl_envs.autoresearch.env:AutoResearchEnv"
_TASKS = Path(__file__).parent / "data" / "tasks"


def catalog_ids() -> list[str]:
    """Ids of the shipped catalog tasks (both tiers)."""
    return sorted(p.name for p in _TASKS.iterdir() if (p / "task.json").is_file()) if _TASKS.is_dir() else []


def register_envs() -> None:
    """Register every AutoResearch id (idempotent)."""
    ids: dict[str, dict[str, Any]] = {"wmrl/AutoResearch-v0": {}}
    ids.update({f"wmrl/AutoResearch-{t}-v0": {"task": t} for t in catalog_ids()})
    for env_id, kwargs in ids.items():
        if env_id not in gym.registry:
            gym.register(id=env_id, entry_point=ENTRY_POINT, kwargs=kwargs, disable_env_checker=False)
