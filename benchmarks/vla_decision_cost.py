"""CPU per LIBERO-Long episode of a MiniVLA policy, by action-chunk length.

A decision costs two camera renders and one policy pass (prefix + decoded tokens); the
physics costs the same per env step whatever decides. An action chunk of ``K`` actions per
decision (:class:`agents.vla.model.MiniVLAConfig` ``action_chunk``) cuts decisions per episode
``K``-fold and adds ``7 (K - 1)`` cached decode steps per decision. This script measures it:
for each ``K``, full-length episodes (``--max-episode-steps``, default LIBERO-Long's 520) of
the SFT-sized MiniVLA (5.2M parameters, randomly initialised: it never reaches the goal,
so every episode runs to the limit and all variants do the same physics) on one task, from
the same initial states; process CPU seconds per episode, decisions, and the wall split into
render / act / env. Variants interleave episode by episode so load drift hits them alike;
the table shows medians.

Run: ``nice python -m benchmarks.vla_decision_cost [--chunks 1 4 8] [--episodes 3] [--out docs/results/vla/decision_cost.json]``.

Functions: :func:`main`, :func:`measure`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["main", "measure"]


def measure(
    chunks: Sequence[int],
    *,
    episodes: int = 3,
    task: int = 7,
    max_episode_steps: int = 520,
    action_repeat: int = 4,
    image_size: int = 64,
    seed: int = 0,
) -> dict[str, Any]:
    """Per chunk length: CPU seconds, decisions and wall split of each episode, and medians."""
    import torch
    from tqdm.auto import tqdm

    from agents.vla.evaluate import policy_env
    from agents.vla.model import MiniVLA, MiniVLAConfig
    from agents.vla.rollout import RolloutTimes, run_episode

    torch.set_num_threads(1)
    env = policy_env(task, image_size=image_size, max_episode_steps=max_episode_steps)
    policies = {}
    for k in chunks:
        torch.manual_seed(seed)
        policies[k] = MiniVLA(MiniVLAConfig.tiny(image_size=image_size, action_chunk=k)).eval()
    runs: dict[int, list[dict[str, float]]] = {k: [] for k in chunks}
    try:
        for e in tqdm(range(episodes), desc="episodes"):
            for k in chunks:
                times = RolloutTimes()
                cpu0, wall0 = time.process_time(), time.perf_counter()
                ep = run_episode(
                    env,
                    policies[k],
                    {"init_state": e},
                    generator=torch.Generator().manual_seed(seed + e),
                    keep_rows=False,
                    times=times,
                    seed=seed + e,
                    action_repeat=action_repeat,
                    image_size=image_size,
                )
                runs[k].append(
                    {
                        "cpu_s": time.process_time() - cpu0,
                        "wall_s": time.perf_counter() - wall0,
                        "decisions": times.actions,
                        "env_steps": ep.steps,
                        "render_s": times.render_seconds,
                        "act_s": times.act_seconds,
                        "env_s": times.env_seconds,
                        "reset_s": times.reset_seconds,
                        "goal_reached": ep.goal_reached,
                    }
                )
    finally:
        env.close()
    base = statistics.median(r["cpu_s"] for r in runs[chunks[0]])
    summary = {}
    for k, rs in runs.items():
        med = {
            f: statistics.median(r[f] for r in rs)
            for f in ("cpu_s", "wall_s", "decisions", "render_s", "act_s", "env_s")
        }
        med["act_ms_per_decision"] = 1000 * med["act_s"] / med["decisions"]
        med["cpu_ratio_vs_first"] = base / med["cpu_s"]
        summary[str(k)] = med
    return {
        "task": task,
        "max_episode_steps": max_episode_steps,
        "action_repeat": action_repeat,
        "image_size": image_size,
        "episodes": episodes,
        "chunks": list(chunks),
        "runs": {str(k): v for k, v in runs.items()},
        "median": summary,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.vla_decision_cost", description=__doc__.split("\n")[0])
    parser.add_argument("--chunks", type=int, nargs="+", default=[1, 4, 8])
    parser.add_argument("--episodes", type=int, default=3)
    parser.add_argument("--task", type=int, default=7)
    parser.add_argument("--max-episode-steps", type=int, default=520)
    parser.add_argument("--action-repeat", type=int, default=4)
    parser.add_argument("--out", default=None, help="JSON file to write")
    args = parser.parse_args(argv)
    from benchmarks.report import machine_summary

    result = measure(
        args.chunks,
        episodes=args.episodes,
        task=args.task,
        max_episode_steps=args.max_episode_steps,
        action_repeat=args.action_repeat,
    )
    result["machine"] = machine_summary()
    print(
        "| K (actions per decision) | decisions / episode | CPU s / episode | x fewer CPU s | render s | act s | env s | act ms / decision |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for k, m in result["median"].items():
        print(
            f"| {k} | {m['decisions']:.0f} | {m['cpu_s']:.1f} | {m['cpu_ratio_vs_first']:.2f} | {m['render_s']:.1f} | "
            f"{m['act_s']:.1f} | {m['env_s']:.1f} | {m['act_ms_per_decision']:.0f} |"
        )
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
