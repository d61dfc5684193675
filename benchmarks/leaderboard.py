"""``leaderboard``: agents on every registered held-out AutoResearch env (real execution).

Agents (``agents`` knob):

* ``strong-baseline``: a fixed strong solution for every task — the plan ``strong_plan``
  (gradient boosting by default) rendered into a full script by
  :func:`agents.llm.scaffolds.render_plan`;
* ``random-plan``: a plan with a uniformly random model family and hyperparameters per
  sample, rendered the same way;
* ``untrained``: the LLM policy (``policy``) as shipped, through ``scaffold``;
* ``checkpoint:<dir>``: the LLM policy with the trainable weights of a trainer checkpoint,
  a run directory of ``python -m agents.llm train`` (its ``checkpoint/``), or a directory with
  such a ``policy.pt`` (e.g. ``runs/speedup-.../arms/wmrl-seed0`` of a
  ``speedup --save-policies true`` run). A checkpoint that records its setup is loaded with
  its own policy, LoRA and scaffold; otherwise ``policy`` and ``scaffold`` apply.

Names, tasks (held-out only: a training task is refused, not reported as held-out) and
checkpoint paths are checked when the config is built, before anything loads.

Every agent gets ``k`` samples per held-out task (the catalog ``test`` split, each registered
as ``wmrl/AutoResearch-<task>-v0``) and is scored with the paper's avg@k
(:func:`agents.llm.evaluate.task_score`: valid rate x mean best leaderboard percentile).

Classes: :class:`LeaderboardConfig`. Functions: :func:`run`, :func:`random_plan`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from agents.llm.checks import check_choice, check_policy, check_tasks, resolve_checkpoint, saved_setup
from agents.llm.loading import load_policy
from benchmarks.common import new_figure, save_figure, summarize_seeds, task_split
from benchmarks.report import machine_summary, markdown_table, write_results
from wmrl_envs.config_cli import config_to_dict

__all__ = ["LeaderboardConfig", "CONFIG", "run", "random_plan", "BUILTIN_AGENTS"]

NAME = "leaderboard"
BUILTIN_AGENTS = ("strong-baseline", "random-plan", "untrained")


@dataclass
class LeaderboardConfig:
    """Knobs of the leaderboard.

    Attributes:
        agents: agents to evaluate: ``strong-baseline``, ``random-plan``, ``untrained``, ``checkpoint:<dir>``.
        seeds: sampling seeds; mean and spread over them.
        k: samples per task (avg@k).
        tasks: held-out task ids (none = every registered test-split env).
        max_tasks: only the first N tasks (none = all).
        max_turns: env turns per episode.
        policy: LLM of ``untrained`` / ``checkpoint:`` agents: ``default`` (SmolLM2), ``tiny`` or ``tiny-plan``.
        scaffold: scaffold of the LLM agents: ``plan`` or ``raw``.
        max_new_tokens: tokens sampled per turn by LLM agents.
        temperature: sampling temperature of LLM agents.
        strong_plan: the plan of ``strong-baseline`` (key: value lines, see PlanScaffold).
        wall_seconds: time limit of one solution run (none = each task's own: 60 s for small-tier
            tasks, 120 s for full-tier ones, what ``wmrl-tasks byo`` chose for a task of your own).
    """

    agents: tuple[str, ...] = BUILTIN_AGENTS
    seeds: tuple[int, ...] = (0,)
    k: int = 2
    tasks: tuple[str, ...] | None = None
    max_tasks: int | None = None
    max_turns: int = 1
    policy: str = "default"
    scaffold: str = "plan"
    max_new_tokens: int = 64
    temperature: float = 1.0
    strong_plan: str = "model: gradient_boosting\nn_estimators: 200\nlearning_rate: 0.05\nmax_depth: 6"
    wall_seconds: float | None = None

    def __post_init__(self) -> None:
        for agent in self.agents:
            if agent not in BUILTIN_AGENTS and not agent.startswith("checkpoint:"):
                raise ValueError(f"unknown agent {agent!r}; use {', '.join(BUILTIN_AGENTS)} or checkpoint:<dir>")
        if not self.agents or not self.seeds:
            raise ValueError("agents and seeds must be non-empty")
        if self.k < 1 or self.max_turns < 1:
            raise ValueError("k and max_turns must be >= 1")
        from agents.llm.scaffolds import SCAFFOLDS

        check_tasks(self.tasks, split="test", flag="--tasks")
        check_policy(self.policy)
        check_choice("--scaffold", self.scaffold, sorted(SCAFFOLDS))
        for agent in self.agents:
            if agent.startswith("checkpoint:"):
                resolve_checkpoint(agent.split(":", 1)[1], flag="--agents checkpoint:")


CONFIG = LeaderboardConfig


def random_plan(rng: np.random.Generator) -> Any:
    """A plan with a uniformly random model family and hyperparameters."""
    from agents.llm.scaffolds import MODEL_FAMILIES, Plan

    return Plan(
        model=str(rng.choice(MODEL_FAMILIES)),
        n_estimators=int(rng.integers(10, 301)),
        max_depth=None if rng.random() < 0.3 else int(rng.integers(1, 31)),
        learning_rate=float(10 ** rng.uniform(-2, 0)),
        C=float(10 ** rng.uniform(-3, 3)),
        n_neighbors=int(rng.integers(1, 101)),
        impute=str(rng.choice(["mean", "median"])),
        scale=bool(rng.random() < 0.5),
        categorical=str(rng.choice(["onehot", "drop"])),
    )


def _held_out_tasks(config: LeaderboardConfig) -> list[str]:
    import gymnasium as gym

    import wmrl_envs  # noqa: F401  (registers the env ids)

    tasks = task_split("test", config.tasks, config.max_tasks)
    missing = [t for t in tasks if _env_id(t) not in gym.registry and not _is_task_dir(t)]
    if missing:
        raise ValueError(
            f"held-out tasks without a registered env: {missing}; pass a catalog test-split id or a task "
            "directory (one with a task.json, e.g. written by `wmrl-tasks byo`)"
        )
    return tasks


def _env_id(task: str) -> str:
    return f"wmrl/AutoResearch-{task}-v0"


def _is_task_dir(task: str) -> bool:
    return (Path(task) / "task.json").is_file()


def _make_env(task: str, **kwargs: Any) -> Any:
    """The task's registered env, or for a task directory (e.g. bring-your-own) the generic
    env fixed to it."""
    import gymnasium as gym

    if _is_task_dir(task):
        return gym.make("wmrl/AutoResearch-v0", task=task, **kwargs)
    return gym.make(_env_id(task), **kwargs)


def _script_agent(
    config: LeaderboardConfig, tasks: Sequence[str], seed: int, choose: Callable[[Any, np.random.Generator], str]
) -> list[Any]:
    """``k`` episodes per task through each task's registered env, actions from ``choose(spec, rng)``."""

    from agents.llm.evaluate import task_score
    from agents.llm.scaffolds import TaskSpec

    rng = np.random.default_rng(seed)
    scores = []
    for task in tasks:
        env = _make_env(task, max_turns=config.max_turns, wall_seconds=config.wall_seconds)
        trajectories, rewards = [], []
        try:
            for sample in range(config.k):
                _, info = env.reset(seed=seed * 1000 + sample)
                spec = TaskSpec.from_info(info)
                done = False
                while not done:
                    _, _, terminated, truncated, info = env.step(choose(spec, rng))
                    done = terminated or truncated
                trajectories.append(info.get("outcomes") or [])
                rewards.append(info.get("trajectory_reward"))
        finally:
            env.close()
        scores.append(task_score(task, str(info.get("category") or spec.task_type), trajectories, rewards))
    return scores


