"""Accounting pieces of the speedup benchmark: what each arm pays for, and what it is compared with.

* :class:`OutcomeCache` — one per arm: (script, inputs, limits) -> the sandbox result, so a
  script executed once is never executed again in that arm; hits cost nothing and are
  counted. Arms never share a cache (work cached by one arm is not reused unpaid by another).
* :class:`ScriptCounter` — wraps an arm's world model (and sees its cache's runs): distinct
  scripts per task that the arm's policy wrote, graded either way.
* :func:`fit_out_of_sample_world_model` — a world model whose fit set holds none of the
  policy's training or held-out tasks, with its fit set, the overlap (must be empty) and its
  one-off cost: fit CPU-seconds and the logged CPU-seconds of the executions it learned from.
* :func:`bootstrap_ci` — percentile bootstrap of a mean over seeds.
* :func:`reach_cost` / :func:`reach_ratios` — cost at which a held-out curve first reaches a
  target at a *measured* evaluation point (no interpolation, no extrapolation), and the
  ratios of the real arm's cost to each other arm's, for two targets: the real arm's final
  score and 95% of its gain over the start.

>>> lo, hi = bootstrap_ci([1.0, 2.0, 3.0, 4.0, 5.0], n_boot=2000, seed=0)
>>> 1.5 < lo < 3.0 < hi < 4.5
True
>>> reach_cost([{"cost_cpu_s": 0, "heldout": 0.2}, {"cost_cpu_s": 10, "heldout": 0.5}, {"cost_cpu_s": 20, "heldout": 0.7}], 0.6)
20.0
"""

from __future__ import annotations

import copy
import hashlib
import math
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

__all__ = [
    "OutcomeCache",
    "ScriptCounter",
    "fit_out_of_sample_world_model",
    "bootstrap_ci",
    "reach_cost",
    "reach_ratios",
    "script_key",
]


def script_key(script: str, inputs: Mapping[str, Any] | None, limits: Any) -> str:
    """The cache key of one run: the script, the input files and the limits."""
    items = sorted((k, str(v)) for k, v in (inputs or {}).items())
    return hashlib.sha256(repr((script, items, limits)).encode()).hexdigest()


def _task_of(inputs: Mapping[str, Any] | None) -> str:
    """The task a run belongs to: the directory of its ``data/train.csv`` input."""
    path = str((inputs or {}).get("data/train.csv", ""))
    parts = path.rstrip("/").split("/")
    return parts[-3] if len(parts) >= 3 else path


class OutcomeCache:
    """An executor that runs each distinct (script, inputs, limits) once (see the module docstring).

    Args:
        executor: the real executor (default: :func:`wmrl_envs.sandbox.default_executor`).
    """

    def __init__(self, executor: Any = None) -> None:
        if executor is None:
            from wmrl_envs.sandbox import default_executor

            executor = default_executor()
        self.executor = executor
        self._results: dict[str, Any] = {}
        self._lock = threading.Lock()
        self.runs = self.hits = 0
        self.scripts: dict[str, set[str]] = {}

    def run(
        self, script: str, *, inputs: Mapping[str, Any] | None = None, outputs: Sequence[str] = (), limits: Any = None
    ) -> Any:
        key = script_key(script, inputs, limits)
        with self._lock:
            self.scripts.setdefault(_task_of(inputs), set()).add(hashlib.sha256(script.encode()).hexdigest())
            if key in self._results:
                self.hits += 1
                return self._results[key]
        result = self.executor.run(script, inputs=inputs, outputs=outputs, limits=limits)
        with self._lock:
            self.runs += 1
            if getattr(result, "status", None) in ("ok", "error", "timeout", "killed_memory", "killed_limit"):
                self._results[key] = result  # a harness failure is not an outcome: it reruns
        return result

    def __getattr__(self, name: str) -> Any:  # backend, sandboxed, ... of the real executor
        if name == "executor" or name.startswith("__"):  # copy / pickle probe a half-built instance
            raise AttributeError(name)
        return getattr(self.executor, name)


class ScriptCounter:
    """A world-model proxy that records which distinct scripts it graded, per task."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.scripts: dict[str, set[str]] = {}

    def predict(self, contexts: Sequence[Mapping[str, Any]], actions: Sequence[Any]) -> list[Any]:
        for ctx, action in zip(contexts, actions):
            task = str(ctx.get("task_id", "?"))
            self.scripts.setdefault(task, set()).add(hashlib.sha256(str(action).encode()).hexdigest())
        return self.model.predict(contexts, actions)

    def __getattr__(self, name: str) -> Any:
        if name == "model" or name.startswith("__"):  # copy / pickle probe a half-built instance
            raise AttributeError(name)
        return getattr(self.model, name)

    def __deepcopy__(self, memo: dict[int, Any]) -> ScriptCounter:
        """A copy of the model that records into the same per-task sets: a world-model refit
        (:class:`~agents.grpo.WorldModelUpdater` grades with a deep copy once it is swapped in)
        must not lose the scripts its copy grades from the arm's count."""
        twin = ScriptCounter(copy.deepcopy(self.model, memo))
        twin.scripts = self.scripts
        return twin


