"""Seeded procedural tasks: an unlimited supply of training tasks in the catalog's format.

Each seed fixes everything: task type, metric, size, numeric and categorical features
(with random cardinalities and target effects), a nonlinear signal with interactions, the
noise level, class imbalance and MCAR missing values. The same seed always writes the same
files. A task's leaderboard is built on demand with the small reference pool
(``wmrl-tasks generate --leaderboard`` or :func:`generate_task(..., leaderboard=True)`).

Classes: :class:`ProceduralConfig`. Functions: :func:`generate_frame`,
:func:`generate_task`, :func:`default_task_cache`.

>>> df, spec = generate_frame(7)
>>> spec["task_type"] in ("binary", "multiclass", "regression")
True
>>> generate_frame(7)[0].equals(df)
True
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from sklearn.model_selection import train_test_split

from wmrl_envs.autoresearch.metrics import METRICS_FOR_TYPE
from wmrl_envs.autoresearch.tasks import Task, write_task

__all__ = ["ProceduralConfig", "generate_frame", "generate_task", "default_task_cache"]


def default_task_cache() -> Path:
    """Where generated and BYO tasks go by default: ``$WMRL_TASK_CACHE`` or ``~/.cache/wmrl/tasks``."""
    return Path(os.environ.get("WMRL_TASK_CACHE", Path.home() / ".cache" / "wmrl" / "tasks"))


@dataclass(frozen=True)
class ProceduralConfig:
    """Ranges the generator draws from (inclusive bounds).

    Attributes:
        rows: total rows (train + held-out). Default (300, 2500).
        numeric: number of numeric features. Default (2, 12).
        categorical: number of categorical features. Default (0, 4).
        cardinality: levels per categorical feature. Default (2, 40).
        missing: MCAR missing fraction per feature that has missing values. Default (0.0, 0.25).
        noise: noise scale relative to the signal's std. Default (0.1, 1.5).
        minority: minority class share of binary tasks. Default (0.05, 0.5).
        classes: number of classes of multiclass tasks. Default (3, 6).
        task_types: task types drawn uniformly.
        test_fraction: held-out share. Default 0.3.
    """

    rows: tuple[int, int] = (300, 2500)
    numeric: tuple[int, int] = (2, 12)
    categorical: tuple[int, int] = (0, 4)
    cardinality: tuple[int, int] = (2, 40)
    missing: tuple[float, float] = (0.0, 0.25)
    noise: tuple[float, float] = (0.1, 1.5)
    minority: tuple[float, float] = (0.05, 0.5)
    classes: tuple[int, int] = (3, 6)
    task_types: tuple[str, ...] = ("binary", "multiclass", "regression")
    test_fraction: float = 0.3

    def __post_init__(self) -> None:
        for name in ("rows", "numeric", "categorical", "cardinality", "missing", "noise", "minority", "classes"):
            lo, hi = getattr(self, name)
            if lo > hi:
                raise ValueError(f"ProceduralConfig.{name}: lower bound {lo} > upper bound {hi}")
        if self.numeric[0] < 2:
            raise ValueError("ProceduralConfig.numeric must allow at least 2 numeric features")
        if not 0 < self.test_fraction < 1:
            raise ValueError(f"test_fraction must be in (0, 1), got {self.test_fraction}")
        bad = set(self.task_types) - set(METRICS_FOR_TYPE)
        if bad or not self.task_types:
            raise ValueError(
                f"task_types must be a non-empty subset of {tuple(METRICS_FOR_TYPE)}, got {self.task_types}"
            )


def generate_frame(seed: int, config: ProceduralConfig | None = None) -> tuple[pd.DataFrame, dict[str, Any]]:
    """One synthetic table (features + ``target``) and the spec that generated it."""
    cfg = config or ProceduralConfig()
    rng = np.random.default_rng([seed, 0x5EED])
    task_type = str(rng.choice(cfg.task_types))
    n = int(rng.integers(cfg.rows[0], cfg.rows[1] + 1))
    n_num = int(rng.integers(cfg.numeric[0], cfg.numeric[1] + 1))
    n_cat = int(rng.integers(cfg.categorical[0], cfg.categorical[1] + 1))
    noise = float(rng.uniform(*cfg.noise))

    # Correlated numerics: a random mixing matrix over independent normals, mixed scales.
    z = rng.standard_normal((n, n_num)) @ (np.eye(n_num) + 0.4 * rng.standard_normal((n_num, n_num)))
    scales = np.exp(rng.uniform(-1, 3, n_num))
    num = z * scales + rng.normal(0, 5, n_num)
    # Signal: sparse linear part + a few nonlinear terms + pairwise interactions.
    w = rng.standard_normal(n_num) * (rng.random(n_num) < 0.7)
    signal = z @ w
    for _ in range(int(rng.integers(1, 4))):
        i, j = rng.integers(n_num, size=2)
        signal += rng.choice([np.sin(2 * z[:, i]), z[:, i] * z[:, j], np.abs(z[:, i]), (z[:, i] > 0) * z[:, j]])
    frame = {f"num_{k}": num[:, k] for k in range(n_num)}
    for k in range(n_cat):
        levels = int(rng.integers(cfg.cardinality[0], cfg.cardinality[1] + 1))
        # Zipf-like level frequencies: realistic long tails for high-cardinality columns.
        p = 1.0 / np.arange(1, levels + 1) ** rng.uniform(0.3, 1.2)
        codes = rng.choice(levels, size=n, p=p / p.sum())
        signal += rng.normal(0, rng.uniform(0.2, 1.0), levels)[codes]
        frame[f"cat_{k}"] = np.array([f"c{k}_{v}" for v in range(levels)], dtype=object)[codes]
    signal = (signal - signal.mean()) / (signal.std() + 1e-12)
    latent = signal + noise * rng.standard_normal(n)

    spec: dict[str, Any] = {
        "task_type": task_type,
        "n_rows": n,
        "n_numeric": n_num,
        "n_categorical": n_cat,
        "noise": round(noise, 3),
    }
    if task_type == "regression":
        metric = str(rng.choice(METRICS_FOR_TYPE["regression"]))
        scale = float(np.exp(rng.uniform(0, 6)))
        y = np.exp(0.5 * latent) * scale if metric == "rmsle" else latent * scale + float(rng.normal(0, scale))
        target = np.round(y, 4)
    elif task_type == "binary":
        metric = str(rng.choice(METRICS_FOR_TYPE["binary"]))
        minority = float(rng.uniform(*cfg.minority))
        target = np.where(latent > np.quantile(latent, 1 - minority), "yes", "no")
        spec["minority"] = round(minority, 3)
    else:
        metric = str(rng.choice(METRICS_FOR_TYPE["multiclass"]))
        k = int(rng.integers(cfg.classes[0], cfg.classes[1] + 1))
        # Classes: argmax of k noisy random projections of the features plus the signal.
        proj = z @ rng.standard_normal((n_num, k)) * 0.5 + np.outer(signal, rng.standard_normal(k))
        proj += noise * rng.standard_normal((n, k))
        counts = np.bincount(proj.argmax(axis=1), minlength=k)
        keep = counts >= max(10, 0.02 * n)
        if keep.sum() >= 3:  # rare classes fold into their runner-up among kept classes
            proj[:, ~keep] = -np.inf
            labels = proj.argmax(axis=1)
        else:  # degenerate projections: equal-frequency bins of the latent instead
            labels = np.searchsorted(np.quantile(latent, np.linspace(0, 1, k + 1)[1:-1]), latent)
        names = {c: f"class_{i}" for i, c in enumerate(np.unique(labels))}
        target = np.array([names[c] for c in labels], dtype=object)
        k = len(names)
        spec["n_classes"] = k
    spec["metric"] = metric
    df = pd.DataFrame(frame)
    missing = float(rng.uniform(*cfg.missing))
    for col in df.columns:
        if rng.random() < 0.5:
            df.loc[rng.random(n) < missing, col] = np.nan
    spec["missing"] = round(missing, 3)
    df["target"] = target
    return df, spec


def generate_task(
    seed: int,
    root: str | Path | None = None,
    config: ProceduralConfig | None = None,
    *,
    leaderboard: bool = False,
    executor: Any = None,
) -> Task:
    """Write procedural task ``proc_<seed>`` under ``root`` (default :func:`default_task_cache`).

    ``leaderboard=True`` also executes the small reference pool and writes its leaderboard.
    """
    cfg = config or ProceduralConfig()
    df, spec = generate_frame(seed, cfg)
    classification = spec["task_type"] != "regression"
    train, test = train_test_split(
        df, test_size=cfg.test_fraction, random_state=seed, stratify=df["target"] if classification else None
    )
    task = write_task(
        Path(root) if root is not None else default_task_cache(),
        f"proc_{seed:06d}",
        train.reset_index(drop=True),
        test.reset_index(drop=True),
        target="target",
        task_type=spec["task_type"],
        metric=spec["metric"],
        question=f"Predict `target` from synthetic features (procedural task, seed {seed}: {spec['n_rows']} rows, "
        f"noise {spec['noise']}, missing share up to {spec['missing']}).",
        source=f"wmrl-envs procedural generator, seed {seed}",
        licence="CC0-1.0 (synthetic)",
        origin="procedural",
        positive_class="yes" if spec["task_type"] == "binary" else None,
        title=f"Procedural task {seed}",
    )
    if leaderboard:
        from wmrl_envs.autoresearch.leaderboard import LeaderboardConfig, build_leaderboards

        build_leaderboards([task], executor, LeaderboardConfig(size="small", broken=False, write_logs=False))
    return task
