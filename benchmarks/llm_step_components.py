"""Components of one SmolLM2 GRPO step side by side: generation tokens/s and update cost, full fine-tuning vs LoRA.

For each mode (``full``: every weight trained; ``lora``: a peft LoRA adapter, the policy's
:class:`~agents.llm.policy.LoraSettings` defaults) in its own subprocess, so that peak RSS is
that mode's alone:

1. load the policy (``--policy``, default SmolLM2-135M-Instruct, offline) with the given
   generation backend (``transformers``; ``vllm`` where the ``vllm`` package imports);
2. roll out ``--groups`` x ``--group-size`` plan-scaffold replies on train tasks through the
   raw world-model stack (``build_stack(..., "wm")``: no sandbox run, so only the policy's
   cost is measured), timing generation (new tokens per second);
3. run the trainer's own update (:func:`agents.llm.trainer._update`, micro-batches of
   ``--micro-batch-size``) once with advantages of alternating sign on every sample (the
   worst case: a real step skips zero-advantage members), timing it and reading the
   process's peak RSS after it.

Run: ``nice python -m benchmarks.llm_step_components [--modes full lora] [--groups 1 --group-size 4]``;
writes ``<out>/llm_step_components-<stamp>/results.{json,md}``. On a shared machine read
the CPU-second columns (this process's CPU, threads included; vLLM runs in-process): wall
seconds there include waiting for other processes. A step of ``G`` x ``N``
costs about ``G * N`` times the per-sample numbers (generation is batched, so this
over-estimates it).

Functions: :func:`measure`, :func:`main`.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

from benchmarks.report import machine_summary, make_run_dir, markdown_table, write_json

__all__ = ["measure", "main"]

TASKS = (
    "titanic",
    "penguins",
    "breast_cancer",
    "wine",
    "auto_mpg",
    "credit_data",
    "iris",
    "diabetes",
    "boston",
    "tips",
)


def measure(
    mode: str,
    *,
    policy_spec: str = "default",
    backend: str = "transformers",
    groups: int = 1,
    group_size: int = 4,
    max_new_tokens: int = 64,
    micro_batch_size: int = 4,
    seed: int = 0,
) -> dict[str, Any]:
    """One mode's generation and update numbers, in this process."""
    import torch

    import wmrl_envs  # noqa: F401
    from agents.llm.loading import load_world_model
    from agents.llm.policy import LLMPolicy, LoraSettings
    from agents.llm.rollout import PhaseTimer, Rollout
    from agents.llm.scaffolds import PlanScaffold
    from agents.llm.trainer import GRPOConfig, _update
    from wmrl_envs.autoresearch.tasks import list_catalog
    from wmrl_envs.vector import make_vector_env
    from wrappers import build_stack

    torch.manual_seed(seed)
    lora = LoraSettings() if mode == "lora" else None
    t0 = time.perf_counter()
    if policy_spec == "default":
        policy = LLMPolicy.default(lora=lora, backend=backend)
    elif policy_spec == "tiny":
        policy = LLMPolicy.tiny(lora=lora, seed=seed)
    else:
        policy = LLMPolicy.from_pretrained(policy_spec, lora=lora, backend=backend)
    load_s = time.perf_counter() - t0
    rss_loaded = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    trainable = sum(p.numel() for p in policy.trainable_parameters())
    total = sum(p.numel() for p in policy.model.parameters())

    train_tasks = [t for t in TASKS if t in set(list_catalog("train"))] or list(list_catalog("train"))
    env = build_stack(
        make_vector_env("wmrl/AutoResearch-v0", groups * group_size, split="train", max_turns=1),
        "wm",
        load_world_model("default"),
    )
    rollout = Rollout(env, policy, PlanScaffold(), group_size=group_size, max_new_tokens=max_new_tokens)
    timer = PhaseTimer()
    groups_spec = [(train_tasks[g % len(train_tasks)], f"g{g}") for g in range(groups)]
    episodes = rollout.run(groups_spec, timer, seed=seed)
    env.close()
    new_tokens = sum(len(ids) for e in episodes for ids, is_action in e.segments if is_action)
    context_tokens = sum(len(e.context()) for e in episodes)

    config = GRPOConfig(group_size=group_size, groups_per_step=groups, micro_batch_size=micro_batch_size, seed=seed)
    optimizer = torch.optim.AdamW(policy.trainable_parameters(), lr=config.learning_rate)
    advantages = [1.0 if i % 2 == 0 else -1.0 for i in range(len(episodes))]
    t0 = time.perf_counter()
    c0 = time.process_time()
    _update(policy, optimizer, episodes, advantages, config)
    update_s = time.perf_counter() - t0
    update_cpu = time.process_time() - c0
    t0 = time.perf_counter()
    policy.sync_backend()
    sync_s = time.perf_counter() - t0
    return {
        "mode": mode,
        "backend": policy.backend.name if hasattr(policy.backend, "name") else backend,
        "samples": len(episodes),
        "trainable_params": trainable,
        "total_params": total,
        "load_s": load_s,
        "generation_s": timer.wall.get("generation", 0.0),
        "generation_cpu_s": timer.cpu.get("generation", 0.0),
        "tokens_per_cpu_s": new_tokens / max(timer.cpu.get("generation", 0.0), 1e-9),
        "new_tokens": new_tokens,
        "tokens_per_s": new_tokens / max(timer.wall.get("generation", 0.0), 1e-9),
        "context_tokens": context_tokens,
        "update_s": update_s,
        "update_cpu_s": update_cpu,
        "update_s_per_sample": update_s / max(len(episodes), 1),
        "weight_sync_s": sync_s,
        "rss_after_load_mb": rss_loaded,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.llm_step_components", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--modes", nargs="+", choices=("full", "lora"), default=["full", "lora"])
    parser.add_argument("--policy", default="default", help="default (SmolLM2), tiny, or a model name/path")
    parser.add_argument("--backend", choices=("transformers", "vllm"), default="transformers")
    parser.add_argument("--groups", type=int, default=1)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--micro-batch-size", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="runs")
    parser.add_argument("--one", choices=("full", "lora"), help=argparse.SUPPRESS)  # the subprocess entry
    args = parser.parse_args(argv)
    common = dict(
        policy_spec=args.policy, backend=args.backend, groups=args.groups, group_size=args.group_size,
        max_new_tokens=args.max_new_tokens, micro_batch_size=args.micro_batch_size, seed=args.seed,
    )  # fmt: skip
    if args.one:
        print("RESULT " + json.dumps(measure(args.one, **common)), flush=True)  # type: ignore[arg-type]
        return 0
    rows = []
    for mode in args.modes:
        proc = subprocess.run(
            [sys.executable, "-m", "benchmarks.llm_step_components", "--one", mode]
            + [f"--{k.replace('_', '-')}={v}" for k, v in vars(args).items() if k not in ("modes", "one", "out")],
            capture_output=True,
            text=True,
        )
        line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
        if line is None:
            print(proc.stdout[-2000:], proc.stderr[-4000:], file=sys.stderr)
            raise SystemExit(f"mode {mode} failed (exit {proc.returncode})")
        rows.append(json.loads(line[len("RESULT ") :]))
        print(json.dumps(rows[-1]), flush=True)
    run_dir = make_run_dir(args.out, "llm_step_components")
    write_json(run_dir / "results.json", {"machine": machine_summary(), "args": vars(args), "rows": rows})
    table = markdown_table(
        [{"mode": r["mode"], "backend": r["backend"], "samples": r["samples"],
          "trainable params": f"{r['trainable_params'] / 1e6:.2f} M", "gen tokens/s": f"{r['tokens_per_s']:.1f}",
          "gen tokens/CPU-s": f"{r.get('tokens_per_cpu_s', float('nan')):.2f}",
          "update s": f"{r['update_s']:.1f}", "update CPU-s": f"{r['update_cpu_s']:.1f}",
          "update s/sample": f"{r['update_s_per_sample']:.1f}",
          "peak RSS MB": f"{r['peak_rss_mb']:.0f}"} for r in rows]
    )  # fmt: skip
    (run_dir / "results.md").write_text(table + "\n")
    print(table)
    print(f"JSON: {run_dir / 'results.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