def _evaluate_agent(
    agent: str, config: LeaderboardConfig, tasks: Sequence[str], seed: int, policies: dict[str, Any]
) -> list[Any]:
    from agents.llm.scaffolds import make_scaffold, parse_plan, render_plan

    fenced = lambda script: f"```python\n{script}\n```"  # noqa: E731
    if agent == "strong-baseline":
        plan = parse_plan(config.strong_plan)
        if plan is None:
            raise ValueError(f"strong_plan names no known model family: {config.strong_plan!r}")
        return _script_agent(config, tasks, seed, lambda spec, rng: fenced(render_plan(plan, spec)))
    if agent == "random-plan":
        return _script_agent(config, tasks, seed, lambda spec, rng: fenced(render_plan(random_plan(rng), spec)))
    from agents.llm.evaluate import evaluate_heldout

    checkpoint = resolve_checkpoint(agent.split(":", 1)[1]) if agent.startswith("checkpoint:") else None
    setup = (saved_setup(checkpoint).get("setup") or {}) if checkpoint is not None else {}
    if agent not in policies:  # a self-describing checkpoint loads with the policy it was trained with
        policies[agent] = load_policy(
            setup.get("policy", config.policy), checkpoint=checkpoint, lora=bool(setup.get("lora", False))
        )
    result = evaluate_heldout(
        policies[agent], make_scaffold(setup.get("scaffold", config.scaffold)), list(tasks), k=config.k, max_new_tokens=config.max_new_tokens,
        temperature=config.temperature, seed=seed, max_turns=config.max_turns, wall_seconds=config.wall_seconds,
    )  # fmt: skip
    return result.tasks


