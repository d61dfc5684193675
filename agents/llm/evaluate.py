"""Held-out evaluation of an LLM policy: avg@k with the paper's AutoResearch metric.

Per task, ``k`` trajectories are sampled. The task's score is
``valid_rate x mean_best_percentile``: the share of trajectories with at least one valid
submission, times the mean over those valid trajectories of their best leaderboard
percentile (``Outcome.metrics["percentile"]``). Scores are averaged over tasks and per
category (the reset info's ``category`` when the env provides one, else the task type).
A valid submission whose percentile is unknown (task without a leaderboard) is left out of
the mean; a task whose every valid trajectory is unknown has score ``None``.

Use a real-execution env (no world-model wrapper, or ``mode="env"``) for evaluation.

Classes: :class:`TaskScore`, :class:`EvalResult`. Functions: :func:`task_score`,
:func:`summarize`, :func:`evaluate` (through a given env), :func:`evaluate_heldout` (builds
the real-execution vector env itself).

>>> from wmrl_envs.outcome import Outcome
>>> v = lambda p: Outcome("valid", 0.5 + p / 2, metrics={"percentile": p})
>>> task_score("t", "binary", [[v(0.2), v(0.6)], [Outcome("runtime_error", 0.1)]]).score
0.3
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from agents.llm.policy import LLMPolicy
from agents.llm.rollout import PhaseTimer, Rollout
from agents.llm.scaffolds import Scaffold

__all__ = ["TaskScore", "EvalResult", "task_score", "summarize", "evaluate", "evaluate_heldout"]


@dataclass(frozen=True)
class TaskScore:
    """avg@k of one task.

    Attributes:
        task_id, category: the task and its category.
        k: trajectories sampled.
        valid_rate: share of trajectories with a valid submission.
        mean_best_percentile: mean best percentile over valid trajectories with a known
            percentile (``None`` when there are none).
        score: ``valid_rate * mean_best_percentile``; 0.0 when nothing was valid; ``None``
            when valid trajectories exist but none has a known percentile.
        mean_reward: mean trajectory reward (``None`` rewards excluded), for reference.
        statuses: trajectories by the status of their last graded outcome (``valid``,
            ``syntax_error``, ``runtime_error``, ...; ``ungraded`` when none was graded):
            what the invalid ones got wrong.
    """

    task_id: str
    category: str
    k: int
    valid_rate: float
    mean_best_percentile: float | None
    score: float | None
    mean_reward: float | None = None
    statuses: dict[str, int] = field(default_factory=dict)


def _best_percentile(outcomes: Sequence[Any]) -> tuple[bool, float | None]:
    valid = [o for o in outcomes if o is not None and o.status == "valid"]
    known = [float(o.metrics["percentile"]) for o in valid if o.metrics.get("percentile") is not None]
    return bool(valid), (max(known) if known else None)


def task_score(
    task_id: str, category: str, trajectories: Sequence[Sequence[Any]], rewards: Sequence[float | None] = ()
) -> TaskScore:
    """The metric for one task from its trajectories' execute-turn outcomes."""
    if not trajectories:
        raise ValueError(f"task {task_id!r}: no trajectories to score")
    flags = [_best_percentile(t) for t in trajectories]
    valid_rate = sum(v for v, _ in flags) / len(flags)
    known = [p for v, p in flags if v and p is not None]
    mean_best = float(np.mean(known)) if known else None
    if valid_rate == 0:
        score: float | None = 0.0
    else:
        score = None if mean_best is None else round(valid_rate * mean_best, 12)
    graded = [r for r in rewards if r is not None]
    last = [next((str(o.status) for o in reversed(t) if o is not None), "ungraded") for t in trajectories]
    return TaskScore(
        task_id, category, len(trajectories), valid_rate, mean_best, score, float(np.mean(graded)) if graded else None,
        dict(sorted(Counter(last).items())),
    )  # fmt: skip


@dataclass
class EvalResult:
    """Per-task scores and their averages (``None`` scores excluded from averages)."""

    tasks: list[TaskScore]
    mean: float | None
    by_category: dict[str, float | None] = field(default_factory=dict)
    valid_rate: float | None = None
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "mean": self.mean,
            "by_category": self.by_category,
            "valid_rate": self.valid_rate,
            "seconds": self.seconds,
            "tasks": [t.__dict__ for t in self.tasks],
        }


def summarize(scores: Sequence[TaskScore], seconds: float = 0.0) -> EvalResult:
    """Average task scores overall and by category."""

    def avg(xs: Sequence[float | None]) -> float | None:
        known = [x for x in xs if x is not None]
        return float(np.mean(known)) if known else None

    cats = sorted({s.category for s in scores})
    return EvalResult(
        tasks=list(scores),
        mean=avg([s.score for s in scores]),
        by_category={c: avg([s.score for s in scores if s.category == c]) for c in cats},
        valid_rate=avg([s.valid_rate for s in scores]),
        seconds=seconds,
    )


def evaluate(
    policy: LLMPolicy,
    env: Any,
    scaffold: Scaffold,
    tasks: Sequence[str],
    *,
    k: int = 8,
    max_new_tokens: int = 96,
    temperature: float = 1.0,
    top_p: float = 1.0,
    seed: int = 0,
) -> EvalResult:
    """avg@k of ``policy`` on ``tasks`` through ``env`` (``k`` samples per task, one group each).

    A vector env needs ``num_envs`` a multiple of ``k``.
    """
    if not tasks:
        raise ValueError("evaluate: `tasks` is empty")
    rollout = Rollout(
        env, policy, scaffold, group_size=k, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p
    )
    timer = PhaseTimer()
    t0 = time.perf_counter()
    episodes = rollout.run([(t, f"eval-{seed}-{j}") for j, t in enumerate(tasks)], timer, seed=seed)
    scores = []
    for j, t in enumerate(tasks):
        members = [e for e in episodes if e.group_id == f"eval-{seed}-{j}"]
        category = str(members[0].category) if members else "unknown"
        scores.append(task_score(t, category, [e.outcomes for e in members], [e.reward for e in members]))
    return summarize(scores, time.perf_counter() - t0)


def evaluate_heldout(
    policy: LLMPolicy,
    scaffold: Scaffold,
    tasks: Sequence[str],
    *,
    k: int = 8,
    tasks_per_round: int | None = None,
    max_new_tokens: int = 96,
    temperature: float = 1.0,
    top_p: float = 1.0,
    seed: int = 0,
    vectorization: str = "sync",
    split: str = "test",
    **env_kwargs: Any,
) -> EvalResult:
    """:func:`evaluate` through a fresh real-execution vector env of ``wmrl/AutoResearch-v0``
    on the catalog's ``split`` (``"test"``: held-out tables; ``"train"`` to measure the
    policy on the tables it trains on) (``env_kwargs``: ``max_turns``, ``wall_seconds``, ...),
    closed afterwards.

    ``tasks_per_round`` tasks are rolled out side by side (default: all, one round), so one
    batched generation serves ``k x tasks_per_round`` slots.
    """
    from wmrl_envs.vector import make_vector_env

    per_round = max(1, min(len(tasks), tasks_per_round or len(tasks)))
    env = make_vector_env("wmrl/AutoResearch-v0", k * per_round, vectorization=vectorization, split=split, **env_kwargs)
    try:
        return evaluate(
            policy,
            env,
            scaffold,
            tasks,
            k=k,
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            top_p=top_p,
            seed=seed,
        )
    finally:
        env.close()
