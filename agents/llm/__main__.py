"""Command line: train the LLM agent with GRPO, and evaluate it (avg@k on held-out tasks).

::

    python -m agents.llm train --stack real --steps 12 --out runs/grpo-real --eval-k 4
    python -m agents.llm train --stack wmrl --policy tiny --steps 2 --out runs/smoke
    python -m agents.llm evaluate --checkpoint runs/grpo-real/checkpoint --k 4

Stacks: ``real`` (bare env: plain GRPO on real execution), ``wm`` (pure world model:
``WorldModelWrapper``), ``wmrl`` (``Calibration(Anchor(WorldModel(env)))``). The world model
is the shipped :class:`~wmrl_envs.world_models.CodeOutcomeModel`. Evaluation always
executes for real. ``train --eval-k K`` evaluates before and after training and writes
``eval_before.json`` / ``eval_after.json`` next to the metrics.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any, Sequence

import torch


def _vec_env(num_envs: int, split: str, max_turns: int) -> Any:
    import wmrl_envs  # noqa: F401  (registers the env ids)
    from agents.llm.envs import make_vector_env

    return make_vector_env("wmrl/AutoResearch-v0", num_envs, split=split, max_turns=max_turns)


def _stack(kind: str, num_envs: int, max_turns: int, anchor_fraction: float, seed: int) -> Any:
    env = _vec_env(num_envs, "train", max_turns)
    if kind == "real":
        return env
    from wmrl_envs.world_models import CodeOutcomeModel
    from wrappers import VectorAnchorWrapper, VectorCalibrationWrapper, VectorWorldModelWrapper

    env = VectorWorldModelWrapper(env, CodeOutcomeModel.load_default(), mode="wm")
    if kind == "wm":
        return env
    return VectorCalibrationWrapper(VectorAnchorWrapper(env, fraction=anchor_fraction, seed=seed))


def _policy(args: argparse.Namespace):
    from agents.llm.policy import LLMPolicy, LoraSettings

    lora = LoraSettings() if args.lora else None
    if args.policy == "default":
        return LLMPolicy.default(lora=lora)
    if args.policy == "tiny":
        return LLMPolicy.tiny(lora=lora)
    return LLMPolicy.from_pretrained(args.policy, lora=lora)


def _evaluate(policy: Any, scaffold: Any, args: argparse.Namespace) -> dict[str, Any]:
    from agents.llm.evaluate import evaluate
    from wmrl_envs.autoresearch.tasks import list_catalog

    tasks = args.eval_tasks or list_catalog("test")
    # Several groups per round so one generate call serves more slots.
    env = _vec_env(args.eval_k * min(len(tasks), args.eval_groups_per_round), "test", args.max_turns)
    try:
        result = evaluate(policy, env, scaffold, tasks, k=args.eval_k, max_new_tokens=args.max_new_tokens,
                          temperature=args.temperature, seed=args.seed)
    finally:
        env.close()
    return result.to_dict()


def _print_eval(label: str, d: dict[str, Any]) -> None:
    mean = "n/a" if d["mean"] is None else f"{d['mean']:.4f}"
    print(f"[{label}] avg@k = {mean}  valid rate = {d['valid_rate']}  by category = {d['by_category']}  ({d['seconds']:.0f} s)", flush=True)


#: Demonstration plans for ``--warm-start-steps`` (text after the "model:" prefix): every
#: family, good and weak, so RL has choices to learn from.
WARM_START_REPLIES = (
    " random_forest\nn_estimators: 100\nmax_depth: 8",
    " gradient_boosting\nn_estimators: 100\nlearning_rate: 0.1",
    " extra_trees\nn_estimators: 100",
    " linear\nC: 1.0\nscale: yes",
    " knn\nn_neighbors: 15",
    " baseline",
)


def _warm_start(policy: Any, scaffold: Any, args: argparse.Namespace) -> None:
    from agents.llm.scaffolds import TaskSpec
    from agents.llm.trainer import warm_start
    from wmrl_envs.autoresearch.tasks import get_task, list_catalog

    specs = [TaskSpec.from_info({**get_task(t).to_json(), **get_task(t).meta_features()}) for t in (args.tasks or list_catalog("train"))]
    losses = warm_start(policy, scaffold, specs, WARM_START_REPLIES, steps=args.warm_start_steps,
                        learning_rate=args.warm_start_lr, seed=args.seed)
    print(f"warm start: {len(losses)} steps, loss {losses[0]:.3f} -> {losses[-1]:.3f}", flush=True)


def cmd_train(args: argparse.Namespace) -> int:
    from agents.llm.scaffolds import make_scaffold
    from agents.llm.trainer import GRPOConfig, train
    from wmrl_envs.autoresearch.tasks import list_catalog

    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    policy = _policy(args)
    scaffold = make_scaffold(args.scaffold)
    if args.warm_start_steps and not (out / "checkpoint").exists():
        _warm_start(policy, scaffold, args)
    if args.eval_k and not (out / "eval_before.json").exists():
        before = _evaluate(policy, scaffold, args)
        (out / "eval_before.json").write_text(json.dumps(before, indent=1, default=str))
        _print_eval("before", before)
    env = _stack(args.stack, args.groups * args.group_size, args.max_turns, args.anchor_fraction, args.seed)
    config = GRPOConfig(
        groups_per_step=args.groups, group_size=args.group_size, total_steps=args.steps, max_new_tokens=args.max_new_tokens,
        temperature=args.temperature, learning_rate=args.lr, micro_batch_size=args.micro_batch_size,
        checkpoint_every=args.checkpoint_every, seed=args.seed, output_dir=str(out),
    )
    t0 = time.perf_counter()
    result = train(policy, env, scaffold, config, tasks=args.tasks or list_catalog("train"), resume=True)
    env.close()
    print(f"trained {len(result.history)} steps in {time.perf_counter() - t0:.0f} s; metrics in {out / 'metrics.jsonl'}", flush=True)
    if args.eval_k:
        after = _evaluate(policy, scaffold, args)
        (out / "eval_after.json").write_text(json.dumps(after, indent=1, default=str))
        _print_eval("after", after)
    return 0


def cmd_evaluate(args: argparse.Namespace) -> int:
    from agents.llm.scaffolds import make_scaffold
    from agents.llm.trainer import load_policy_weights

    torch.set_num_threads(args.threads)
    policy = _policy(args)
    if args.checkpoint:
        load_policy_weights(args.checkpoint, policy)
    result = _evaluate(policy, make_scaffold(args.scaffold), args)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1, default=str))
    _print_eval("eval", result)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agents.llm", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--policy", default="default", help="'default' (SmolLM2-135M-Instruct), 'tiny', or a model name/path")
        p.add_argument("--lora", action="store_true", help="train a LoRA adapter instead of all weights")
        p.add_argument("--scaffold", choices=("plan", "raw"), default="plan")
        p.add_argument("--max-turns", type=int, default=1, help="env turns per episode (K)")
        p.add_argument("--max-new-tokens", type=int, default=40)
        p.add_argument("--temperature", type=float, default=1.0)
        p.add_argument("--eval-tasks", nargs="*", default=None, help="held-out task ids (default: catalog test split)")
        p.add_argument("--eval-groups-per-round", type=int, default=3, help="held-out tasks rolled out side by side")
        p.add_argument("--seed", type=int, default=0)
        p.add_argument("--threads", type=int, default=1, help="torch CPU threads (1 is fastest on a busy machine)")

    t = sub.add_parser("train", help="GRPO training (resumes from OUT/checkpoint if present)")
    common(t)
    t.add_argument("--stack", choices=("real", "wm", "wmrl"), default="real")
    t.add_argument("--tasks", nargs="*", default=None, help="training task ids (default: catalog train split)")
    t.add_argument("--steps", type=int, default=12)
    t.add_argument("--groups", type=int, default=2, help="groups per step (m)")
    t.add_argument("--group-size", type=int, default=4, help="samples per group (n)")
    t.add_argument("--lr", type=float, default=5e-5)
    t.add_argument("--micro-batch-size", type=int, default=4)
    t.add_argument("--anchor-fraction", type=float, default=0.10)
    t.add_argument("--checkpoint-every", type=int, default=1)
    t.add_argument("--eval-k", type=int, default=0, help="avg@k before and after training (0 = skip)")
    t.add_argument("--warm-start-steps", type=int, default=0,
                   help="supervised steps on demonstration plans before anything else (for the tiny model)")
    t.add_argument("--warm-start-lr", type=float, default=1e-2)
    t.add_argument("--out", required=True)
    t.set_defaults(func=cmd_train)

    e = sub.add_parser("evaluate", help="avg@k of a policy (optionally a checkpoint) on held-out tasks")
    common(e)
    e.add_argument("--checkpoint", default=None)
    e.add_argument("--k", dest="eval_k", type=int, default=4)
    e.add_argument("--json", default=None, help="write the result here")
    e.set_defaults(func=cmd_evaluate)

    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    raise SystemExit(main())
