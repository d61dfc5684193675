"""Shared plumbing of the experiments: task splits, shipped config files, per-seed
aggregation, plots and the CPU clock.

Every experiment declares one config dataclass whose fields are its knobs (documented
defaults); ``wmrl-bench`` turns them into flags and reads config files with
:mod:`wmrl_envs.config_cli` (:func:`load_config` adds the shipped configs of
:data:`CONFIG_DIR`). Env stacks come from :func:`wrappers.build_stack`, vector envs from
:func:`wmrl_envs.vector.make_vector_env`, policies and world models from
:mod:`agents.llm.loading`.

Functions: :func:`load_config`, :func:`task_split`, :func:`summarize_seeds`,
:func:`new_figure`, :func:`save_figure`, :func:`cpu_clock`. Constants: :data:`ARMS`,
:data:`CONFIG_DIR`.
"""

from __future__ import annotations

import resource
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from benchmarks.report import mean_spread
from wmrl_envs.config_cli import load_config_file
from wrappers import STACKS

__all__ = [
    "ARMS",
    "CONFIG_DIR",
    "load_config",
    "task_split",
    "summarize_seeds",
    "new_figure",
    "save_figure",
    "cpu_clock",
    "cpu_probe",
]

#: Training arms of the speedup experiment (the stacks of :func:`wrappers.build_stack`).
ARMS = STACKS

#: Shipped config files (``--config speedup-main`` resolves to ``CONFIG_DIR / "speedup-main.toml"``).
CONFIG_DIR = Path(__file__).parent / "configs"


def load_config(path: str | Path) -> dict[str, Any]:
    """A config file, or the name of a shipped one in :data:`CONFIG_DIR`."""
    return load_config_file(path, shipped=CONFIG_DIR)


# ------------------------------------------------------------------ tasks
def task_split(split: str, tasks: Sequence[str] | None = None, limit: int | None = None) -> list[str]:
    """Explicit ``tasks`` or the AutoResearch catalog's ``split`` ("train"/"test"), first ``limit``."""
    from wmrl_envs.autoresearch import catalog_split

    chosen = list(tasks) if tasks else list(catalog_split()[split])
    if not chosen:
        raise ValueError(f"no tasks in split {split!r}")
    return chosen[:limit] if limit else chosen


# ------------------------------------------------------------------ aggregation, plots, clocks
def summarize_seeds(rows: Sequence[Mapping[str, Any]], key: str, metrics: Sequence[str]) -> list[dict[str, Any]]:
    """One row per value of ``key`` (first-seen order): ``metric`` = mean over seeds,
    ``metric_sd`` = sample standard deviation (``None`` values excluded), ``seeds`` = count."""
    out = []
    for value in dict.fromkeys(r[key] for r in rows):
        mine = [r for r in rows if r[key] == value]
        row: dict[str, Any] = {key: value, "seeds": len(mine)}
        for m in metrics:
            row[m], row[f"{m}_sd"] = mean_spread(r.get(m) for r in mine)
        out.append(row)
    return out


def new_figure(width: float = 6.0, height: float = 4.0, ncols: int = 1) -> tuple[Any, Any]:
    """A matplotlib figure (``ncols`` axes side by side) on the Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, ncols, figsize=(width, height), dpi=110)
    return fig, ax


def save_figure(fig: Any, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def cpu_clock() -> float:
    """CPU seconds of this process plus its finished children (sandbox runs are children)."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


def cpu_probe() -> float:
    """CPU seconds this process takes for one fixed piece of single-threaded work (integer
    arithmetic, hashing and a sort in pure Python; 0.2-0.4 s on the machines seen). Recorded before and after each
    benchmark arm, it shows how the machine's speed drifted: on a shared host the CPU time of
    the same work changes over hours, so step counts made hours apart do not compare without it."""
    start = time.process_time()
    total = 0
    for i in range(1_500_000):
        total += i * i % 7
    sorted(hash((i, total)) for i in range(300_000))
    return time.process_time() - start
