"""The paper's VLA evaluation protocol: Avg / Best@8 / All@8 success per task and init-state split.

For each initial state, ``trials`` (8) episodes are run; ``Avg`` is the mean success over all
episodes, ``Best@8`` the share of initial states solved at least once, ``All@8`` the share
solved every time. Splits: ID = init states 0-15 (GRPO trains there), OOD = 16-49.

Classes: :class:`EvalConfig`, :class:`RandomPolicy`. Functions: :func:`success_metrics`,
:func:`load_policy`, :func:`policy_env`, :func:`evaluate_policy`, :func:`evaluate_tasks`,
:func:`markdown_table`.

>>> success_metrics({0: [True] * 8, 1: [False, True] + [False] * 6, 2: [False] * 8})
{'avg': 0.375, 'best_at_k': 0.6667, 'all_at_k': 0.3333, 'init_states': 3, 'episodes': 24}
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

__all__ = [
    "EvalConfig",
    "success_metrics",
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
        image_size: side of the rendered camera views.
        max_episode_steps: episode limit (LIBERO-Long's evaluation uses 520).
        env_cameras: take the policy's views from the env's camera observations, as the
            demonstrations (``python -m agents.vla demos``) and the SFT run's evaluation do
            (default True). ``False`` renders them at decision steps only (cheaper; what GRPO
            rollouts see). robosuite samples camera observations inside the control step, so
            the two differ slightly (~1 intensity level on average after a few steps), and a
            policy fitted to one can fail on the other.
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
    image_size: int = 64
    max_episode_steps: int = 520
    env_cameras: bool = True
    seed: int = 0
    output: str | None = None


def success_metrics(successes: Mapping[int, Sequence[bool]]) -> dict[str, Any]:
    """Avg / Best@k / All@k from ``{init_state: [success per trial]}``."""
    if not successes:
        raise ValueError("no episodes")
    per = [np.asarray(v, dtype=bool) for v in successes.values()]
    return {
        "avg": round(float(np.mean(np.concatenate(per))), 4),
        "best_at_k": round(float(np.mean([v.any() for v in per])), 4),
        "all_at_k": round(float(np.mean([v.all() for v in per])), 4),
        "init_states": len(per),
        "episodes": int(sum(len(v) for v in per)),
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


def policy_env(task: int, *, env_cameras: bool = True, image_size: int = 64, max_episode_steps: int = 520) -> Any:
    """The LIBERO-Long env a policy acts in: views from the env's camera observations
    (``env_cameras``, as the demonstrations were recorded) or rendered at decision steps."""
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
) -> dict[str, Any]:
    """Success of ``policy`` on ``env`` (one task): per-init successes and :func:`success_metrics`.

    ``policy="expert"`` runs the scripted expert instead of a model.
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
    env_cameras: bool = True,
    progress: bool = False,
) -> list[dict[str, Any]]:
    """One row per policy x task x split (``{"ID": [0, ..., 15], "OOD": [...]}``; empty splits skipped).

    One simulator per task serves every policy (building a LIBERO env is the slow part);
    ``env_cameras`` as in :class:`EvalConfig`.
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
                    )
                    rows.append({"policy": name, "task": task, "split": split, "seed": seed, **r})
        finally:
            env.close()
    return rows


def markdown_table(rows: Sequence[Mapping[str, Any]], k: int = 8) -> str:
    """A Markdown table of evaluation rows (``policy``, ``task``, ``split``, metrics; ``k`` trials).

    >>> print(markdown_table([{"policy": "random", "task": 7, "split": "ID", "avg": 0.0, "best_at_k": 0.0, "all_at_k": 0.0, "episodes": 16}]))
    | policy | task | split | Avg | Best@8 | All@8 | episodes |
    |---|---|---|---|---|---|---|
    | random | 7 | ID | 0.000 | 0.000 | 0.000 | 16 |
    """
    lines = [f"| policy | task | split | Avg | Best@{k} | All@{k} | episodes |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(
            f"| {r['policy']} | {r['task']} | {r['split']} | {r['avg']:.3f} | {r['best_at_k']:.3f} | {r['all_at_k']:.3f} | {r['episodes']} |"
        )
    return "\n".join(lines)
