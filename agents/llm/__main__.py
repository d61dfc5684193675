"""Command line: train the LLM agent with GRPO, and evaluate it (avg@k on held-out tasks).

::

    python -m agents.llm train --stack wmrl --total-steps 12 --output-dir runs/grpo-wmrl --evaluate true
    python -m agents.llm train --policy tiny-plan --stack wmrl --total-steps 2 --output-dir runs/smoke
    python -m agents.llm evaluate --checkpoint runs/grpo-wmrl/checkpoint --k 4

Every flag is a field of a config dataclass, with its default and documentation
(:mod:`wmrl_envs.config_cli`): ``train`` takes :class:`TrainRun`, the trainer's
:class:`~agents.llm.trainer.GRPOConfig`, the WMRL stack's
:class:`~wrappers.CalibrationConfig` (``--calibration-*``) and the held-out evaluation's
:class:`EvalConfig` (``--eval-*``); ``evaluate`` takes :class:`EvalRun` and
:class:`EvalConfig`. ``--config FILE`` (TOML/JSON; tables ``[calibration]`` / ``[eval]``)
sets any of them; flags override the file.

Stacks (:func:`wrappers.build_stack`): ``real`` (plain GRPO on real execution), ``wm`` (pure
world model), ``wmrl`` (``Calibration(Anchor(WorldModel(env)))``). Evaluation always executes
for real. ``train --evaluate true`` evaluates before and after training and writes
``eval_before.json`` / ``eval_after.json`` next to the metrics.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["AgentSetup", "TrainRun", "EvalRun", "EvalConfig", "main"]


@dataclass
class AgentSetup:
    """The policy and env settings shared by ``train`` and ``evaluate``.

    Attributes:
        policy: ``default`` (SmolLM2-135M-Instruct, offline), ``tiny`` (random from-config model),
            ``tiny-plan`` (tiny, warm-started on demonstration plans), or a model name/path.
        lora: train a LoRA adapter instead of all weights.
        scaffold: ``plan`` (compact plan scaffold) or ``raw`` (a complete script).
        max_turns: env turns per episode (K).
        wall_seconds: time limit of one solution run in the sandbox (none = the env's default).
        threads: torch CPU threads (1 is fastest on a busy machine).
    """

    policy: str = "default"
    lora: bool = False
    scaffold: str = "plan"
    max_turns: int = 1
    wall_seconds: float | None = None
    threads: int = 1

    def env_kwargs(self) -> dict[str, Any]:
        return {
            "max_turns": self.max_turns,
            **({"wall_seconds": self.wall_seconds} if self.wall_seconds is not None else {}),
        }


@dataclass
class TrainRun(AgentSetup):
    """What ``train`` builds around the trainer.

    Attributes:
        stack: ``real`` (real execution), ``wm`` (raw world model) or ``wmrl`` (world model +
            anchors + calibration).
        world_model: ``default`` (the shipped CodeOutcomeModel) or a saved model directory.
        anchor_fraction: target share of anchor groups (``wmrl``).
        anchor_min_per_step: floor of anchor groups per step (``wmrl``).
        tasks: training task ids (none = the catalog's train split).
        warm_start_steps: supervised steps on demonstration plans before training (for a
            from-config model that cannot follow the format yet; skipped when resuming).
        warm_start_lr: learning rate of the warm start.
        evaluate: avg@k on held-out tasks (``--eval-*`` settings) before and after training.
    """

    stack: str = "real"
    world_model: str = "default"
    anchor_fraction: float = 0.10
    anchor_min_per_step: int = 1
    tasks: tuple[str, ...] | None = None
    warm_start_steps: int = 0
    warm_start_lr: float = 1e-2
    evaluate: bool = False


@dataclass
class EvalRun(AgentSetup):
    """What ``evaluate`` loads.

    Attributes:
        checkpoint: a trainer checkpoint (or a directory holding ``policy.pt``) whose weights
            are loaded into the policy (none = the policy as loaded).
        json: also write the result to this file.
    """

    checkpoint: str | None = None
    json: str | None = None


@dataclass
class EvalConfig:
    """Held-out evaluation (avg@k, real execution).

    Attributes:
        k: samples per task.
        tasks: held-out task ids (none = the catalog's test split).
        tasks_per_round: held-out tasks rolled out side by side (one batched generation).
        max_new_tokens: tokens sampled per turn.
        temperature: sampling temperature.
        seed: sampling seed.
    """

    k: int = 4
    tasks: tuple[str, ...] | None = None
    tasks_per_round: int = 3
    max_new_tokens: int = 96
    temperature: float = 1.0
    seed: int = 0


def _evaluate(policy: Any, scaffold: Any, setup: AgentSetup, cfg: EvalConfig) -> dict[str, Any]:
    from agents.llm.evaluate import evaluate_heldout
    from wmrl_envs.autoresearch.tasks import list_catalog

    result = evaluate_heldout(
        policy, scaffold, list(cfg.tasks or list_catalog("test")), k=cfg.k, tasks_per_round=cfg.tasks_per_round,
        max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature, seed=cfg.seed, **setup.env_kwargs(),
    )  # fmt: skip
    return result.to_dict()


def _print_eval(label: str, d: dict[str, Any]) -> None:
    mean = "n/a" if d["mean"] is None else f"{d['mean']:.4f}"
    print(
        f"[{label}] avg@k = {mean}  valid rate = {d['valid_rate']}  by category = {d['by_category']}  ({d['seconds']:.0f} s)",
        flush=True,
    )


def cmd_train(run: TrainRun, grpo: Any, calibration: Any, cfg: EvalConfig) -> int:
    import torch

    import wmrl_envs  # noqa: F401  (registers the env ids)
    from agents.llm.loading import load_policy, load_world_model, warm_start_plans
    from agents.llm.scaffolds import make_scaffold
    from agents.llm.trainer import train
    from wmrl_envs.autoresearch.tasks import list_catalog
    from wmrl_envs.vector import make_vector_env
    from wrappers import build_stack

    if grpo.output_dir is None:
        raise ValueError("train needs --output-dir (metrics, checkpoints and evaluations go there)")
    torch.set_num_threads(run.threads)
    out = Path(grpo.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    tasks = list(run.tasks or list_catalog("train"))
    policy = load_policy(run.policy, lora=run.lora, seed=grpo.seed)
    scaffold = make_scaffold(run.scaffold)
    if run.warm_start_steps and not (out / "checkpoint").exists():
        losses = warm_start_plans(
            policy,
            tasks,
            steps=run.warm_start_steps,
            learning_rate=run.warm_start_lr,
            seed=grpo.seed,
            scaffold=scaffold,
        )
        print(f"warm start: {len(losses)} steps, loss {losses[0]:.3f} -> {losses[-1]:.3f}", flush=True)
    if run.evaluate and not (out / "eval_before.json").exists():
        before = _evaluate(policy, scaffold, run, cfg)
        (out / "eval_before.json").write_text(json.dumps(before, indent=1, default=str))
        _print_eval("before", before)
    env = make_vector_env(
        "wmrl/AutoResearch-v0", grpo.groups_per_step * grpo.group_size, split="train", **run.env_kwargs()
    )
    stack = build_stack(
        env, run.stack, load_world_model(run.world_model), anchor_fraction=run.anchor_fraction,
        anchor_min_per_step=run.anchor_min_per_step, seed=grpo.seed, calibration=calibration,
    )  # fmt: skip
    t0 = time.perf_counter()
    try:
        result = train(policy, stack, scaffold, grpo, tasks=tasks, resume=True)
    finally:
        stack.close()
    print(
        f"trained {len(result.history)} steps in {time.perf_counter() - t0:.0f} s; metrics in {out / 'metrics.jsonl'}",
        flush=True,
    )
    if run.evaluate:
        after = _evaluate(policy, scaffold, run, cfg)
        (out / "eval_after.json").write_text(json.dumps(after, indent=1, default=str))
        _print_eval("after", after)
    return 0


def cmd_evaluate(run: EvalRun, cfg: EvalConfig) -> int:
    import torch

    import wmrl_envs  # noqa: F401  (registers the env ids)
    from agents.llm.loading import load_policy
    from agents.llm.scaffolds import make_scaffold

    torch.set_num_threads(run.threads)
    policy = load_policy(run.policy, checkpoint=run.checkpoint, lora=run.lora)
    result = _evaluate(policy, make_scaffold(run.scaffold), run, cfg)
    if run.json:
        Path(run.json).write_text(json.dumps(result, indent=1, default=str))
    _print_eval("eval", result)
    return 0


def _parser() -> argparse.ArgumentParser:
    from agents.llm.trainer import GRPOConfig
    from wmrl_envs.config_cli import add_config_arguments
    from wrappers import CalibrationConfig

    parser = argparse.ArgumentParser(prog="python -m agents.llm", description=(__doc__ or "").split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    config_help = "TOML/JSON file with any of the settings below (tables [calibration], [eval]); flags override it"
    t = sub.add_parser("train", help="GRPO training (resumes from OUTPUT_DIR/checkpoint if present)")
    t.add_argument("--config", help=config_help)
    add_config_arguments(t, TrainRun)
    add_config_arguments(t, GRPOConfig)
    add_config_arguments(t, CalibrationConfig, section="calibration")
    add_config_arguments(t, EvalConfig, section="eval")
    e = sub.add_parser("evaluate", help="avg@k of a policy (optionally a checkpoint) on held-out tasks")
    e.add_argument("--config", help=config_help)
    add_config_arguments(e, EvalRun)
    add_config_arguments(e, EvalConfig)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from agents.llm.trainer import GRPOConfig
    from wmrl_envs.config_cli import build_config, load_config_file
    from wrappers import CalibrationConfig

    args = _parser().parse_args(argv)
    try:
        values = load_config_file(args.config) if args.config else {}
        tables = {k: values.pop(k) for k in ("calibration", "eval") if isinstance(values.get(k), dict)}
        if args.command == "train":
            run_fields = {k: values.pop(k) for k in list(values) if k in TrainRun.__dataclass_fields__}
            run = build_config(TrainRun, run_fields, args)
            grpo = build_config(GRPOConfig, values, args)
            calibration = build_config(CalibrationConfig, tables.get("calibration"), args, section="calibration")
            cfg = build_config(EvalConfig, tables.get("eval"), args, section="eval")
        else:
            run_fields = {k: values.pop(k) for k in list(values) if k in EvalRun.__dataclass_fields__}
            erun = build_config(EvalRun, run_fields, args)
            cfg = build_config(EvalConfig, values, args)
    except (ValueError, FileNotFoundError, TypeError) as err:
        print(f"python -m agents.llm {args.command}: bad configuration: {err}", file=sys.stderr)
        return 2
    if args.command == "train":
        return cmd_train(run, grpo, calibration, cfg)
    return cmd_evaluate(erun, cfg)


if __name__ == "__main__":
    raise SystemExit(main())
