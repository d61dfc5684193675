"""The paper's VLA evaluation protocol: Avg / Best@8 / All@8 success per task and init-state split.

For each initial state, ``trials`` (8) episodes are run; ``Avg`` is the mean success over all
episodes, ``Best@8`` the share of initial states solved at least once, ``All@8`` the share
solved every time. Splits: ID = init states 0-15 (GRPO trains there), OOD = 16-49.

Every success rate comes with its Wilson 95% interval (:func:`wilson_interval`), per task and
pooled over tasks (:func:`overall_rows`).

Classes: :class:`EvalConfig`, :class:`RandomPolicy`. Functions: :func:`success_metrics`,
:func:`wilson_interval`, :func:`agrees`, :func:`frame_errors`, :func:`overall_rows`, :func:`summarize`, :func:`load_policy`, :func:`policy_env`,
:func:`evaluate_policy`, :func:`evaluate_tasks`, :func:`markdown_table`.

>>> success_metrics({0: [True] * 8, 1: [False, True] + [False] * 6, 2: [False] * 8})
{'avg': 0.375, 'successes': 9, 'avg_ci95': [0.2116, 0.5729], 'best_at_k': 0.6667, 'all_at_k': 0.3333, 'init_states': 3, 'episodes': 24}
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

__all__ = [
    "EvalConfig",
    "success_metrics",
    "wilson_interval",
    "frame_errors",
    "agrees",
    "overall_rows",
    "summarize",
    "load_policy",
    "policy_env",
    "evaluate_policy",
    "evaluate_tasks",
    "markdown_table",
    "RandomPolicy",
]


@dataclass
class EvalConfig:
    """Settings of ``python -m agents.vla evaluate``.

    Attributes:
        policy: what to evaluate: a MiniVLA checkpoint directory, ``expert`` (the scripted
            privileged expert) or ``random`` (uniform actions).
        tasks: LIBERO-Long task indices.
        init_states: initial states (default: ID 0-15; OOD is 16-49).
        ood_from: initial states from this index on are reported as OOD, the ones below as
            ID (the states GRPO trains on: LIBERO's 0-15).
        trials: episodes per initial state (the paper's 8).
        temperature: sampling temperature of the VLA (0 = greedy).
        action_repeat: env steps each decision is held for (as in training).
        execute_actions: actions of each predicted chunk executed before the policy decides
            again (``None``: all ``K``, open loop, as in training; ``1``: receding horizon, a
            decision every ``action_repeat`` env steps at ``K`` times the decisions' CPU).
        image_size: side of the rendered camera views.
        max_episode_steps: episode limit (LIBERO-Long's evaluation uses 520).
        env_cameras: take the policy's views from the env's camera observations (rendered at
            every env step). Default ``False``: render them at decision steps only, as the
            demonstrations (``python -m agents.vla demos``), GRPO rollouts and the SFT run's
            evaluation do (4x fewer renders at ``action_repeat=4``). robosuite samples camera
            observations inside the control step, so the two differ slightly (mean absolute
            difference 0.16 / 255 on the agent view after three steps of task 7), and a
            policy should be shown the kind it was trained on.
        seed: seed of the policy's sampling and the env resets.
        output: JSON file to write (``None``: print only).
    """

    policy: str = "random"
    tasks: tuple[int, ...] = (7,)
    init_states: tuple[int, ...] = tuple(range(16))
    ood_from: int = 16
    trials: int = 8
    temperature: float = 1.0
    action_repeat: int = 4
    execute_actions: int | None = None
    image_size: int = 64
    max_episode_steps: int = 520
    env_cameras: bool = False
    seed: int = 0
    output: str | None = None


def wilson_interval(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval of a success rate (95% for ``z = 1.96``): unlike the normal
    approximation it stays inside [0, 1] and is not empty at 0 or n successes.

    >>> [round(x, 3) for x in wilson_interval(1, 8)]
    [0.022, 0.471]
    >>> wilson_interval(0, 0)
    (0.0, 1.0)
    """
    if n <= 0:
        return (0.0, 1.0)
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return (max(0.0, float(centre - half)), min(1.0, float(centre + half)))


def success_metrics(successes: Mapping[int, Sequence[bool]]) -> dict[str, Any]:
    """Avg (with ``successes``, ``episodes`` and its Wilson 95% interval ``avg_ci95``) /
    Best@k / All@k from ``{init_state: [success per trial]}``."""
    if not successes:
        raise ValueError("no episodes")
    per = [np.asarray(v, dtype=bool) for v in successes.values()]
    wins, n = int(sum(v.sum() for v in per)), int(sum(len(v) for v in per))
    return {
        "avg": round(float(np.mean(np.concatenate(per))), 4),
        "successes": wins,
        "avg_ci95": [round(x, 4) for x in wilson_interval(wins, n)],
        "best_at_k": round(float(np.mean([v.any() for v in per])), 4),
        "all_at_k": round(float(np.mean([v.all() for v in per])), 4),
        "init_states": len(per),
        "episodes": int(sum(len(v) for v in per)),
    }


ARM_TOLERANCE = 0.3
"""An arm action (normalised to [-1, 1]) further than this from the expert's label counts as wrong."""


def agrees(policy_action: np.ndarray, label: np.ndarray, tolerance: float = 0.2) -> Any:
    """Whether a policy action matches the expert's label: every arm dimension within
    ``tolerance`` (actions live in [-1, 1]) and the same gripper command. One ``(7,)`` action
    gives a ``bool``, ``(n, 7)`` rows a boolean array.

    >>> agrees(np.array([0.1, 0, 0, 0, 0, 0, -1.0]), np.array([0.2, 0, 0, 0, 0, 0, -1.0]))
    True
    >>> agrees(np.array([[0.1, 0, 0, 0, 0, 0, 1.0]] * 2), np.array([[0.1, 0, 0, 0, 0, 0, -1.0], [0.5, 0, 0, 0, 0, 0, 1.0]]))
    array([False, False])
    """
    actions, labels = np.atleast_2d(policy_action), np.atleast_2d(label)
    arm_ok = np.abs(actions[:, :6] - labels[:, :6]).max(axis=1) <= tolerance
    match = arm_ok & (np.sign(actions[:, 6]) == np.sign(labels[:, 6]))
    return match if np.ndim(policy_action) == 2 else bool(match[0])


def frame_errors(policy: Any, data: Any, arm_tolerance: float = ARM_TOLERANCE, batch: int = 64) -> dict[str, Any]:
    """How often the greedy policy's first action disagrees with the expert's label on the
    frames of ``data`` (a :class:`~agents.vla.demos.DemoDataset`): an arm dimension off by more
    than ``arm_tolerance`` or the wrong gripper sign. An offline dev metric that needs no
    simulator: on training demonstrations it says whether the policy has fitted them, on
    demonstrations from held-out init states whether it generalises. Frames of one episode are
    correlated, so the rate's uncertainty is wider than a per-frame binomial; hence per task
    the ``episodes`` count beside ``frames``.

    Returns ``{"per_task": {instruction: {"frames", "wrong", "rate", "episodes"}},
    "overall": {...}, "arm_tolerance": ...}``; DAgger frames (``(T, K, 7)`` labels) are
    compared on their first label.

    >>> from types import SimpleNamespace
    >>> from agents.vla.demos import DemoDataset, DemoEpisode
    >>> views = np.zeros((3, 8, 8, 3), np.uint8)
    >>> labels = np.array([[0.5, 0, 0, 0, 0, 0, 1], [0, 0, 0, 0, 0, 0, 1], [0, 0, 0, 0, 0, 0, -1]], np.float32)
    >>> ep = DemoEpisode("pick", views, views, np.zeros((3, 9), np.float32), labels)
    >>> class Still:  # never moves, gripper always open (-1)
    ...     def act(self, obs, temperature=1.0):
    ...         a = np.zeros((len(obs["instruction"]), 7), np.float32)
    ...         a[:, 6] = -1
    ...         return SimpleNamespace(actions=a)
    >>> frame_errors(Still(), DemoDataset([ep]))["overall"]
    {'frames': 3, 'wrong': 2, 'rate': 0.6667, 'episodes': 1}
    """
    per_task: dict[str, dict[str, int]] = {}
    for ep in data.episodes:
        labels = ep.actions[:, 0] if ep.actions.ndim == 3 else ep.actions
        wrong = 0
        for start in range(0, len(ep), batch):
            part = slice(start, start + batch)
            n = len(labels[part])
            obs = {
                "agentview_image": ep.agentview[part],
                "wrist_image": ep.wrist[part],
                "proprio": ep.proprio[part],
                "instruction": [ep.instruction] * n,
            }
            first = np.asarray(policy.act(obs, temperature=0.0).actions, dtype=np.float32).reshape(n, -1, 7)[:, 0]
            wrong += int((~agrees(first, labels[part], arm_tolerance)).sum())
        row = per_task.setdefault(ep.instruction, {"frames": 0, "wrong": 0, "episodes": 0})
        row["frames"] += len(labels)
        row["wrong"] += wrong
        row["episodes"] += 1

    def _rated(row: Mapping[str, int]) -> dict[str, Any]:
        rate = round(row["wrong"] / row["frames"], 4) if row["frames"] else None
        return {"frames": row["frames"], "wrong": row["wrong"], "rate": rate, "episodes": row["episodes"]}

    total = {k: sum(r[k] for r in per_task.values()) for k in ("frames", "wrong", "episodes")}
    return {
        "per_task": {name: _rated(row) for name, row in per_task.items()},
        "overall": _rated(total),
        "arm_tolerance": arm_tolerance,
    }


class RandomPolicy:
    """Uniform random actions in [-1, 1] (gripper binarised): the floor of the agents table."""

    def __init__(self, seed: int = 0):
        self.rng = np.random.default_rng(seed)

    def act(self, obs: Mapping[str, Any], temperature: float = 1.0, generator: Any = None) -> Any:
        from types import SimpleNamespace

        n = len(obs["instruction"])
        a = self.rng.uniform(-1, 1, (n, 7)).astype(np.float32)
        a[:, -1] = np.sign(a[:, -1])
        return SimpleNamespace(actions=a, tokens=torch.zeros((n, 7), dtype=torch.long), logprobs=torch.zeros((n, 7)))


def load_policy(name: str, seed: int = 0) -> Any:
    """``"expert"``, a :class:`RandomPolicy` for ``"random"``, else the MiniVLA checkpoint at ``name``."""
    if name == "expert":
        return "expert"
    if name == "random":
        return RandomPolicy(seed)
    from agents.vla.model import MiniVLA

    return MiniVLA.load(name)


def policy_env(task: int, *, env_cameras: bool = False, image_size: int = 64, max_episode_steps: int = 520) -> Any:
    """The LIBERO-Long env a policy acts in: views rendered at decision steps (as the
    demonstrations are recorded), or from the env's camera observations (``env_cameras``)."""
    from wmrl_envs.libero.env import LiberoLongEnv

    return LiberoLongEnv(
        task_id=task,
        cameras=env_cameras,
        image_size=image_size,
        record_frames=False,
        render_mode=None if env_cameras else "rgb_array",
        object_state=False,
        max_episode_steps=max_episode_steps,
    )


def evaluate_policy(
    env: Any,
    policy: Any,
    init_states: Sequence[int],
    trials: int = 8,
    *,
    temperature: float = 1.0,
    seed: int = 0,
    log: Any = None,
    action_repeat: int = 4,
    image_size: int = 64,
    execute_actions: int | None = None,
) -> dict[str, Any]:
    """Success of ``policy`` on ``env`` (one task): per-init successes and :func:`success_metrics`.

    ``policy="expert"`` runs the scripted expert instead of a model; ``execute_actions`` as in
    :class:`EvalConfig`.
    """
    from agents.vla.rollout import RolloutTimes, run_episode

    successes: dict[int, list[bool]] = {}
    times = RolloutTimes()
    gen = torch.Generator().manual_seed(seed)
    t0 = time.perf_counter()
    for k in init_states:
        for trial in range(trials):
            if policy == "expert":
                from agents.vla.expert import run_expert

                ok = run_expert(env, k, seed=seed + trial, action_repeat=action_repeat).success
            else:
                ep = run_episode(
                    env,
                    policy,
                    {"init_state": int(k)},
                    temperature=temperature,
                    generator=gen,
                    keep_rows=False,
                    times=times,
                    seed=seed + trial,
                    action_repeat=action_repeat,
                    image_size=image_size,
                    execute_actions=execute_actions,
                )
                ok = bool(ep.goal_reached)
            successes.setdefault(int(k), []).append(bool(ok))
            if log is not None:
                log(json.dumps({"init_state": int(k), "trial": trial, "success": bool(ok)}))
    return {"per_init": successes, **success_metrics(successes), **times.summary(), "seconds": time.perf_counter() - t0}


def evaluate_tasks(
    policies: Sequence[str],
    tasks: Sequence[int],
    splits: Mapping[str, Sequence[int]],
    trials: int = 8,
    *,
    temperature: float = 1.0,
    seed: int = 0,
    action_repeat: int = 4,
    image_size: int = 64,
    max_episode_steps: int = 520,
    env_cameras: bool = False,
    progress: bool = False,
    execute_actions: int | None = None,
) -> list[dict[str, Any]]:
    """One row per policy x task x split (``{"ID": [0, ..., 15], "OOD": [...]}``; empty splits skipped).

    One simulator per task serves every policy (building a LIBERO env is the slow part);
    ``env_cameras`` and ``execute_actions`` as in :class:`EvalConfig`.
    """
    from tqdm.auto import tqdm

    rows: list[dict[str, Any]] = []
    for task in tasks:
        env = policy_env(task, env_cameras=env_cameras, image_size=image_size, max_episode_steps=max_episode_steps)
        try:
            for name in tqdm(policies, desc=f"vla task {task}", disable=not progress):
                policy = load_policy(name, seed)
                for split, states in splits.items():
                    if not states:
                        continue
                    r = evaluate_policy(
                        env,
                        policy,
                        states,
                        trials,
                        temperature=temperature,
                        seed=seed,
                        action_repeat=action_repeat,
                        image_size=image_size,
                        execute_actions=execute_actions,
                    )
                    rows.append({"policy": name, "task": task, "split": split, "seed": seed, **r})
        finally:
            env.close()
    return rows


def overall_rows(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per policy x split pooling every task's episodes (``task = "all"``): successes,
    episodes, Avg and its Wilson 95% interval.

    >>> overall_rows([{"policy": "p", "task": 1, "split": "OOD", "successes": 1, "episodes": 4},
    ...               {"policy": "p", "task": 2, "split": "OOD", "successes": 3, "episodes": 4}])[0]["avg_ci95"]
    [0.2152, 0.7848]
    """
    pooled: dict[tuple[str, str], list[int]] = {}
    for r in rows:
        acc = pooled.setdefault((str(r["policy"]), str(r["split"])), [0, 0])
        acc[0] += int(r["successes"])
        acc[1] += int(r["episodes"])
    return [
        {
            "policy": policy,
            "task": "all",
            "split": split,
            "successes": wins,
            "episodes": n,
            "avg": round(wins / n, 4) if n else None,
            "avg_ci95": [round(x, 4) for x in wilson_interval(wins, n)],
        }
        for (policy, split), (wins, n) in pooled.items()
    ]


def summarize(evaluations: Mapping[str, Sequence[str | Path]]) -> dict[str, Any]:
    """A summary of evaluation files (``python -m agents.vla evaluate --output``) per named
    policy: every task x split row with its successes, episodes and Wilson 95% interval, and
    the rows pooled over tasks (:func:`overall_rows`). A task x split evaluated twice for one
    name is an error (episodes would count twice)."""
    out: dict[str, Any] = {}
    for name, files in evaluations.items():
        rows: list[dict[str, Any]] = []
        seen: set[tuple[Any, Any]] = set()
        for path in files:
            for r in json.loads(Path(path).read_text())["rows"]:
                key = (r["task"], r["split"])
                if key in seen:
                    raise ValueError(f"{name}: task {key[0]} split {key[1]} appears twice (in {path})")
                seen.add(key)
                keep = ("task", "split", "successes", "episodes", "avg", "avg_ci95", "best_at_k", "all_at_k")
                rows.append({**{k: r[k] for k in keep if k in r}, "policy": name})
        rows.sort(key=lambda r: (str(r["split"]), int(r["task"])))
        out[name] = {"per_task": rows, "overall": overall_rows(rows)}
    return out


def markdown_table(rows: Sequence[Mapping[str, Any]], k: int = 8) -> str:
    """A Markdown table of evaluation rows (``policy``, ``task``, ``split``, metrics; ``k`` trials).

    >>> print(markdown_table([{"policy": "random", "task": 7, "split": "ID", "avg": 0.0, "avg_ci95": [0.0, 0.194],
    ...                        "best_at_k": 0.0, "all_at_k": 0.0, "episodes": 16}]))
    | policy | task | split | Avg | Avg 95% CI (Wilson) | Best@8 | All@8 | episodes |
    |---|---|---|---|---|---|---|---|
    | random | 7 | ID | 0.000 | 0.000-0.194 | 0.000 | 0.000 | 16 |
    """
    lines = [
        f"| policy | task | split | Avg | Avg 95% CI (Wilson) | Best@{k} | All@{k} | episodes |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        ci = r.get("avg_ci95")
        ci_text = f"{ci[0]:.3f}-{ci[1]:.3f}" if ci else "-"
        best = f"{r['best_at_k']:.3f}" if "best_at_k" in r else "-"
        all_k = f"{r['all_at_k']:.3f}" if "all_at_k" in r else "-"
        lines.append(
            f"| {r['policy']} | {r['task']} | {r['split']} | {r['avg']:.3f} | {ci_text} | {best} | {all_k} | {r['episodes']} |"
        )
    return "\n".join(lines)
