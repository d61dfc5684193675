"""Steps per second of LIBERO-Long: raw library env vs the Gymnasium env vs the wrapped env.

For each camera setting (state-only, and two cameras at ``--image-size``), on the same task
and initial state, with the same random actions:

* ``raw``: the library's ``OffScreenRenderEnv.step`` (old 4-tuple, no grading);
* ``gym``: :class:`wmrl_envs.libero.env.LiberoLongEnv` (real grading at the final step);
* ``wrapped``: ``CalibrationWrapper(AnchorWrapper(WorldModelWrapper(env, wm)))`` with the
  shipped state progress model as world model (it predicts at every episode end).

Each block is one episode of ``--horizon`` steps (the last one graded); only ``step`` calls
are timed (resets excluded); the three variants are interleaved block by block so machine
load drifts hit them alike; the table shows medians over ``--repeats`` blocks and the
overhead ratios against ``raw``.

Run: ``nice python -m benchmarks.libero_throughput [--horizon 40] [--repeats 5] [--out runs/]``.

Functions: :func:`main`, :func:`measure`.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from benchmarks.report import machine_summary, make_run_dir, markdown_table, write_json

__all__ = ["main", "measure"]


def _raw_env(task_index: int, cameras: bool, size: int):
    from libero.libero.envs import OffScreenRenderEnv

    from wmrl_envs.libero.tasks import bddl_path, get_task

    return OffScreenRenderEnv(
        bddl_file_name=bddl_path(get_task(task_index)),
        camera_heights=size,
        camera_widths=size,
        use_camera_obs=cameras,
        has_offscreen_renderer=cameras,
        hard_reset=False,
        ignore_done=True,
    )


def _episode_rate(reset: Callable[[], Any], step: Callable[[np.ndarray], Any], actions: np.ndarray) -> float:
    reset()
    t0 = time.perf_counter()
    for a in actions:
        step(a)
    return len(actions) / (time.perf_counter() - t0)


def measure(task_index: int, cameras: bool, size: int, horizon: int, repeats: int, seed: int = 0) -> dict[str, Any]:
    """Median steps/s of the three variants for one camera setting."""
    from wmrl_envs.libero.env import LiberoLongEnv
    from wmrl_envs.libero.tasks import get_task, load_init_states
    from wmrl_envs.world_models.progress import ProgressOutcomeModel
    from wmrl_envs.world_models.progress_learned import StateProgressModel
    from wmrl_envs.world_models.progress_rollouts import DEFAULT_PROGRESS_MODEL
    from wrappers import AnchorWrapper, CalibrationWrapper, WorldModelWrapper

    init = load_init_states(get_task(task_index))[0]
    actions = np.random.default_rng(seed).uniform(-1, 1, (horizon, 7)).astype(np.float32)
    raw = _raw_env(task_index, cameras, size)
    env = LiberoLongEnv(task_id=task_index, cameras=cameras, image_size=size, max_episode_steps=horizon)
    wm = ProgressOutcomeModel(StateProgressModel.load(DEFAULT_PROGRESS_MODEL))
    wrapped = CalibrationWrapper(AnchorWrapper(WorldModelWrapper(env, wm), fraction=0.5, seed=seed))
    group = iter(range(10**9))

    def raw_reset() -> None:
        raw.reset()
        raw.set_init_state(init)

    variants = {
        "raw": (raw_reset, raw.step),
        "gym": (lambda: env.reset(options={"init_state": 0}), env.step),
        "wrapped": (
            lambda: wrapped.reset(options={"init_state": 0, "group_id": next(group), "group_size": 1}),
            wrapped.step,
        ),
    }
    rates: dict[str, list[float]] = {k: [] for k in variants}
    try:
        for _ in tqdm(range(repeats), desc=f"cameras={cameras}"):
            for name, (reset, step) in variants.items():
                rates[name].append(_episode_rate(reset, step, actions))
    finally:
        raw.close()
        env.close()
    med = {k: statistics.median(v) for k, v in rates.items()}
    return {
        "cameras": f"2 x {size}px" if cameras else "none (state-only)",
        "raw_steps_per_s": med["raw"],
        "gym_steps_per_s": med["gym"],
        "wrapped_steps_per_s": med["wrapped"],
        "gym_overhead": med["raw"] / med["gym"],
        "wrapped_overhead": med["raw"] / med["wrapped"],
        "samples": rates,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.libero_throughput", description=__doc__.split("\n")[0])
    parser.add_argument("--task", type=int, default=7, help="LIBERO-Long task index (0-9)")
    parser.add_argument("--horizon", type=int, default=40, help="steps per timed episode (state-only)")
    parser.add_argument("--camera-horizon", type=int, default=15, help="steps per timed episode with cameras")
    parser.add_argument("--image-size", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, help="write results.json and table.md under a run dir here")
    args = parser.parse_args(argv)
    rows = [
        measure(args.task, False, args.image_size, args.horizon, args.repeats),
        measure(args.task, True, args.image_size, args.camera_horizon, args.repeats),
    ]
    columns = [
        "cameras",
        "raw_steps_per_s",
        "gym_steps_per_s",
        "wrapped_steps_per_s",
        "gym_overhead",
        "wrapped_overhead",
    ]
    table = markdown_table(rows, columns)
    print(table)
    print("overhead = raw steps/s divided by the variant's (1.0 = free); medians over", args.repeats, "episodes each")
    if args.out:
        run = make_run_dir(args.out, "libero_throughput")
        write_json(run / "results.json", {"machine": machine_summary(), "args": vars(args), "rows": rows})
        (run / "table.md").write_text(table + "\n")
        print("wrote", run)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
