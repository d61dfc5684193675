"""Command line of the MiniVLA agent.

::

    python -m agents.vla expert   --tasks 7 0 --init-states 0 1 2 3            # scripted-expert success table
    python -m agents.vla demos    --tasks 0 1 4 5 6 7 --init-states 0 1 2 3 --per-init 2   # resumable, into a cache
    python -m agents.vla dagger   --policy runs/vla/sft/checkpoint --output-dir runs/vla/dagger1 --beta 0.5
    python -m agents.vla sft      --demos runs/vla/demos_task7.npz --steps 1000 --output-dir runs/vla/sft --eval-task 7
    python -m agents.vla train    --checkpoint runs/vla/sft/checkpoint --stack wmrl --task 7 --total-steps 2
    python -m agents.vla evaluate --policy runs/vla/grpo-wmrl/checkpoint --tasks 7 --init-states 16 17 --trials 8
    python -m agents.vla summary  --policy sft=eval_task0.json sft=eval_task7.json --output summary.json

``expert`` takes :class:`ExpertRun`, ``demos`` :class:`DemosRun`, ``dagger`` :class:`DaggerRun`, ``sft``
:class:`~agents.vla.sft.SFTConfig`, ``train`` takes :class:`TrainSetup` and
:class:`~agents.vla.trainer.VLAGRPOConfig` (plus ``--calibration-*`` of
:class:`~wrappers.CalibrationConfig` for the ``wmrl`` stack), ``evaluate`` takes
:class:`~agents.vla.evaluate.EvalConfig`; every flag is a documented field
(:mod:`wmrl_envs.config_cli`). Every run sets ``torch.set_num_threads(1)`` unless
``--threads`` says otherwise (CPU machines share their cores).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from wmrl_envs.config_cli import add_config_arguments, build_config, config_to_dict

__all__ = ["main", "ExpertRun", "DemosRun", "DaggerRun", "TrainSetup", "build_env"]


@dataclass
class ExpertRun:
    """Settings of ``python -m agents.vla expert``: the scripted expert's success table.

    Attributes:
        tasks: LIBERO-Long task indices.
        init_states: initial states to try on each task.
        action_repeat: env steps each expert action is held for (1 = the simulator's 20 Hz).
        max_episode_steps: episode limit (above LIBERO's 520 so that near misses show).
        out: JSONL file to append one record per episode to (None: print only).
        expert_style: how the expert moves (``phases`` or ``funnel``: :class:`~agents.vla.expert.ExpertConfig`).
    """

    tasks: tuple[int, ...] = (7,)
    init_states: tuple[int, ...] = tuple(range(16))
    action_repeat: int = 1
    max_episode_steps: int = 600
    out: str | None = None
    expert_style: str = "phases"


@dataclass
class DemosRun:
    """Settings of ``python -m agents.vla demos``: scripted-expert demonstrations of many tasks
    into a cache directory (:class:`~agents.vla.demos.DemoCache`), resumable: a rerun skips the
    tries its manifest already holds. Only episodes the simulator marks successful are kept;
    every try is recorded in the manifest.

    Attributes:
        tasks: LIBERO-Long task indices (default: the six the expert solves, docs/vla.md).
        init_states: initial states to demonstrate from (LIBERO's training states 0-15).
        per_init: episodes tried per task and initial state (seeds ``seed`` .. ``seed + per_init - 1``).
        noise_std: std of the Gaussian noise added to executed actions (DART-style; the
            recorded label is the expert's clean action).
        image_size: side of the recorded camera views.
        action_repeat: env steps each decision is held for (the policy's decision rate).
        max_episode_steps: episode limit.
        seed: seed of the first try per initial state.
        cache_dir: where the episodes go (default ``$WMRL_CACHE/vla-demos``).
        manifest: the manifest (default ``cache_dir/manifest.jsonl``; the committed one is
            ``docs/results/vla/demo_manifest.jsonl``).
        expert_style: how the expert moves (``phases`` or ``funnel``: :class:`~agents.vla.expert.ExpertConfig`).
    """

    tasks: tuple[int, ...] = (0, 1, 4, 5, 6, 7)
    init_states: tuple[int, ...] = tuple(range(16))
    per_init: int = 1
    noise_std: float = 0.05
    image_size: int = 64
    action_repeat: int = 4
    max_episode_steps: int = 600
    seed: int = 0
    cache_dir: str | None = None
    manifest: str | None = None
    expert_style: str = "phases"


@dataclass
class DaggerRun:
    """Settings of ``python -m agents.vla dagger``: one DAgger round
    (:class:`~agents.vla.dagger.DaggerRound`): the policy acts on the training init states,
    the scripted expert labels every decision, every episode is kept. Resumable: a rerun skips
    the tries the round's manifest holds. Train on it with ``sft --dagger-dirs``.

    Attributes:
        policy: the MiniVLA checkpoint that acts (an SFT run's ``checkpoint/``).
        output_dir: the round's directory (episodes and ``manifest.jsonl``; not the repo).
        tasks: LIBERO-Long task indices.
        init_states: initial states (LIBERO's training states 0-15).
        per_init: episodes per task and initial state (seeds ``seed`` .. ``seed + per_init - 1``).
        beta: probability that an executed action is the expert's (0 = the policy alone).
        temperature: the policy's sampling temperature (0 = greedy, as evaluated).
        image_size: side of the rendered camera views.
        action_repeat: env steps each action is held for (as in the demonstrations).
        max_episode_steps: episode limit (the evaluation's 520).
        seed: seed of the first try per initial state.
    """

    policy: str = "runs/vla/sft/checkpoint"
    output_dir: str = "runs/vla/dagger1"
    tasks: tuple[int, ...] = (0, 1, 4, 5, 6, 7)
    init_states: tuple[int, ...] = tuple(range(16))
    per_init: int = 1
    beta: float = 0.5
    temperature: float = 0.0
    image_size: int = 64
    action_repeat: int = 4
    max_episode_steps: int = 520
    seed: int = 100


@dataclass
class TrainSetup:
    """What ``train`` builds around the trainer.

    Attributes:
        checkpoint: the MiniVLA checkpoint to start from (an SFT run's ``checkpoint/``).
        stack: ``real`` (sparse success), ``wm`` (progress world model) or ``wmrl``
            (world model + anchors + calibration).
        task: LIBERO-Long task index.
        world_model: progress world model file (default: the shipped state progress model).
        wm_mode: dense reward of the world model (``potential``, ``final``, ``max``, ``success``).
        anchor_fraction: share of anchor groups (``wmrl``).
        max_episode_steps: env steps per episode (LIBERO-Long: 520).
        env_cameras: views from the env's camera observations (rendered every env step);
            default ``False``: rendered at decision steps only, as the demonstrations are
            (see ``agents.vla.evaluate.EvalConfig``).
        threads: torch CPU threads.
        device: torch device of the policy (``"cpu"``, ``"cuda"``).
    """

    checkpoint: str = "runs/vla/sft/checkpoint"
    stack: str = "wmrl"
    task: int = 7
    world_model: str | None = None
    wm_mode: str = "potential"
    anchor_fraction: float = 0.10
    max_episode_steps: int = 520
    env_cameras: bool = False
    threads: int = 1
    device: str = "cpu"


def build_env(
    task: int,
    stack: str,
    *,
    world_model: str | None = None,
    wm_mode: str = "potential",
    anchor_fraction: float = 0.1,
    max_episode_steps: int = 520,
    calibration: Any = None,
    seed: int = 0,
    env_cameras: bool = False,
    image_size: int = 64,
) -> Any:
    """A single LIBERO-Long env wrapped as ``stack``: state-only steps with views rendered at
    decision steps, or camera views in every observation (``env_cameras``)."""
    from agents.vla.evaluate import policy_env
    from wmrl_envs.world_models.progress import ProgressOutcomeModel
    from wmrl_envs.world_models.progress_learned import StateProgressModel
    from wmrl_envs.world_models.progress_rollouts import DEFAULT_PROGRESS_MODEL
    from wrappers import build_stack

    env = policy_env(task, env_cameras=env_cameras, image_size=image_size, max_episode_steps=max_episode_steps)
    wm = ProgressOutcomeModel(StateProgressModel.load(world_model or DEFAULT_PROGRESS_MODEL), mode=wm_mode)  # type: ignore[arg-type]
    return build_stack(env, stack, wm, anchor_fraction=anchor_fraction, seed=seed, calibration=calibration)


def _threads(n: int) -> None:
    import torch

    torch.set_num_threads(n)


def _cmd_expert(args: argparse.Namespace) -> int:
    import numpy as np

    from agents.vla.expert import ExpertConfig, near_label_jumps, run_expert
    from wmrl_envs.libero.env import LiberoLongEnv

    config = build_config(ExpertRun, {}, args)
    out = open(config.out, "a") if config.out else None
    table: dict[int, list[dict[str, Any]]] = {}
    for task in config.tasks:
        env = LiberoLongEnv(task_id=task, cameras=False, max_episode_steps=config.max_episode_steps)
        try:
            for k in config.init_states:
                r = run_expert(
                    env, k, ExpertConfig(style=config.expert_style), action_repeat=config.action_repeat, record=True
                )
                actions, eef = np.stack(r.actions), np.stack([o["proprio"][:3] for o in r.observations])
                near, still = near_label_jumps(actions), near_label_jumps(actions, eef)
                rec = {"task": task, "init_state": k, "success": r.success, "steps": r.steps, "phase": r.phase}
                rec |= {
                    "decisions": len(near),
                    "near_label_jumps": int(near.sum()),
                    "near_still_jumps": int(still.sum()),
                }
                rec |= {"expert_style": config.expert_style} if config.expert_style != "phases" else {}
                print(json.dumps(rec), flush=True)
                if out:
                    out.write(json.dumps(rec) + "\n")
                    out.flush()
                table.setdefault(task, []).append(rec)
        finally:
            env.close()
    print(
        "\n| task | successes | init states | decisions within one of a label jump | ... of a jump between frames < 1 cm apart |"
        "\n|---|---|---|---|---|"
    )
    for task, v in table.items():
        decisions, n_near, n_still = (
            sum(rec[k] for rec in v) for k in ("decisions", "near_label_jumps", "near_still_jumps")
        )
        print(
            f"| {task} | {sum(rec['success'] for rec in v)}/{len(v)} | {min(config.init_states)}-{max(config.init_states)} "
            f"| {n_near}/{decisions} ({n_near / max(1, decisions):.0%}) | {n_still}/{decisions} ({n_still / max(1, decisions):.0%}) |"
        )
    return 0


def _cmd_demos(args: argparse.Namespace) -> int:
    from agents.vla.demos import DemoCache, default_demo_cache

    config = build_config(DemosRun, {}, args)
    cache = DemoCache(Path(config.cache_dir) if config.cache_dir else default_demo_cache(), config.manifest)
    new = cache.collect(
        config.tasks,
        config.init_states,
        per_init=config.per_init,
        noise_std=config.noise_std,
        seed=config.seed,
        image_size=config.image_size,
        action_repeat=config.action_repeat,
        max_episode_steps=config.max_episode_steps,
        expert_style=config.expert_style,
    )
    records = cache.records()
    print(
        json.dumps(
            {
                "new_tries": len(new),
                "new_kept": sum(r["success"] for r in new),
                "tries": len(records),
                "kept": sum(r["success"] for r in records),
                "cache_dir": str(cache.root),
                "manifest": str(cache.manifest),
            }
        )
    )
    return 0


def _cmd_dagger(args: argparse.Namespace) -> int:
    from agents.vla.dagger import DaggerRound

    config = build_config(DaggerRun, {}, args)
    if not (Path(config.policy) / "config.json").is_file():
        print(
            f"dagger: no MiniVLA checkpoint at {config.policy} (run `python -m agents.vla sft` first)", file=sys.stderr
        )
        return 2
    round_ = DaggerRound(Path(config.output_dir), config.policy, beta=config.beta, temperature=config.temperature)
    try:
        new = round_.collect(
            config.tasks,
            config.init_states,
            per_init=config.per_init,
            seed=config.seed,
            image_size=config.image_size,
            action_repeat=config.action_repeat,
            max_episode_steps=config.max_episode_steps,
        )
    except ValueError as e:
        print(f"dagger: {e}", file=sys.stderr)
        return 2
    records = round_.cache.records()
    print(
        json.dumps(
            {
                "new_episodes": len(new),
                "episodes": len(records),
                "successes": sum(r["success"] for r in records),
                "frames": sum(r["decisions"] for r in records),
                "agreement": round(sum(r["agreement"] for r in records) / max(1, len(records)), 4),
                "output_dir": str(round_.root),
            }
        )
    )
    return 0


def _cmd_sft(args: argparse.Namespace) -> int:
    from agents.vla.sft import SFTConfig, train_sft

    config = build_config(SFTConfig, {}, args)
    result = train_sft(config)
    print(json.dumps({k: v for k, v in result.items() if k != "closed_loop"}, indent=1))
    if "closed_loop" in result:
        cl = result["closed_loop"]
        print(json.dumps({k: cl[k] for k in ("avg", "best_at_k", "all_at_k", "episodes", "per_init")}))
    return 0


def _cmd_train(args: argparse.Namespace) -> int:
    from agents.grpo import train
    from agents.vla.model import MiniVLA
    from agents.vla.trainer import VLAAgent, VLAGRPOConfig
    from wrappers import STACKS, CalibrationConfig

    setup = build_config(TrainSetup, {}, args)
    if setup.stack not in STACKS:
        print(f"train: --stack must be one of {STACKS}", file=sys.stderr)
        return 2
    if not (Path(setup.checkpoint) / "config.json").is_file():
        print(
            f"train: no MiniVLA checkpoint at {setup.checkpoint} (run `python -m agents.vla sft` first)",
            file=sys.stderr,
        )
        return 2
    _threads(setup.threads)
    config = build_config(VLAGRPOConfig, {}, args)
    calibration = build_config(CalibrationConfig, {}, args, section="calibration")
    policy = MiniVLA.load(setup.checkpoint).to(setup.device)
    env = build_env(
        setup.task,
        setup.stack,
        world_model=setup.world_model,
        wm_mode=setup.wm_mode,
        anchor_fraction=setup.anchor_fraction,
        max_episode_steps=setup.max_episode_steps,
        calibration=calibration,
        seed=config.seed,
        env_cameras=setup.env_cameras,
        image_size=config.image_size,
    )
    try:
        history = train(VLAAgent(policy, env, config), resume=True, run_info={"setup": config_to_dict(setup)}).history
    finally:
        env.close()
    for row in history:
        print(
            json.dumps(
                {
                    k: row.get(k)
                    for k in (
                        "step",
                        "reward/mean",
                        "success/goal_reached",
                        "groups/no_signal_share",
                        "time/act_ms_per_action",
                        "time/env_steps_per_s",
                        "time/update_ms_per_row",
                        "real_executions/step",
                    )
                }
            )
        )
    return 0


def _cmd_evaluate(args: argparse.Namespace) -> int:
    from agents.vla.evaluate import EvalConfig, evaluate_tasks, markdown_table

    config = build_config(EvalConfig, {}, args)
    _threads(args.threads)
    rows = evaluate_tasks(
        [config.policy],
        config.tasks,
        {
            "ID": [k for k in config.init_states if k < config.ood_from],
            "OOD": [k for k in config.init_states if k >= config.ood_from],
        },
        config.trials,
        temperature=config.temperature,
        seed=config.seed,
        action_repeat=config.action_repeat,
        image_size=config.image_size,
        max_episode_steps=config.max_episode_steps,
        env_cameras=config.env_cameras,
        execute_actions=config.execute_actions,
    )
    print(markdown_table(rows, config.trials))
    if config.output:
        Path(config.output).parent.mkdir(parents=True, exist_ok=True)
        Path(config.output).write_text(
            json.dumps({"config": config_to_dict(config), "rows": rows}, indent=1, default=str)
        )
    return 0


def _cmd_frame_errors(args: argparse.Namespace) -> int:
    from agents.vla.demos import DemoCache, DemoDataset
    from agents.vla.evaluate import frame_errors
    from agents.vla.model import MiniVLA

    paths = [Path(p) for p in args.demos]
    for cache in args.demo_cache:
        paths += DemoCache(Path(cache)).paths(args.tasks or None)
    if not paths:
        print("frame-errors: no demonstrations (pass --demos FILE.npz or --demo-cache DIR)", file=sys.stderr)
        return 2
    result = frame_errors(MiniVLA.load(args.policy), DemoDataset.load(*paths), args.arm_tolerance)
    result["policy"] = args.policy
    print(json.dumps(result, indent=1))
    if args.output:
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output).write_text(json.dumps(result, indent=1))
    return 0


def _cmd_summary(args: argparse.Namespace) -> int:
    from agents.vla.evaluate import markdown_table, summarize

    named: dict[str, list[str]] = {}
    for item in args.policy:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            print(f"summary: --policy wants NAME=EVAL_JSON, got {item!r}", file=sys.stderr)
            return 2
        named.setdefault(name, []).append(path)
    summary = summarize(named)
    for name, s in summary.items():
        print(f"### {name}\n\n{markdown_table(s['per_task'] + s['overall'], 1)}\n")
    if args.output:
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output).write_text(json.dumps(summary, indent=1))
    return 0


def _parser() -> argparse.ArgumentParser:
    from agents.vla.evaluate import ARM_TOLERANCE, EvalConfig
    from agents.vla.sft import SFTConfig
    from agents.vla.trainer import VLAGRPOConfig
    from wrappers import CalibrationConfig

    parser = argparse.ArgumentParser(
        prog="python -m agents.vla",
        description=__doc__.split("\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("expert", help="scripted-expert success table (state-only sim)")
    add_config_arguments(p, ExpertRun)
    p = sub.add_parser("demos", help="collect scripted-expert demonstrations (successful episodes only)")
    add_config_arguments(p, DemosRun)
    p = sub.add_parser("dagger", help="one DAgger round: the policy acts, the expert labels (kept, resumable)")
    add_config_arguments(p, DaggerRun)
    p = sub.add_parser("sft", help="supervised fine-tuning on demonstrations")
    add_config_arguments(p, SFTConfig)
    p = sub.add_parser("train", help="GRPO through a wrapped env stack")
    add_config_arguments(p, TrainSetup)
    add_config_arguments(p, VLAGRPOConfig)
    add_config_arguments(p, CalibrationConfig, section="calibration")
    p = sub.add_parser("evaluate", help="Avg / Best@8 / All@8 success (ID 0-15, OOD 16-49)")
    add_config_arguments(p, EvalConfig)
    p.add_argument("--threads", type=int, default=1)
    p = sub.add_parser("frame-errors", help="greedy first action vs the expert's label on recorded frames (offline)")
    p.add_argument("--policy", required=True, help="MiniVLA checkpoint directory")
    p.add_argument("--demos", nargs="*", default=[], help="demonstration files (.npz)")
    p.add_argument("--demo-cache", nargs="*", default=[], help="DemoCache / DAgger directories (kept episodes)")
    p.add_argument("--tasks", nargs="*", type=int, default=[], help="tasks taken from the caches (default: all)")
    p.add_argument(
        "--arm-tolerance", type=float, default=ARM_TOLERANCE, help="largest arm error that still counts as right"
    )
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--output", default=None, help="JSON file to write")
    p = sub.add_parser("summary", help="per-task and pooled success with Wilson intervals from evaluation files")
    p.add_argument("--policy", nargs="+", required=True, help="NAME=EVAL_JSON (repeat a name for one file per task)")
    p.add_argument("--output", default=None, help="JSON file to write")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    os.environ.setdefault("MUJOCO_GL", "egl")
    args = _parser().parse_args(argv)
    if args.cmd != "train" and args.cmd != "evaluate":
        _threads(getattr(args, "threads", 1) or 1)
    handler = {
        "expert": _cmd_expert,
        "demos": _cmd_demos,
        "dagger": _cmd_dagger,
        "sft": _cmd_sft,
        "train": _cmd_train,
        "evaluate": _cmd_evaluate,
        "frame-errors": _cmd_frame_errors,
        "summary": _cmd_summary,
    }[args.cmd]
    return handler(args)


if __name__ == "__main__":
    sys.exit(main())
