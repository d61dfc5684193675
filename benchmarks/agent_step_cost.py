"""Cost of one GRPO training step of the LLM agent, split by phase, plus peak memory.

Runs a few real training steps of the default policy (SmolLM2-135M-Instruct, offline) with
the compact plan scaffold on catalog train tasks, through one or both stacks:

* ``real``: every rollout executed in the sandbox (plain GRPO; real executions counted by
  ``WorldModelWrapper(mode="env")``);
* ``wmrl``: ``CalibrationWrapper(AnchorWrapper(WorldModelWrapper(env, CodeOutcomeModel)))``,
  real execution only for anchor groups.

Reports, per stack, the median over steps of wall and CPU seconds per phase (generation,
real grading, world-model grading, other env time, update) and the process's peak RSS.
Results go to ``<out>/agent_step_cost-<stamp>/results.{json,md}``.

Usage::

    python -m benchmarks.agent_step_cost                     # 3 steps, m=2 groups x n=4, real stack
    python -m benchmarks.agent_step_cost --stacks real wmrl --world-model <dir> --steps 2
"""

from __future__ import annotations

import argparse
import resource
import statistics
import time
from collections.abc import Sequence
from typing import Any

from benchmarks.report import machine_summary, make_run_dir, markdown_table, write_json

PHASES = ("generation", "real_grading", "wm_grading", "env_other", "env_reset", "update")
TASKS = ["titanic", "penguins", "breast_cancer", "wine", "auto_mpg", "credit_data"]


def _stack(kind: str, num_envs: int, max_turns: int, anchor_fraction: float, world_model: str) -> Any:
    import wmrl_envs  # noqa: F401  (registers env ids)
    from agents.llm.loading import load_world_model
    from wmrl_envs.vector import make_vector_env
    from wrappers import build_stack

    env = make_vector_env("wmrl/AutoResearch-v0", num_envs, split="train", max_turns=max_turns)
    return build_stack(env, kind, load_world_model(world_model), anchor_fraction=anchor_fraction)


def _median(xs: Sequence[float]) -> float | None:
    return statistics.median(xs) if xs else None


def run(args: argparse.Namespace) -> dict[str, Any]:
    from agents.grpo import train
    from agents.llm.loading import load_policy
    from agents.llm.scaffolds import PlanScaffold
    from agents.llm.trainer import GRPOConfig, LLMAgent

    t0 = time.perf_counter()
    policy = load_policy(args.policy)
    load_seconds = time.perf_counter() - t0
    rss_after_load = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    rows, raw = [], {}
    for kind in args.stacks:
        env = _stack(kind, args.groups * args.group_size, args.max_turns, args.anchor_fraction, args.world_model)
        config = GRPOConfig(
            groups_per_step=args.groups,
            group_size=args.group_size,
            total_steps=args.steps + 1,
            max_new_tokens=args.max_new_tokens,
            micro_batch_size=args.micro_batch_size,
            seed=args.seed,
        )
        history = train(LLMAgent(policy, env, PlanScaffold(), config, tasks=TASKS)).history[
            1:
        ]  # step 1 warms caches up
        env.close()
        raw[kind] = history
        row: dict[str, Any] = {"stack": kind, "steps": len(history)}
        row["step_wall_s"] = _median([h["time/step_wall"] for h in history])
        for phase in PHASES:
            row[f"{phase}_wall_s"] = _median([h[f"time/{phase}_wall"] for h in history])
            row[f"{phase}_cpu_s"] = _median([h[f"time/{phase}_cpu"] for h in history])
        row["real_executions_per_step"] = _median([h["real_executions/step"] for h in history])
        row["reward_mean"] = _median([h["reward/mean"] for h in history if h["reward/mean"] is not None])
        row["peak_rss_mb"] = max(h["memory/peak_rss_mb"] for h in history)
        rows.append(row)
    return {
        "machine": machine_summary(),
        "settings": vars(args),
        "policy_load_seconds": load_seconds,
        "rss_after_load_mb": rss_after_load,
        "rows": rows,
        "history": raw,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.agent_step_cost", description=__doc__.split("\n\n")[0])
    parser.add_argument("--policy", choices=("default", "tiny"), default="default")
    parser.add_argument("--stacks", nargs="+", choices=("real", "wmrl"), default=["real"])
    parser.add_argument(
        "--world-model", default="default", help="CodeOutcomeModel for the wmrl stack: 'default' or a directory"
    )
    parser.add_argument("--steps", type=int, default=3, help="measured steps per stack (after one warm-up step)")
    parser.add_argument("--groups", type=int, default=2, help="groups per step (m)")
    parser.add_argument("--group-size", type=int, default=4, help="samples per group (n)")
    parser.add_argument("--max-turns", type=int, default=1)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--micro-batch-size", type=int, default=4)
    parser.add_argument("--anchor-fraction", type=float, default=0.10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="runs")
    args = parser.parse_args(argv)
    result = run(args)
    out = make_run_dir(args.out, "agent_step_cost")
    write_json(out / "results.json", result)
    columns = (
        ["stack", "steps", "step_wall_s"]
        + [f"{p}_wall_s" for p in PHASES]
        + [f"{p}_cpu_s" for p in PHASES]
        + ["real_executions_per_step", "reward_mean", "peak_rss_mb"]
    )
    table = markdown_table(result["rows"], columns)
    header = (
        f"Policy: {args.policy} (load {result['policy_load_seconds']:.1f} s, RSS after load "
        f"{result['rss_after_load_mb']:.0f} MB); m={args.groups} x n={args.group_size}, max_turns={args.max_turns}, "
        f"max_new_tokens={args.max_new_tokens}; medians over {args.steps} steps.\n\n"
    )
    (out / "results.md").write_text(header + table + "\n")
    print(header + table)
    print(f"\nwritten to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