def run(config: LeaderboardConfig, run_dir: Path, *, progress: bool = True) -> dict[str, Any]:
    """Every agent x seed on every held-out task; writes ``results.json``, ``results.md``, ``leaderboard.png``."""
    started = time.perf_counter()
    tasks = _held_out_tasks(config)
    policies: dict[str, Any] = {}
    rows: list[dict[str, Any]] = []
    for agent, seed in tqdm(
        [(a, s) for a in config.agents for s in config.seeds], desc="leaderboard", disable=not progress
    ):
        t0 = time.perf_counter()
        scores = _evaluate_agent(agent, config, tasks, seed, policies)
        known = [s.score for s in scores if s.score is not None]
        rows.append(
            {
                "agent": agent,
                "seed": seed,
                "avg_at_k": float(np.mean(known)) if known else None,
                "valid_rate": float(np.mean([s.valid_rate for s in scores])),
                "seconds": time.perf_counter() - t0,
                **{f"task:{s.task_id}": s.score for s in scores},
            }
        )
    task_keys = [f"task:{t}" for t in tasks]
    summary = summarize_seeds(rows, "agent", ("avg_at_k", "valid_rate", "seconds", *task_keys))
    result = {
        "experiment": NAME,
        "config": config_to_dict(config),
        "machine": machine_summary(),
        "tasks": tasks,
        "total_wall_s": time.perf_counter() - started,
        "summary": summary,
        "per_seed": rows,
    }
    result["plot"] = str(_plot(summary, tasks, run_dir / "leaderboard.png", config.k))
    return write_results(run_dir, result, tables(result))


def _cell(row: Mapping[str, Any], key: str) -> str | None:
    mean, sd = row.get(key), row.get(f"{key}_sd")
    if mean is None:
        return None
    return f"{mean:.3f}" if not sd else f"{mean:.3f} ± {sd:.2f}"


def tables(result: Mapping[str, Any]) -> str:
    """Agents (rows) x mean avg@k, valid rate and per-task avg@k (columns)."""
    k = result["config"]["k"]
    rows = [
        {
            "agent": r["agent"],
            "seeds": r["seeds"],
            f"avg@{k}": _cell(r, "avg_at_k"),
            "valid rate": _cell(r, "valid_rate"),
            **{t: _cell(r, f"task:{t}") for t in result["tasks"]},
        }
        for r in result["summary"]
    ]
    note = f"avg@{k} = valid rate x mean best leaderboard percentile per task (— = unknown: the task has no leaderboard yet), real execution, {len(result['tasks'])} held-out tasks."
    return markdown_table(rows) + "\n\n" + note


def _plot(summary: Sequence[Mapping[str, Any]], tasks: Sequence[str], path: Path, k: int = 0) -> Path:
    """Grouped bars: one group per task (plus their mean when there are several tasks), one bar
    per agent, each labelled with its value so a zero score is visible; legend outside."""
    keys = (["avg_at_k"] if len(tasks) > 1 else []) + [f"task:{t}" for t in tasks]
    labels = (["mean over tasks"] if len(tasks) > 1 else []) + list(tasks)
    fig, ax = new_figure(max(6.0, 0.55 * len(keys) * max(1, len(summary)) + 2.5), 4.0)
    width = 0.8 / max(1, len(summary))
    for j, r in enumerate(summary):
        ys = [r[key] if r[key] is not None else np.nan for key in keys]
        es = [r[f"{key}_sd"] or 0.0 for key in keys]
        bars = ax.bar(np.arange(len(keys)) + j * width, ys, width, yerr=es, capsize=2, label=r["agent"])
        ax.bar_label(bars, labels=["n/a" if np.isnan(y) else f"{y:.2f}" for y in ys], fontsize=6, padding=1)
    ax.set_xticks(np.arange(len(labels)) + width * (len(summary) - 1) / 2, labels, rotation=45, ha="right", fontsize=8)
    ax.set_ylabel(f"avg@{k} (real execution)" if k else "avg@k (real execution)")
    ax.set_ylim(0, 1.08)  # avg@k lies in [0, 1]; the headroom keeps the value labels inside
    ax.set_title("agents on held-out tasks")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    return save_figure(fig, path)
