"""vla: LIBERO-Long agents table of the MiniVLA protocol (Avg / Best@8 / All@8 on ID and OOD init states).

For each policy -- ``expert`` (scripted, privileged object poses), ``random`` (uniform
actions), or a MiniVLA checkpoint directory (an SFT or GRPO run's ``checkpoint/``) -- and each
task, ``trials`` episodes per initial state on the real simulator; ID = init states 0-15
(where GRPO trains), OOD = 16-49. Success is the simulator's own check; every rate has its
Wilson 95% interval, per task and pooled over tasks (``overall``). The seed of every row is
recorded.

Run: ``wmrl-bench vla --policies expert random runs/vla/sft/checkpoint --tasks 7
--id-init-states 0 1 2 3 --ood-init-states 16 17 --trials 2``. A paper-scale table (10 tasks x
50 init states x 8 trials x 4 agents = 16,000 episodes) is hours of CPU per agent here.

Functions: :func:`run`. Config: :class:`VLAEvalConfig`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.report import machine_summary, write_results
from wmrl_envs.config_cli import config_to_dict

__all__ = ["VLAEvalConfig", "CONFIG", "run", "NAME"]

NAME = "vla"


@dataclass
class VLAEvalConfig:
    """Settings of ``wmrl-bench vla``.

    Attributes:
        policies: ``expert``, ``random`` and / or MiniVLA checkpoint directories.
        tasks: LIBERO-Long task indices.
        id_init_states: in-distribution initial states (the paper: 0-15).
        ood_init_states: held-out initial states (the paper: 16-49).
        trials: episodes per initial state (the paper: 8).
        temperature: VLA sampling temperature (the paper samples; 0 = greedy).
        action_repeat: env steps each decision is held for.
        image_size: side of the camera views.
        max_episode_steps: episode limit (LIBERO-Long: 520).
        env_cameras: views from the env's camera observations instead of rendered at decision
            steps as the demonstrations are (see :class:`agents.vla.evaluate.EvalConfig`).
        seed: seed of sampling and resets.
    """

    policies: tuple[str, ...] = ("expert", "random")
    tasks: tuple[int, ...] = (7,)
    id_init_states: tuple[int, ...] = (0, 1, 2, 3)
    ood_init_states: tuple[int, ...] = (16, 17)
    trials: int = 2
    temperature: float = 1.0
    action_repeat: int = 4
    image_size: int = 64
    max_episode_steps: int = 520
    env_cameras: bool = False
    seed: int = 0


CONFIG = VLAEvalConfig


def run(config: VLAEvalConfig, run_dir: Path, *, progress: bool = True) -> dict[str, Any]:
    """Every policy x task x split; writes ``results.json`` and ``results.md``."""
    import torch

    from agents.vla.evaluate import evaluate_tasks, markdown_table, overall_rows

    torch.set_num_threads(1)
    started = time.perf_counter()
    rows = evaluate_tasks(
        config.policies,
        config.tasks,
        {"ID": config.id_init_states, "OOD": config.ood_init_states},
        config.trials,
        temperature=config.temperature,
        seed=config.seed,
        action_repeat=config.action_repeat,
        image_size=config.image_size,
        max_episode_steps=config.max_episode_steps,
        env_cameras=config.env_cameras,
        progress=progress,
    )
    overall = overall_rows(rows)
    result = {
        "experiment": NAME,
        "config": config_to_dict(config),
        "machine": machine_summary(),
        "rows": rows,
        "overall": overall,
        "total_wall_s": time.perf_counter() - started,
    }
    markdown = (
        f"## LIBERO-Long agents (trials per init state: {config.trials}, seed {config.seed})\n\n"
        + markdown_table(rows, config.trials)
        + "\n\nPooled over tasks (Wilson 95% intervals):\n\n"
        + markdown_table(overall, config.trials)
    )
    return write_results(run_dir, result, markdown)
