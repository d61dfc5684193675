"""Command line: train the LLM agent with GRPO, and evaluate it (avg@k on held-out tasks).

::

    python -m agents.llm train --stack wmrl --total-steps 12 --output-dir runs/grpo-wmrl --evaluate true
    python -m agents.llm train --policy tiny-plan --stack wmrl --total-steps 2 --output-dir runs/smoke
    python -m agents.llm train --remote http://127.0.0.1:8000 --total-steps 12 --output-dir runs/grpo-remote
    python -m agents.llm evaluate --checkpoint runs/grpo-wmrl/checkpoint --k 4

Every flag is a field of a config dataclass, with its default and documentation
(:mod:`wmrl_envs.config_cli`): ``train`` takes :class:`TrainRun`, the trainer's
:class:`~agents.llm.trainer.GRPOConfig`, the WMRL stack's
:class:`~wrappers.CalibrationConfig` (``--calibration-*``) and the held-out evaluation's
:class:`EvalConfig` (``--eval-*``); ``evaluate`` takes :class:`EvalRun` and
:class:`EvalConfig`. ``--config FILE`` (TOML/JSON; tables ``[calibration]`` / ``[eval]``)
sets any of them; flags override the file.

Stacks (:func:`wrappers.build_stack`): ``real`` (plain GRPO on real execution), ``wm`` (pure
world model), ``wmrl`` (``Calibration(Anchor(WorldModel(env)))``). With ``--remote URL`` the
stack is a ``wmrl-serve`` server's: the episodes run there (one ``wmrl/Remote-v0`` session per
slot, :class:`~wmrl_envs.remote.RemoteVectorEnv`), no stack is built here, the stack kind is the
server's and its world model, anchor and calibration settings are set on the server. Evaluation
always executes for real, here. ``train --evaluate true`` evaluates before and after training and writes
``eval_before.json`` / ``eval_after.json`` next to the metrics.

Names, paths and choices are checked before any model loads (:mod:`agents.llm.checks`); a
mistake ends the command with one line on stderr and exit status 2. Checkpoints describe
themselves: ``trainer.json`` records the step, the trainer config and the run's setup
(policy, LoRA, stack, scaffold, world model, ...). ``train`` into an existing output directory
resumes: it prints the step it resumes from and every setting that changed, and refuses a
changed policy, LoRA, stack or world model. ``evaluate --checkpoint`` takes a run directory or
its ``checkpoint/`` and reuses the saved policy, LoRA, scaffold and turns unless given.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agents.llm.checks import (
    UsageError,
    check_choice,
    check_policy,
    check_tasks,
    check_world_model,
    resolve_checkpoint,
    saved_setup,
)
from agents.llm.loading import lora_by_default

__all__ = ["AgentSetup", "TrainRun", "EvalRun", "EvalConfig", "main"]


@dataclass
class AgentSetup:
    """The policy and env settings shared by ``train`` and ``evaluate``.

    Attributes:
        policy: ``default`` (SmolLM2-135M-Instruct, offline), ``tiny`` (random from-config model),
            ``tiny-plan`` (tiny, warm-started on demonstration plans), or a model name/path.
        lora: train a LoRA adapter instead of all weights (none: LoRA for the default
            SmolLM2 policy, 4.9 M trainable parameters instead of 134.5 M, all weights for
            the tiny ones and other models; the resolved value is recorded in the checkpoint).
        scaffold: ``plan`` (compact plan scaffold) or ``raw`` (a complete script).
        max_turns: env turns per episode (K).
        wall_seconds: time limit of one solution run in the sandbox (none = the env's default).
        threads: torch CPU threads (1 is fastest on a busy machine).
    """

    policy: str = "default"
    lora: bool | None = None
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
        anchor_overlap: grade anchor groups for real in the background, overlapping the rest
            of the step (``wmrl``; see wrappers.anchor_overlap).
        tasks: training task ids (none = the catalog's train split).
        warm_start_steps: supervised steps on demonstrations before training (kept in
            ``OUTPUT_DIR/warm_start.pt``, continued from it; skipped once GRPO has a
            checkpoint): plans for the plan scaffolds (a from-config model that cannot follow the
            format yet), the agent corpus's valid train-split scripts for ``raw``
            (``agents.llm.loading.warm_start_plans``).
        warm_start_lr: learning rate of the warm start.
        warm_start_batch_size: demonstrations per warm-start step (none = all of them; the
            raw scaffold's 372 scripts need a batch, e.g. 4).
        evaluate: avg@k on held-out tasks (``--eval-*`` settings) before and after training.
        remote: URL of a ``wmrl-serve`` server (e.g. http://127.0.0.1:8000) to train against:
            the episodes run on its stack (``--stack`` is the server's; its world model, anchor
            and calibration settings are the server's flags), none = the stack is built here.
    """

    stack: str = "real"
    world_model: str = "default"
    anchor_fraction: float = 0.10
    anchor_min_per_step: int = 1
    anchor_overlap: bool = False
    tasks: tuple[str, ...] | None = None
    warm_start_steps: int = 0
    warm_start_lr: float = 1e-2
    warm_start_batch_size: int | None = None
    evaluate: bool = False
    remote: str | None = None


@dataclass
class EvalRun(AgentSetup):
    """What ``evaluate`` loads.

    Attributes:
        checkpoint: a run directory of ``train`` (its ``--output-dir``) or its ``checkpoint/``;
            its weights are loaded, and its saved policy, LoRA, scaffold and turns are used
            unless given (none = the policy as loaded).
        json: also write the result to this file.
    """

    checkpoint: str | None = None
    json: str | None = None


@dataclass
class EvalConfig:
    """Held-out evaluation (avg@k, real execution).

    Attributes:
        k: samples per task.
        tasks: task ids (none = every task of ``split``).
        split: the catalog split the tasks come from: ``test`` (held-out tables) or ``train``
            (the tables a policy trains on).
        tasks_per_round: tasks rolled out side by side (one batched generation).
        max_new_tokens: tokens sampled per turn.
        temperature: sampling temperature.
        top_p: nucleus sampling threshold (1 = off).
        seed: sampling seed.
    """

    k: int = 4
    tasks: tuple[str, ...] | None = None
    split: str = "test"
    tasks_per_round: int = 3
    max_new_tokens: int = 96
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int = 0


def _evaluate(policy: Any, scaffold: Any, setup: AgentSetup, cfg: EvalConfig) -> dict[str, Any]:
    from agents.llm.evaluate import evaluate_heldout
    from wmrl_envs.autoresearch.tasks import list_catalog

    result = evaluate_heldout(
        policy, scaffold, list(cfg.tasks or list_catalog(cfg.split)), k=cfg.k, tasks_per_round=cfg.tasks_per_round,
        max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature, top_p=cfg.top_p, seed=cfg.seed,
        split=cfg.split, **setup.env_kwargs(),
    )  # fmt: skip
    return result.to_dict()


def _round(value: Any) -> str:
    return "n/a" if value is None else f"{float(value):.3f}"


def _print_eval(label: str, d: dict[str, Any]) -> None:
    by_category = ", ".join(f"{k} {_round(v)}" for k, v in (d.get("by_category") or {}).items())
    print(
        f"[{label}] avg@k = {_round(d['mean'])}  valid rate = {_round(d['valid_rate'])}  "
        f"by category: {by_category or 'n/a'}  ({d['seconds']:.0f} s)",
        flush=True,
    )


#: Settings a resumed run must keep: the checkpoint's weights and stack state depend on them.
INCOMPATIBLE = ("policy", "lora", "stack")
#: Settings whose change on resume is expected and not worth a notice.
QUIET = ("total_steps", "threads", "progress", "tensorboard", "evaluate", "checkpoint_every", "warm_start_steps")


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _same(a: Any, b: Any) -> bool:
    return (list(a) if isinstance(a, (list, tuple)) else a) == (list(b) if isinstance(b, (list, tuple)) else b)


def _changes(saved: dict[str, Any], now: dict[str, Any], prefix: str = "") -> list[tuple[str, Any, Any]]:
    """``(flag name, saved, now)`` for every setting present in both that differs."""
    out = []
    for key, value in now.items():
        if key not in saved or key in QUIET:
            continue
        old = saved[key]
        if isinstance(value, dict) and isinstance(old, dict):
            out += _changes(old, value, prefix=f"{prefix}{key}_")
        elif not _same(old, value):
            out.append((prefix + key, old, value))
    return out


def _check_resume(checkpoint: Path, setup: dict[str, Any], grpo: Any) -> int | None:
    """The step a run resumes from (``None``: nothing to resume), after refusing
    incompatible changes and printing the others."""
    saved = saved_setup(checkpoint)
    if not saved:
        return None
    step = int(saved.get("step", 0))
    before = saved.get("setup") or {}
    incompatible = [*INCOMPATIBLE, *(("world_model",) if setup.get("stack") != "real" else ())]
    for name in incompatible:
        if name in before and not _same(before[name], setup.get(name)):
            raise UsageError(
                f"{checkpoint} was trained with {_flag(name)} {before[name]!r}, this run asks for {setup.get(name)!r}: "
                f"resume with {_flag(name)} {before[name]!r}, or pass a new --output-dir to start afresh"
            )
    print(f"resuming from step {step} of {grpo.total_steps} ({checkpoint})", flush=True)
    changed = _changes(before, setup) + _changes(saved.get("config") or {}, dataclasses.asdict(grpo))
    if changed:
        print(
            "changed since the checkpoint: " + ", ".join(f"{_flag(k)} {old!r} -> {new!r}" for k, old, new in changed),
            flush=True,
        )
    if not before:
        print("(the checkpoint predates recorded setups: its policy, stack and scaffold are not checked)", flush=True)
    return step


#: Settings of the stack itself: with ``--remote`` they are the server's (``wmrl-serve`` flags).
SERVER_SIDE = ("world_model", "anchor_fraction", "anchor_min_per_step", "anchor_overlap")


def _check_remote(run: TrainRun, explicit: set[str]) -> None:
    """With ``--remote``: reach the server, take its stack kind (refusing a different explicit
    ``--stack``) and refuse stack settings that only the server can apply."""
    from wmrl_envs.remote import describe_server

    url = str(run.remote).rstrip("/")
    try:
        described = describe_server(url)
    except (ConnectionError, ValueError) as err:
        raise UsageError(f"--remote {run.remote!r}: {err}") from None
    kind = described.get("stack")
    if "stack" in explicit and run.stack != kind:
        raise UsageError(f"--remote {url} serves the {kind!r} stack, not --stack {run.stack!r}: drop --stack")
    given = [name for name in SERVER_SIDE if name in explicit]
    given += sorted({"calibration"} & {k.split("__")[0] for k in explicit})
    if given:
        flags = ", ".join(_flag(name) + ("-*" if name == "calibration" else "") for name in given)
        raise UsageError(f"{flags}: with --remote the stack is the server's; set them on wmrl-serve instead")
    run.stack = str(kind)


def _check_train(run: TrainRun, grpo: Any, cfg: EvalConfig, explicit: set[str] | None = None) -> None:
    from agents.llm.scaffolds import SCAFFOLDS
    from wrappers import STACKS

    check_policy(run.policy)
    check_choice("--scaffold", run.scaffold, sorted(SCAFFOLDS))
    if run.remote:
        _check_remote(run, explicit or set())
    check_choice("--stack", run.stack, STACKS)
    if run.stack != "real" and not run.remote:
        check_world_model(run.world_model)
    check_tasks(run.tasks, split="train", flag="--tasks")
    if cfg.split != "test":
        raise UsageError(
            f"--eval-split {cfg.split!r}: train's before / after evaluation is on held-out (test-split) tables; "
            "measure a checkpoint on training tables with `evaluate --split train`"
        )
    check_tasks(cfg.tasks, split="test", flag="--eval-tasks")
    if grpo.output_dir is None:
        raise UsageError("train needs --output-dir DIR (metrics, checkpoints and TensorBoard logs go there)")


def _load_policy(spec: str, **kwargs: Any) -> Any:
    from agents.llm.loading import load_policy

    try:
        return load_policy(spec, **kwargs)
    except OSError as err:  # transformers: no such model, no network; the first line says which
        raise UsageError(f"--policy {spec!r} could not be loaded: {str(err).strip().splitlines()[0]}") from err
    except ValueError as err:  # a checkpoint saved from another policy (load_policy_weights)
        raise UsageError(str(err)) from err


def cmd_train(run: TrainRun, grpo: Any, calibration: Any, cfg: EvalConfig, explicit: set[str] | None = None) -> int:
    """``train``; ``explicit``: the settings the user gave (flags or file), checked against
    the server's with ``--remote``."""
    _check_train(run, grpo, cfg, explicit)
    run.lora = lora_by_default(run.policy) if run.lora is None else run.lora
    out = Path(grpo.output_dir)
    setup = {**dataclasses.asdict(run), "calibration": dataclasses.asdict(calibration)}
    resumed = _check_resume(out / "checkpoint", setup, grpo)
    if resumed is not None and resumed >= grpo.total_steps:
        print(
            f"nothing to train: the checkpoint is at step {resumed} and --total-steps is {grpo.total_steps}; "
            "raise --total-steps to continue",
            flush=True,
        )
        return 0

    import torch

    import wmrl_envs  # noqa: F401  (registers the env ids)
    from agents.grpo import train
    from agents.llm.loading import load_world_model, warm_start_plans
    from agents.llm.scaffolds import make_scaffold
    from agents.llm.trainer import LLMAgent
    from wmrl_envs.autoresearch.tasks import list_catalog
    from wmrl_envs.vector import make_vector_env
    from wrappers import build_stack

    torch.set_num_threads(run.threads)
    out.mkdir(parents=True, exist_ok=True)
    print(
        f"writing to {out}: metrics.jsonl, checkpoint/"
        + (f", TensorBoard events (view: tensorboard --logdir {out / 'tb'})" if grpo.tensorboard else ""),
        flush=True,
    )
    tasks = list(run.tasks or list_catalog("train"))
    policy = _load_policy(run.policy, lora=run.lora, seed=grpo.seed)
    scaffold = make_scaffold(run.scaffold)
    if run.warm_start_steps and resumed is None:
        losses = warm_start_plans(
            policy,
            tasks,
            steps=run.warm_start_steps,
            learning_rate=run.warm_start_lr,
            seed=grpo.seed,
            scaffold=scaffold,
            batch_size=run.warm_start_batch_size,
            checkpoint=out / "warm_start.pt",  # a killed warm start continues where it stopped
            progress=grpo.progress,
        )
        print(f"warm start: {len(losses)} steps, loss {losses[0]:.3f} -> {losses[-1]:.3f}", flush=True)
    if run.evaluate and not (out / "eval_before.json").exists():
        before = _evaluate(policy, scaffold, run, cfg)
        (out / "eval_before.json").write_text(json.dumps(before, indent=1, default=str))
        _print_eval("before", before)
    slots = grpo.groups_per_step * grpo.group_size
    if run.remote:  # the stack lives on the server: one session per slot, nothing built here
        from wmrl_envs.remote import RemoteVectorEnv

        stack: Any = RemoteVectorEnv(run.remote, slots)
        print(f"training against {run.remote} ({run.stack} stack on the server, {slots} sessions)", flush=True)
    else:
        env = make_vector_env("wmrl/AutoResearch-v0", slots, split="train", **run.env_kwargs())
        stack = build_stack(
            env, run.stack, load_world_model(run.world_model), anchor_fraction=run.anchor_fraction,
            anchor_min_per_step=run.anchor_min_per_step, seed=grpo.seed, calibration=calibration,
            anchor_overlap=run.anchor_overlap,
        )  # fmt: skip
    t0 = time.perf_counter()
    try:
        result = train(LLMAgent(policy, stack, scaffold, grpo, tasks=tasks), resume=True, run_info=setup)
    finally:
        stack.close()
    ran = result.last_step - result.start_step
    print(
        f"trained {ran} steps (step {result.start_step} -> {result.last_step}) in {time.perf_counter() - t0:.0f} s; "
        f"metrics in {out / 'metrics.jsonl'}",
        flush=True,
    )
    if ran and result.steps_without_signal == ran:
        print(
            f"warning: none of the {ran} steps had a group with a learning signal: the policy did not change",
            file=sys.stderr,
            flush=True,
        )
    if run.evaluate:
        after = _evaluate(policy, scaffold, run, cfg)
        (out / "eval_after.json").write_text(json.dumps(after, indent=1, default=str))
        _print_eval("after", after)
    return 0


#: What ``evaluate`` takes from a checkpoint's recorded setup unless given.
REUSED = ("policy", "lora", "scaffold", "max_turns")


def _adopt_checkpoint_setup(run: EvalRun, explicit: set[str]) -> None:
    """Resolve ``run.checkpoint`` (a run directory or a checkpoint) and take the settings it
    recorded that the user did not give; a given policy or LoRA that differs is refused."""
    if run.checkpoint is None:
        return
    checkpoint = resolve_checkpoint(run.checkpoint)
    run.checkpoint = str(checkpoint)
    saved = saved_setup(checkpoint)
    before = saved.get("setup") or {}
    for name in REUSED:
        if name not in before:
            continue
        if name not in explicit:
            setattr(run, name, before[name])
        elif not _same(before[name], getattr(run, name)):
            if name in ("policy", "lora"):
                raise UsageError(
                    f"{checkpoint} was trained with {_flag(name)} {before[name]!r}, not {getattr(run, name)!r}: "
                    f"drop {_flag(name)} to use the saved one"
                )
            print(
                f"note: {checkpoint} was trained with {_flag(name)} {before[name]!r}; evaluating with {getattr(run, name)!r}"
            )
    step = f"step {saved['step']}; " if "step" in saved else ""
    recorded = "" if before else "; no recorded setup, so the flags' policy"
    print(f"evaluating {checkpoint} ({step}policy {run.policy}, scaffold {run.scaffold}{recorded})", flush=True)


def cmd_evaluate(run: EvalRun, cfg: EvalConfig, explicit: set[str] | None = None) -> int:
    from agents.llm.scaffolds import SCAFFOLDS

    _adopt_checkpoint_setup(run, explicit or set())
    run.lora = lora_by_default(run.policy) if run.lora is None else run.lora
    check_policy(run.policy)
    check_choice("--scaffold", run.scaffold, sorted(SCAFFOLDS))
    check_choice("--split", cfg.split, ["test", "train"])
    check_tasks(cfg.tasks, split=cfg.split, flag="--tasks")

    import torch

    import wmrl_envs  # noqa: F401  (registers the env ids)
    from agents.llm.scaffolds import make_scaffold

    torch.set_num_threads(run.threads)
    policy = _load_policy(run.policy, checkpoint=run.checkpoint, lora=run.lora)
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
    from wmrl_envs.config_cli import build_config, load_config_file, one_line_warnings
    from wrappers import CalibrationConfig

    args = _parser().parse_args(argv)
    try:
        values = load_config_file(args.config) if args.config else {}
        explicit = set(values) | {k[len("cfg_") :] for k in vars(args) if k.startswith("cfg_")}
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
    with one_line_warnings():
        try:
            if args.command == "train":
                return cmd_train(run, grpo, calibration, cfg, explicit)
            return cmd_evaluate(erun, cfg, explicit)
        except UsageError as err:
            print(f"python -m agents.llm {args.command}: {err}", file=sys.stderr)
            return 2


if __name__ == "__main__":
    raise SystemExit(main())