def distinct_scripts(*sources: Mapping[str, set[str]]) -> dict[str, int]:
    """Distinct scripts per task over several recorders (union per task)."""
    merged: dict[str, set[str]] = {}
    for source in sources:
        for task, hashes in source.items():
            merged.setdefault(task, set()).update(hashes)
    return {task: len(h) for task, h in sorted(merged.items())}


def fit_out_of_sample_world_model(policy_tasks: Sequence[str], *, progress: bool = False) -> tuple[Any, dict[str, Any]]:
    """A :class:`~wmrl_envs.world_models.CodeOutcomeModel` (the default recipe) fitted on every
    shipped log whose task is not in ``policy_tasks``: the catalog's template pool logs, the
    log corpus and the agent-style corpus (its train split). Returns ``(model, info)`` with
    ``fit_tasks``, ``overlap`` (``policy_tasks`` in the fit set: ``[]``), ``fit_records``,
    ``fit_cpu_s`` and ``fit_logged_cpu_s`` (CPU-seconds of the logged executions it learned
    from, where logged)."""
    from wmrl_envs.autoresearch.leaderboard import logs_root
    from wmrl_envs.world_models import CodeOutcomeConfig, CodeOutcomeModel, read_logs
    from wmrl_envs.world_models.agent_corpus import read_agent_corpus
    from wmrl_envs.world_models.corpus import read_corpus
    from wmrl_envs.world_models.landmarks import with_landmarks

    excluded = set(policy_tasks)
    records = (
        read_logs(sorted(logs_root().glob("*.jsonl"))) + read_corpus() + read_agent_corpus(splits=["train", "heldout"])
    )
    records = with_landmarks([r for r in records if r.task_id not in excluded], warn=False)
    t0 = time.process_time()
    model = CodeOutcomeModel(CodeOutcomeConfig()).fit(records)
    fit_cpu = time.process_time() - t0
    logged = 0.0
    for r in records:
        cpu = (r.outcome.metrics or {}).get("cpu_seconds") if r.outcome is not None else None
        if isinstance(cpu, (int, float)) and math.isfinite(cpu):
            logged += float(cpu)
    fit_tasks = sorted({r.task_id for r in records})
    info = {
        "fit_tasks": fit_tasks,
        "overlap": sorted(excluded & set(fit_tasks)),
        "fit_records": len(records),
        "fit_cpu_s": fit_cpu,
        "fit_logged_cpu_s": logged,
    }
    return model, info


def bootstrap_ci(
    values: Sequence[float | None], *, n_boot: int = 10_000, level: float = 0.95, seed: int = 0
) -> tuple[float, float] | None:
    """Percentile bootstrap confidence interval of the mean of ``values`` (``None`` excluded);
    ``None`` with fewer than two values."""
    xs = np.array([v for v in values if v is not None and math.isfinite(v)], dtype=np.float64)
    if len(xs) < 2:
        return None
    rng = np.random.default_rng(seed)
    means = xs[rng.integers(0, len(xs), size=(n_boot, len(xs)))].mean(axis=1)
    alpha = (1.0 - level) / 2.0
    return float(np.quantile(means, alpha)), float(np.quantile(means, 1.0 - alpha))


def reach_cost(curve: Sequence[Mapping[str, Any]], target: float) -> float | None:
    """The cost of the first *measured* evaluation point at or above ``target`` (``None`` if none)."""
    for p in curve:
        if p.get("heldout") is not None and p["heldout"] >= target - 1e-12:
            return float(p["cost_cpu_s"])
    return None


def reach_ratios(
    real_curve: Sequence[Mapping[str, Any]], other_curve: Sequence[Mapping[str, Any]], one_off_cost: float = 0.0
) -> dict[str, Any]:
    """Real arm's cost / the other arm's cost to reach (a) the real arm's final score and (b)
    95% of its gain over the start, at measured points; ``*_amortized`` adds ``one_off_cost``
    (the world model's) to the other arm's cost. ``None`` where a target is undefined (the
    real arm did not improve) or not reached."""
    known = [p for p in real_curve if p.get("heldout") is not None]
    out: dict[str, Any] = {
        k: None for k in ("ratio_final", "ratio_95gain", "ratio_final_amortized", "ratio_95gain_amortized")
    }
    if len(known) < 2 or known[-1]["heldout"] <= known[0]["heldout"]:
        out["note"] = "undefined: the real arm did not improve over its start"
        return out
    start, final = known[0]["heldout"], known[-1]["heldout"]
    for name, target in (("final", final), ("95gain", start + 0.95 * (final - start))):
        real_cost, other_cost = reach_cost(real_curve, target), reach_cost(other_curve, target)
        out[f"target_{name}"] = target
        if real_cost is None or other_cost is None:
            continue
        # Both reach at the start point (cost 0): no training was needed, so no ratio.
        if other_cost > 0:
            out[f"ratio_{name}"] = real_cost / other_cost
        if other_cost + one_off_cost > 0:
            out[f"ratio_{name}_amortized"] = real_cost / (other_cost + one_off_cost)
    return out
