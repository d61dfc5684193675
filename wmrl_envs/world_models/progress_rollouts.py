"""Log LIBERO-Long rollouts with privileged progress labels, to train progress world models.

Three kinds of episode per (task, initial state), all in the fast state-only mode and all
from the real simulator:

* ``random``: a smoothed random policy (the arm wanders; objects rarely move; failures);
* ``goal``: a few random steps, then :func:`~wmrl_envs.libero.goals.achieve_goal` carries the
  objects into their goal regions through the simulator (successes, where the task is
  solvable that way);
* ``partial``: the same for the first goal predicate only (half-done two-stage tasks).

Every frame is labelled with :func:`~wmrl_envs.libero.goals.privileged_progress`; the
states are exactly what :class:`~wmrl_envs.libero.env.LiberoTrajectory` carries.

CLI (a few CPU-minutes: writes train and held-out sets, fits the model, prints its
held-out fidelity; this is how ``progress_model/progress_model.pkl`` was made, see
``progress_model/progress_model.json``)::

    nice python -m wmrl_envs.world_models.progress_rollouts --out-dir runs/progress --train-inits 4 --heldout-inits 2

Functions: :func:`log_episodes`, :func:`collect`. Constants: :data:`DEFAULT_PROGRESS_MODEL`.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from tqdm import tqdm

from wmrl_envs.libero.tasks import LIBERO_10_TASKS, get_task, split_indices
from wmrl_envs.world_models.progress_learned import (
    ProgressDataset,
    ProgressEpisode,
    StateProgressModel,
    progress_fidelity,
)

__all__ = ["log_episodes", "collect", "DEFAULT_PROGRESS_MODEL", "KINDS"]

#: The small state-based progress model shipped with the package (trained by this module's CLI).
DEFAULT_PROGRESS_MODEL = Path(__file__).parent / "progress_model" / "progress_model.pkl"
KINDS = ("random", "goal", "partial")


def _random_actions(rng: np.random.Generator, n: int) -> np.ndarray:
    # Smoothed noise moves the arm coherently instead of jittering in place.
    noise = rng.uniform(-1, 1, (n, 7))
    actions = np.zeros((n, 7))
    for t in range(n):
        actions[t] = 0.7 * (actions[t - 1] if t else 0.0) + 0.3 * noise[t]
    actions[:, 6] = np.sign(noise[:, 6])
    return np.clip(actions * 2.0, -1, 1)


def log_episodes(
    env, init_state: int, kinds: Sequence[str] = KINDS, *, random_steps: int = 30, lead_steps: int = 5, seed: int = 0
) -> list[ProgressEpisode]:
    """Roll out ``kinds`` of episodes from ``init_state`` on a state-only :class:`LiberoLongEnv`.

    Usage (a MuJoCo simulation, so not run as a doctest)::

        env = LiberoLongEnv(task_id=7, cameras=False)
        [ep.success for ep in log_episodes(env, 0, ["goal"])]  # [True]
    """
    from wmrl_envs.libero.goals import achieve_goal, goal_predicates, privileged_progress

    unknown = set(kinds) - set(KINDS)
    if unknown:
        raise ValueError(f"unknown episode kind(s) {sorted(unknown)}; expected some of {KINDS}")
    rng = np.random.default_rng([seed, env.task.index, init_state])
    episodes = []
    for kind in kinds:
        if kind == "partial" and len(goal_predicates(env.sim_env)) < 2:
            continue
        obs, _ = env.reset(options={"init_state": init_state})
        states, progress, holds = [], [], []

        def label(obs):
            p = privileged_progress(env.sim_env)
            states.append(env.state_vector(obs))  # noqa: B023 -- called within this episode only
            progress.append(p.progress)  # noqa: B023
            holds.append(p.success)  # noqa: B023

        label(obs)
        for a in _random_actions(rng, random_steps if kind == "random" else lead_steps):
            obs, *_ = env.apply(a, None)  # simulate only: grading is not what is logged here
            label(obs)
        if kind != "random":
            for _ in achieve_goal(env.sim_env, num_predicates=1 if kind == "partial" else None):
                label(env.observe_now())
        episodes.append(
            ProgressEpisode(
                env.task.instruction,
                np.stack(states).astype(np.float32),
                np.asarray(progress, np.float32),
                np.asarray(holds, bool),
                {"task_id": env.task.name, "init_state": init_state, "kind": kind},
            )
        )
    return episodes


def collect(
    task_ids: Sequence[int], init_states: Sequence[int], *, seed: int = 0, progress: bool = True
) -> ProgressDataset:
    """All :data:`KINDS` of episodes for each task and initial state (one env at a time)."""
    from wmrl_envs.libero.env import LiberoLongEnv

    dataset = ProgressDataset()
    bar = tqdm(total=len(task_ids) * len(init_states), desc="rollouts", disable=not progress)
    for task_id in task_ids:
        # No episode here reaches the horizon: the env only simulates, through apply().
        env = LiberoLongEnv(task_id=task_id, cameras=False, max_episode_steps=10_000)
        try:
            for k in init_states:
                dataset.episodes.extend(log_episodes(env, k, seed=seed))
                bar.update()
        finally:
            env.close()
    bar.close()
    return dataset


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m wmrl_envs.world_models.progress_rollouts",
        description="log labelled rollouts and fit a StateProgressModel",
    )
    parser.add_argument("--out-dir", required=True, type=Path)
    parser.add_argument("--tasks", type=int, nargs="*", default=[t.index for t in LIBERO_10_TASKS])
    parser.add_argument(
        "--train-inits", type=int, default=4, help="initial states per task from the in-distribution split"
    )
    parser.add_argument("--heldout-inits", type=int, default=2, help="initial states per task from the held-out split")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model-out", type=Path, help="where to save the model (default OUT_DIR/progress_model.pkl)")
    args = parser.parse_args(argv)
    for t in args.tasks:
        get_task(t)
    rng = np.random.default_rng(args.seed)
    train_inits = sorted(rng.choice(split_indices("in_distribution"), args.train_inits, replace=False).tolist())
    heldout_inits = sorted(rng.choice(split_indices("held_out"), args.heldout_inits, replace=False).tolist())
    train = collect(args.tasks, train_inits, seed=args.seed)
    heldout = collect(args.tasks, heldout_inits, seed=args.seed + 1)
    train.save(args.out_dir / "train.npz")
    heldout.save(args.out_dir / "heldout.npz")
    model = StateProgressModel(seed=args.seed).fit(train)
    model.info.update(train_inits=train_inits, heldout_inits=heldout_inits, fidelity=progress_fidelity(model, heldout))
    model.save(args.model_out or args.out_dir / "progress_model.pkl")
    print(json.dumps(model.info, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
